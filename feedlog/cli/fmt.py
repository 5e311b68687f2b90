"""How the `feedlog` commands print: human text by default, JSON with --json (binary as hex).

One module for every command module's output, so a timestamp or an entry looks
the same whichever command shows it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TypeAlias

from ..log.entries import Record
from ..log.feed import Appended

#: a value `json.dumps` takes as it is
Json: TypeAlias = "Mapping[str, Json] | Sequence[Json] | str | int | float | bool | None"


def emit(ns: argparse.Namespace, data: Json, human: Callable[[], None] | str | None = None) -> None:
    """Print `data` as JSON with --json, else the human form."""
    if getattr(ns, "json", False):
        print(json.dumps(data, sort_keys=False))
    elif callable(human):
        human()
    elif human is not None:
        print(human)


def json_line(obj: Json) -> str:
    """`obj` as one compact JSON line (a stream of records, one per line)."""
    return json.dumps(obj, separators=(",", ":"))


def fmt_ts(ms: int | None) -> str:
    """ISO-8601 UTC for humans; untrusted values (1970, far future) print as they are."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"{ms}ms"


def fmt_value(value: bytes | None) -> str:
    if value is None:
        return "-"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + value.hex()
    return text if text.isprintable() else "0x" + value.hex()


def record_json(r: Record, now_ms: int, raw: bool = False) -> dict[str, Json]:
    out: dict[str, Json] = {"seq": r.seq}
    if r.cleared:
        out["cleared"] = True
        return out
    if r.invalid is not None:  # signed by the author but not an entry: shown raw, never decoded
        out.update(invalid=r.invalid, block=(r.block or b"").hex())
        return out
    out.update(
        key=r.key,
        value=None if r.value is None else r.value.hex(),
        deleted=r.deleted,
        timestamp=r.timestamp,
        expires_at=r.expires_at,
        expired=r.expired(now_ms),
    )
    if r.stat is not None:
        out["stat"] = r.stat
    if raw and r.block is not None:
        out["block"] = r.block.hex()
    return out


def record_line(r: Record, now_ms: int) -> str:
    if r.cleared:
        return f"{r.seq}\t(cleared by compaction)"
    if r.invalid is not None:
        return f"{r.seq}\t(invalid: {r.invalid})\t0x{(r.block or b'').hex()}"
    if r.stat is not None:
        what = json.dumps(r.stat, separators=(",", ":"))
    else:
        what = "(deleted)" if r.deleted else fmt_value(r.value)
    flags = " (expired)" if r.expired(now_ms) else ""
    return f"{r.seq}\t{fmt_ts(r.timestamp)}\t{r.key}\t{what}{flags}"


def appended_json(a: Appended) -> dict[str, Json]:
    return {"seq": a.seq, "timestamp": a.timestamp, "expires_at": a.expires_at}
