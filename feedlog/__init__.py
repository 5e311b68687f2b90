"""feedlog: signed, timestamped, append-only feeds and the Delta Lake tables they land in."""

from .version import __version__

__all__ = ["__version__"]
