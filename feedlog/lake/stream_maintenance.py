"""Maintenance beside a running stream: `feedlog ingest --stream --maintain-every DURATION`.

A thread runs `maintain.maintain` (TTL compaction, forget rewrites, backfill, checkpoint, log
cleanup, vacuum) every interval while the stream lands its micro-batches, for either engine. It
never pauses ingestion: the stream's commits are blind appends, which no rewrite conflicts with
(Delta's rules; transaction.py `check_winner`), and a rewrite that loses to another rewrite of the
same files is retried a bounded number of times inside the pass (`maintain.REWRITE_ATTEMPTS`) and
otherwise deferred to the next pass: no conflict loop. A stream commit that finds a maintenance
commit in its way rebases over it (one extra attempt), it does not wait for the pass to end.

A pass that fails with a retryable error (the owner or the store away for a moment) is reported and
the next one retries; a mistake (an error that would fail the same way again) stops the stream with
it, as `maintain --every` stops: a months-long stream must not quietly stop maintaining its table.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..clock import Clock
from ..errors import FeedlogError, InvalidArgument, PermissionDenied, ReadOnly, Unsupported
from .maintain import MaintainReport, maintain

#: maintenance errors that stop the stream: no later pass can succeed until the user acts (a bad
#: retention, a table feature feedlog does not write, a token the owner refuses)
NEEDS_THE_USER = (InvalidArgument, Unsupported, PermissionDenied, ReadOnly)


class StreamMaintenance:
    """`maintain` on `path` every `every_ms` in a daemon thread, until `stop`.

    `on_report` hears each pass, `on_error` each failure a later pass may get past; `failed` holds
    the error that ended the loop (`NEEDS_THE_USER`), which the stream raises. `passes` counts the
    passes that ran."""

    def __init__(
        self,
        path: str,
        every_ms: int,
        *,
        token: str | None = None,
        owner: str | None = None,
        storage_options: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        spark: Any | Callable[[], Any] | None = None,
        engine: str = "auto",
        on_report: Callable[[MaintainReport], None] = lambda _r: None,
        on_error: Callable[[FeedlogError], None] = lambda _e: None,
    ) -> None:
        self.path = path
        self.every_s = every_ms / 1000
        self.kwargs: dict[str, Any] = {
            "token": token,
            "owner": owner,
            "storage_options": storage_options,
            "clock": clock,
            "spark": spark,
            "engine": engine,
        }
        self.on_report = on_report
        self.on_error = on_error
        self.passes = 0
        self.failed: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feedlog-stream-maintenance", daemon=True)

    def start(self) -> StreamMaintenance:
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the loop to end and wait for a pass under way to finish (each step is a whole commit or
        none, so a pass cut short by the process ending would be safe too; waiting keeps it tidy)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        # the first pass one interval after the start: a stream's first minutes are its catch-up
        while not self._stop.wait(self.every_s):
            try:
                report = maintain(self.path, **self.kwargs)
            except FeedlogError as e:
                if isinstance(e, NEEDS_THE_USER):
                    self.failed = e
                    return
                # anything else (a race lost, a file gone under it, an owner away) is the next
                # pass's to retry: a stream left running for months must not end for one pass
                self.on_error(e)
            except BaseException as e:  # not foreseen: the stream stops with it rather than go on unmaintained
                self.failed = e
                return
            else:
                self.on_report(report)
            self.passes += 1
