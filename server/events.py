"""One structured (JSON) log line per significant event, on the `feedlog.server` logger."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

log = logging.getLogger("feedlog.server")


def event(name: str, level: int = logging.INFO, **fields: object) -> None:
    if log.isEnabledFor(level):
        log.log(level, json.dumps({"event": name, **fields}, default=str, separators=(",", ":")))


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        msg = record.getMessage()
        if msg.startswith("{"):
            return f'{{"ts":"{ts}","level":"{record.levelname.lower()}",{msg[1:]}'
        return json.dumps({"ts": ts, "level": record.levelname.lower(), "event": "log", "message": msg})


def configure(level: int = logging.INFO) -> None:
    """Log lines to stderr (the CLI's `serve` calls this; a library user configures logging themselves)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
