"""Named fail points for crash tests (in the spirit of SlateDB's fail points).

A process started with `FEEDLOG_FAILPOINTS="name=exit@3,other=error"` dies
(`exit`: `os._exit(86)`, no cleanup, like a kill -9), raises Unavailable
(`error`) or RuntimeError (`bug`: an error feedlog did not foresee) the n-th
time (default the first) it passes `point(name)`; `wait` holds it there until
the file `$FEEDLOG_FAILPOINT_GATE` exists (at most `WAIT_LIMIT` seconds), so a
test can kill a process of its choice while every worker of a job stands at one
step (e.g. Spark executors with their files written). The variable is read the
first time any point is passed (or when `arm` is called), never at import.
Unarmed, a point costs one dict lookup. Tests use it to kill real writer and
owner processes at exact steps of a commit or a backfill.

`FEEDLOG_FAILPOINTS=@PATH` takes the spec from the file PATH instead, read again
whenever it is replaced (`arm_file`; each replacement resets every count; no file:
no points): a test arms points per job in processes that outlive it, such as the
Python workers of a long-lived Spark session, which all inherit one environment.
"""

from __future__ import annotations

import os
import threading
import time

from .errors import InvalidArgument, Unavailable

ENV = "FEEDLOG_FAILPOINTS"
GATE_ENV = "FEEDLOG_FAILPOINT_GATE"
EXIT_CODE = 86
#: the longest a `wait` point holds a process (a test that never opens the gate still ends)
WAIT_LIMIT = 120.0


def _parse(text: str) -> dict[str, tuple[str, int]]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, spec = item.partition("=")
        action, _, nth = spec.partition("@")
        if action not in ("exit", "error", "bug", "wait") or (nth and not nth.isdigit()):
            raise InvalidArgument(f"bad {ENV} entry {item!r}: expected NAME=exit|error|bug|wait[@N]")
        out[name] = (action, int(nth or 1))
    return out


_points: dict[str, tuple[str, int]] | None = None  # None: not read yet
_hits: dict[str, int] = {}
_lock = threading.Lock()
_source: str | None = None  # the file of an `@PATH` spec
_seen: tuple[int, int, int] | None = None  # that file's (inode, mtime_ns, size) when last read; None: no file


def arm(spec: str | None = None) -> None:
    """Arm the points `spec` names (default: $FEEDLOG_FAILPOINTS), resetting every count."""
    global _points, _source, _seen
    text = os.environ.get(ENV, "") if spec is None else spec
    source = text[1:] if text.startswith("@") else None
    parsed, seen = _read(source) if source else (_parse(text), None)
    with _lock:
        _points, _source, _seen = parsed, source, seen
        _hits.clear()


def arm_file(path: str | os.PathLike[str], spec: str) -> None:
    """Arm `spec` in every process whose $FEEDLOG_FAILPOINTS is `@path`, from the next point each passes
    (`spec` "" disarms). The file is replaced, never rewritten: a reader sees the old spec or the new."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(spec)
    os.replace(tmp, path)


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read(path: str) -> tuple[dict[str, tuple[str, int]], tuple[int, int, int] | None]:
    try:
        with open(path) as f:
            return _parse(f.read()), _stamp(os.fstat(f.fileno()))
    except FileNotFoundError:
        return {}, None


def _reread() -> None:
    """Re-arm from the `@PATH` file when it changed since it was read."""
    global _points, _seen
    assert _source is not None
    try:
        now: tuple[int, int, int] | None = _stamp(os.stat(_source))
    except FileNotFoundError:
        now = None
    if now != _seen:
        parsed, seen = _read(_source)
        with _lock:
            _points, _seen = parsed, seen
            _hits.clear()


def point(name: str) -> None:
    if _points is None:
        arm()
    if _source is not None:
        _reread()
    assert _points is not None
    if not _points or name not in _points:
        return
    action, nth = _points[name]
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != nth:
            return
    if action == "exit":
        os._exit(EXIT_CODE)
    if action == "wait":
        _wait_for_gate()
        return
    if action == "bug":
        raise RuntimeError(f"fail point {name} (injected)")
    raise Unavailable(f"fail point {name} (injected)")


def _wait_for_gate() -> None:
    gate = os.environ.get(GATE_ENV)
    if not gate:
        raise InvalidArgument(f"a wait fail point needs ${GATE_ENV}: the file whose creation releases it")
    deadline = time.monotonic() + WAIT_LIMIT
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
