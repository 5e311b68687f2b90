"""The JVM class archive: where it lives, and that a failed recording leaves nothing at that path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from feedlog.errors import Unavailable
from feedlog.lake import CLASS_ARCHIVE_ENV, class_archive
from feedlog.lake.classes import build, prune


def test_the_archive_is_per_pyspark_and_jdk_in_the_cache_unless_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.version import __version__

    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    default = class_archive()
    assert default.parent == tmp_path / "cache" / "feedlog" and default.name.startswith(f"spark-{__version__}-")
    java_home = os.environ.get("JAVA_HOME")
    monkeypatch.setenv("JAVA_HOME", "/another/jdk")
    assert class_archive() != default  # another JDK's classes would be ignored: another file
    if java_home is None:
        monkeypatch.delenv("JAVA_HOME")
    else:
        monkeypatch.setenv("JAVA_HOME", java_home)
    assert class_archive() == default
    # the same PySpark installed in another folder (another checkout's venv): the JVM checks the
    # jars' paths against the archive's and ignores an archive of another folder, silently
    import pyspark

    other = tmp_path / "venv2" / "pyspark"
    (other / "jars").mkdir(parents=True)
    monkeypatch.setattr(pyspark, "__file__", str(other / "__init__.py"))
    assert class_archive() != default
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(tmp_path / "mine.jsa"))
    assert class_archive() == tmp_path / "mine.jsa"


def test_a_recording_that_fails_leaves_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # spark-submit refuses this at once, so the child's JVM never starts
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--no-such-option pyspark-shell")
    with pytest.raises(Unavailable, match="could not record Spark's classes"):
        build(tmp_path / "spark.jsa")
    assert list(tmp_path.iterdir()) == []  # neither the archive nor a cut temporary one


def test_archives_of_a_pyspark_folder_that_is_gone_are_pruned(tmp_path: Path) -> None:
    """Each checkout's venv records its own archive (~160 MB): recording one removes those whose
    PySpark folder no longer exists or holds other jars now, and those with no record (older names
    nothing looks up), and keeps the rest and any whose record cannot be read."""
    live = tmp_path / "live-pyspark"
    (live / "jars").mkdir(parents=True)
    jars = str((live / "jars").stat().st_mtime_ns)
    for name, home, state in (
        ("spark-4-gone", tmp_path / "deleted", jars),
        ("spark-4-live", live, jars),
        ("spark-4-new", live, jars),
        ("spark-4-reinstalled", live, "1"),  # the same folder, other jars: the JVM ignores it
    ):
        (tmp_path / f"{name}.jsa").write_bytes(b"x")
        (tmp_path / f"{name}.json").write_text(json.dumps({"pyspark_home": str(home), "jars": state}))
    (tmp_path / "spark-4-unreadable.jsa").write_bytes(b"x")
    (tmp_path / "spark-4-unreadable.json").write_text("{not json")
    (tmp_path / "spark-4-norecord.jsa").write_bytes(b"x")  # recorded before records existed
    (tmp_path / "mine.jsa").write_bytes(b"x")  # not one of ours (`build PATH` may write anywhere)
    gone = prune(tmp_path, keep=tmp_path / "spark-4-new.jsa")
    assert gone == [tmp_path / f"spark-4-{n}.jsa" for n in ("gone", "norecord", "reinstalled")]
    assert sorted(p.name for p in tmp_path.glob("*.jsa")) == [
        "mine.jsa",
        "spark-4-live.jsa",
        "spark-4-new.jsa",
        "spark-4-unreadable.jsa",
    ]
    assert not (tmp_path / "spark-4-gone.json").exists()


def test_a_jvm_launch_lost_once_is_tried_again_and_a_second_loss_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_start_jvm` with PySpark's launcher and context faked (no JVM): the launch that PySpark reports as
    JAVA_GATEWAY_EXITED is retried once; another error, or the second such loss, is the caller's."""
    import pyspark
    from pyspark import java_gateway
    from pyspark.errors import PySparkRuntimeError

    from feedlog.lake import GATEWAY_ATTEMPTS, _start_jvm

    made: list[object] = []

    class FakeContext:
        _gateway = None

        def __init__(self, conf: object, gateway: object) -> None:
            made.append(gateway)

    def launcher(outcomes: list[object]) -> object:
        def launch(conf: object, popen_kwargs: dict[str, object]) -> object:
            outcome = outcomes.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return launch

    def lost() -> PySparkRuntimeError:
        return PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(pyspark, "SparkContext", FakeContext)
    monkeypatch.setattr(java_gateway, "launch_gateway", launcher([lost(), "gateway"]))
    assert _start_jvm("local[1]", "t", {}) and made == ["gateway"]
    monkeypatch.setattr(java_gateway, "launch_gateway", launcher([lost() for _ in range(GATEWAY_ATTEMPTS)]))
    with pytest.raises(PySparkRuntimeError):
        _start_jvm("local[1]", "t", {})
    monkeypatch.setattr(java_gateway, "launch_gateway", launcher([OSError("no java"), "gateway"]))
    with pytest.raises(OSError, match="no java"):  # not a lost launch: not retried
        _start_jvm("local[1]", "t", {})
    assert made == ["gateway"]
