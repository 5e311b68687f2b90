"""Every package directory is installed, and the server installs under its own name."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


def _run_without(modules: list[str], *argv: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a fresh interpreter in which `modules` cannot be imported (as if not installed)."""
    code = (
        "import sys\n"
        f"for m in {modules!r}: sys.modules[m] = None  # import raises ModuleNotFoundError\n"
        "from feedlog.cli import main\n"
        f"sys.exit(main({list(argv)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_spark_command_without_the_spark_extra_names_the_extra(tmp_path: Path) -> None:
    r = _run_without(["pyspark"], "ingest", "grpc://127.0.0.1:1/" + "ab" * 32, str(tmp_path / "t"))
    assert r.returncode == 9, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'feedlog[spark]'" in r.stderr


def test_feed_commands_run_without_spark_plotting_or_readers(tmp_path: Path) -> None:
    feed = tmp_path / "f"
    absent = ["pyspark", "pandas", "matplotlib", "deltalake", "duckdb"]
    for argv in (["create", str(feed)], ["put", str(feed), "k", "v"], ["get", str(feed), "k"], ["verify", str(feed)]):
        r = _run_without(absent, *argv)
        assert r.returncode == 0, (argv, r.stderr)


def test_require_names_the_extra() -> None:
    from feedlog.errors import Unsupported
    from feedlog.extras import MissingExtra, require

    assert require("json").__name__ == "json"
    sys.modules["matplotlib_absent_probe"] = None  # type: ignore[assignment]
    try:
        with pytest.raises(MissingExtra):
            require("matplotlib_absent_probe")
    finally:
        del sys.modules["matplotlib_absent_probe"]
    err = MissingExtra("pyspark.sql")
    assert isinstance(err, Unsupported) and err.extra == "spark" and "feedlog[spark]" in str(err)
