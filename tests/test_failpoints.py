"""Fail points armed from a file (`FEEDLOG_FAILPOINTS=@PATH`): a long-lived process picks up each new spec."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from feedlog import failpoints
from feedlog.errors import InvalidArgument, Unavailable


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    yield
    failpoints.arm("")


def test_a_spec_file_is_read_again_each_time_it_is_replaced(tmp_path: Path) -> None:
    spec = tmp_path / "points"
    failpoints.arm(f"@{spec}")
    failpoints.point("x")  # no file: no points
    failpoints.arm_file(spec, "x=error")
    with pytest.raises(Unavailable, match="fail point x"):
        failpoints.point("x")
    failpoints.point("x")  # the first hit only
    failpoints.arm_file(spec, "x=error")  # the same spec again: a new arming, every count reset
    with pytest.raises(Unavailable):
        failpoints.point("x")
    failpoints.arm_file(spec, "x=error@2,y=error")
    failpoints.point("x")
    with pytest.raises(Unavailable):
        failpoints.point("x")
    failpoints.arm_file(spec, "")  # disarmed
    failpoints.point("x")
    failpoints.point("y")
    spec.unlink()
    failpoints.point("y")
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_a_bad_spec_file_is_refused_at_the_next_point(tmp_path: Path) -> None:
    spec = tmp_path / "points"
    failpoints.arm(f"@{spec}")
    failpoints.arm_file(spec, "x=explode")
    with pytest.raises(InvalidArgument, match="x=explode"):
        failpoints.point("x")


def test_a_bug_point_raises_an_error_feedlog_did_not_foresee() -> None:
    failpoints.arm("x=bug@2")
    failpoints.point("x")
    with pytest.raises(RuntimeError, match=r"^fail point x \(injected\)$") as raised:
        failpoints.point("x")
    assert not isinstance(raised.value, Unavailable)  # not a FeedlogError: callers meet it as a bug
    failpoints.point("x")
