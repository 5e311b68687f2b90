"""The optional parts of feedlog and the extra that installs each.

The feed, the peers, the commit owner and the Delta library need only the base
install. Spark (`feedlog[spark]`), plotting (`feedlog[plot]`) and the foreign
Delta readers the demo checks us against (`feedlog[readers]`) are extras, so a
user who only runs peers does not download hundreds of MB of PySpark.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import Unsupported

#: top-level module -> (extra, what needs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "pyspark": ("spark", "Spark (ingest, expire, the data sources, insight on tables)"),
    "pandas": ("spark", "Spark (PySpark's Arrow conversions)"),
    "matplotlib": ("plot", "plotting (--plot)"),
    "deltalake": ("readers", "the delta-rs reader"),
    "duckdb": ("readers", "the DuckDB reader"),
    "duckdb_extension_delta": ("readers", "the DuckDB reader"),
    "starlette": ("console", "the console (feedlog console)"),
    "uvicorn": ("console", "the console (feedlog console)"),
    "jinja2": ("console", "the console (feedlog console)"),
}


class MissingExtra(Unsupported):
    """An optional dependency is not installed; the message names the extra that installs it."""

    def __init__(self, module: str) -> None:
        top = module.split(".")[0]
        extra, purpose = EXTRAS.get(top, ("", ""))
        if extra:
            text = f"{purpose} needs the '{extra}' extra ({top} is not installed): pip install 'feedlog[{extra}]'"
        else:
            text = f"{top} is not installed"
        super().__init__(text)
        self.module = top
        self.extra = extra


def missing_extra(err: ImportError) -> MissingExtra | None:
    """The `MissingExtra` an import error means, or None when it is not one of our extras."""
    name = getattr(err, "name", None) or ""
    if isinstance(err, ModuleNotFoundError) and name.split(".")[0] in EXTRAS:
        return MissingExtra(name)
    return None


def require(module: str) -> ModuleType:
    """Import `module`, or raise `MissingExtra` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise (missing_extra(e) or MissingExtra(module)) from e
