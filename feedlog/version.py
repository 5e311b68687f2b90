"""The installed package's version (what commits record as `engineInfo`)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("feedlog")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
