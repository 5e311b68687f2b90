"""Every package directory is installed, and the server installs under its own name."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapped = {v: k for k, v in cfg["package-dir"].items()}
    found = set()
    for init in ROOT.glob("feedlog/**/__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for init in ROOT.glob("server/**/__init__.py"):
        rel = init.parent.relative_to(ROOT).parts
        found.add(".".join((mapped[rel[0]], *rel[1:])))
    assert found == listed


def test_server_is_importable_only_under_its_installed_name() -> None:
    import feedlog_server.app

    assert Path(feedlog_server.app.__file__).parent == ROOT / "server"
