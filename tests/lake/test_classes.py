"""The JVM class archive: where it lives, and that a failed recording leaves nothing at that path."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedlog.errors import Unavailable
from feedlog.lake import CLASS_ARCHIVE_ENV, class_archive
from feedlog.lake.classes import build


def test_the_archive_is_per_pyspark_and_jdk_in_the_cache_unless_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.version import __version__

    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    default = class_archive()
    assert default.parent == tmp_path / "cache" / "feedlog" and default.name.startswith(f"spark-{__version__}-")
    monkeypatch.setenv("JAVA_HOME", "/another/jdk")
    assert class_archive() != default  # another JDK's classes would be ignored: another file
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(tmp_path / "mine.jsa"))
    assert class_archive() == tmp_path / "mine.jsa"


def test_a_recording_that_fails_leaves_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # spark-submit refuses this at once, so the child's JVM never starts
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--no-such-option pyspark-shell")
    with pytest.raises(Unavailable, match="could not record Spark's classes"):
        build(tmp_path / "spark.jsa")
    assert list(tmp_path.iterdir()) == []  # neither the archive nor a cut temporary one
