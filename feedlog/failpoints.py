"""Named fail points for crash tests (in the spirit of SlateDB's fail points).

A process started with `FEEDLOG_FAILPOINTS="name=exit@3,other=error"` dies
(`exit`: `os._exit(86)`, no cleanup, like a kill -9) or raises Unavailable
(`error`) the n-th time (default the first) it passes `point(name)`; `wait`
holds it there until the file `$FEEDLOG_FAILPOINT_GATE` exists (at most
`WAIT_LIMIT` seconds), so a test can kill a process of its choice while every
worker of a job stands at one step (e.g. Spark executors with their files written). The
variable is read the first time any point is passed (or when `arm` is called),
never at import. Unarmed, a point costs one dict lookup. Tests use it to kill
real writer and owner processes at exact steps of a commit or a backfill.
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
        if action not in ("exit", "error", "wait") or (nth and not nth.isdigit()):
            raise InvalidArgument(f"bad {ENV} entry {item!r}: expected NAME=exit|error|wait[@N]")
        out[name] = (action, int(nth or 1))
    return out


_points: dict[str, tuple[str, int]] | None = None  # None: not read yet
_hits: dict[str, int] = {}
_lock = threading.Lock()


def arm(spec: str | None = None) -> None:
    """Arm the points `spec` names (default: $FEEDLOG_FAILPOINTS), resetting every count."""
    global _points
    parsed = _parse(os.environ.get(ENV, "") if spec is None else spec)
    with _lock:
        _points = parsed
        _hits.clear()


def point(name: str) -> None:
    if _points is None:
        arm()
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
    raise Unavailable(f"fail point {name} (injected)")


def _wait_for_gate() -> None:
    gate = os.environ.get(GATE_ENV)
    if not gate:
        raise InvalidArgument(f"a wait fail point needs ${GATE_ENV}: the file whose creation releases it")
    deadline = time.monotonic() + WAIT_LIMIT
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
