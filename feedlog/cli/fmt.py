"""How the `feedlog` commands print: human text by default, JSON with --json (binary as hex).

One module for every command module's output, so a timestamp, an entry, a JSON
document, an error or a progress report looks the same whichever command shows it:

- JSON: one document per line, compact (`json_line`), so `--json` output of any
  command is JSON Lines that `jq` and line-oriented tools take as they are;
- errors: `feedlog: error: MESSAGE` on stderr, one line (`error_line`);
- progress of long work: on stderr only, and only once the work has run for a
  while (`Progress`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO, TypeAlias

from ..errors import printable
from ..log import entries
from ..log.entries import Record
from ..log.feed import Appended
from ..log.timestamps import format_iso_ms

#: a value `json.dumps` takes as it is
Json: TypeAlias = "Mapping[str, Json] | Sequence[Json] | str | int | float | bool | None"


#: what every message of the command on stderr starts with
PREFIX = "feedlog:"


def error_line(message: object) -> str:
    """The one form of an error on stderr: `feedlog: error: MESSAGE`, one line whatever MESSAGE holds."""
    return f"{PREFIX} error: {printable(str(message))}"


def emit(ns: argparse.Namespace, data: Json, human: Callable[[], None] | str | None = None) -> None:
    """Print `data` as JSON with --json (one line, `json_line`), else the human form."""
    if getattr(ns, "json", False):
        print(json_line(data))
    elif callable(human):
        human()
    elif human is not None:
        print(human)


def json_line(obj: Json) -> str:
    """`obj` as one compact JSON line: every JSON document the command prints (a stream of records, one per line)."""
    return json.dumps(obj, separators=(",", ":"))


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`1 block`, `2 blocks`, `1,000 entries` (thousands separated: counts here run to millions)."""
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"


def fmt_size(n: int) -> str:
    """`812 B`, `64.0 kB`, `1.3 MB`, `2.1 GB` (decimal units, as `ls -h --si` and du --si print them)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def fmt_ts(ms: int | None) -> str:
    """ISO-8601 UTC for humans; untrusted values (1970, far future) print as they are."""
    return format_iso_ms(ms)


def fmt_value(value: bytes | None) -> str:
    if value is None:
        return "-"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + value.hex()
    return text if text.isprintable() else "0x" + value.hex()


def record_json(r: Record, now_ms: int, raw: bool = False) -> dict[str, Json]:
    return entries.record_json(r, now_ms, raw)


def record_line(r: Record, now_ms: int) -> str:
    if r.cleared:
        return f"{r.seq}\t(cleared: expired, overwritten, forgotten, or withheld by a peer)"
    if r.invalid is not None:
        return f"{r.seq}\t(invalid: {r.invalid})\t0x{(r.block or b'').hex()}"
    if r.stat is not None:
        what = json.dumps(r.stat, separators=(",", ":"))
    else:
        what = "(deleted)" if r.deleted else fmt_value(r.value)
    if r.forget:
        what = "(forgotten: the payloads of every earlier entry of this key were cleared)"
    flags = " (expired)" if r.expired(now_ms) else ""
    return f"{r.seq}\t{fmt_ts(r.timestamp)}\t{r.key}\t{what}{flags}"


def appended_json(a: Appended) -> dict[str, Json]:
    return {"seq": a.seq, "timestamp": a.timestamp, "expires_at": a.expires_at}


# ---- progress of long work -----------------------------------------------------------------------

#: no report for work shorter than this (seconds): a quick command stays quiet
PROGRESS_DELAY = 2.0
#: seconds between the one-line reports when stderr is not a terminal (CI logs, pipes)
PROGRESS_EVERY = 5.0
#: the variable that changes PROGRESS_EVERY (e.g. 60 for terser CI logs)
PROGRESS_EVERY_ENV = "FEEDLOG_PROGRESS_EVERY"


def progress_every() -> float:
    """Seconds between one-line progress reports: ${PROGRESS_EVERY_ENV}, else PROGRESS_EVERY."""
    try:
        return max(0.0, float(os.environ.get(PROGRESS_EVERY_ENV, PROGRESS_EVERY)))
    except ValueError:
        return PROGRESS_EVERY


#: whether a progress bar just ended the terminal's line (closing a bar it drew writes a newline)
_bar_ended_line = False


def progress_wanted(ns: argparse.Namespace) -> bool:
    """Whether a command shows progress: not with --json (scripts) or --quiet."""
    return not (getattr(ns, "json", False) or getattr(ns, "quiet", False))


def progress_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress reports on stderr")


def writes_to_file(stream: TextIO) -> bool:
    """Whether `stream` is a regular file (`cmd > out`): long output there deserves progress on stderr."""
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


def _count(n: float, unit: str) -> str:
    if unit == "bytes":
        for size, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if n >= size:
                return f"{n / size:,.1f} {name}"
        return f"{n:,.0f} B"
    return f"{n:,.0f} {unit}"


class Progress:
    """Progress of long work on stderr: a tqdm bar on a terminal, else one line every PROGRESS_EVERY s
    (`$FEEDLOG_PROGRESS_EVERY`): `feedlog: append: 6.0 MiB of 19.7 MiB (30%), 123,000 entries, 1.2 MiB/s, 5 s`.

    Nothing at all for work that ends within PROGRESS_DELAY s, or when not
    `enabled`. `update(done)` takes the absolute count (of `unit`, out of
    `total` if known); `note` adds a few words (e.g. the entries behind a byte
    count). Use it as a context manager, or `close()` it: on a terminal that
    ends the bar's line, so whatever follows (an error, "interrupted") starts
    on its own line.
    """

    def __init__(
        self,
        what: str,
        *,
        total: int | None = None,
        unit: str = "blocks",
        enabled: bool = True,
        stream: TextIO | None = None,
        now: Callable[[], float] = time.monotonic,
        every: float | None = None,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.now = now
        self.every = progress_every() if every is None else every
        self.start = now()
        self.last_report = self.start
        self.done = self.base = 0
        self.note = ""
        self.lines = 0  # one-line reports printed
        self.tty = enabled and _isatty(self.stream)
        self.bar: Any = None
        if self.tty:
            from tqdm import tqdm

            bytes_ = unit == "bytes"
            # a terminal that reports no size (0x0: some ptys, `script`) makes tqdm draw nothing
            size = shutil.get_terminal_size()
            self.bar = tqdm(
                desc=what,
                total=total,
                unit="B" if bytes_ else f" {unit}",
                unit_scale=bytes_,
                unit_divisor=1024 if bytes_ else 1000,
                file=self.stream,
                delay=PROGRESS_DELAY,
                ncols=size.columns,
                nrows=size.lines,
                leave=True,
            )

    def update(self, done: int, note: str = "") -> None:
        step, self.done, self.note = done - self.done, done, note  # kept when not shown: for an interruption
        if not self.enabled:
            return
        if self.bar is not None:
            if note:
                self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(step)
            return
        t = self.now()
        if t - self.last_report >= self.every:
            self.last_report = t
            self.lines += 1
            print(self.line(t), file=self.stream, flush=True)

    def rebase(self, done: int) -> None:
        """Count from `done` as if the work started now: what was skipped (append --skip) is no progress."""
        self.start = self.last_report = self.now()
        self.done = self.base = done
        if self.bar is not None:
            self.bar.reset(total=self.total)
            self.bar.initial = self.bar.n = self.bar.last_print_n = done

    def line(self, t: float) -> str:
        """The one-line report at time `t`: count, total and share if known, rate, elapsed time."""
        elapsed = max(t - self.start, 1e-9)
        base = self.base
        if self.total:  # `49,152 of 400,000 entries (12%)`; bytes carry their unit on both sides
            count = _count(self.done, self.unit) if self.unit == "bytes" else f"{self.done:,}"
            count += f" of {_count(self.total, self.unit)} ({100 * self.done / self.total:.0f}%)"
        else:
            count = _count(self.done, self.unit)
        rate = _count((self.done - base) / elapsed, self.unit) + "/s"
        note = f", {self.note}" if self.note else ""
        return f"{PREFIX} {self.what}: {count}{note}, {rate}, {elapsed:.0f} s"

    def close(self) -> None:
        global _bar_ended_line
        if self.bar is not None:
            # tqdm draws nothing before its delay; once it has drawn, closing ends the bar's line
            drawn = getattr(self.bar, "last_print_t", 0) >= self.bar.start_t + self.bar.delay
            self.bar.close()
            self.bar = None
            _bar_ended_line = drawn

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def interrupted_line(message: str = "") -> str:
    """`feedlog: interrupted[: message]`, starting a new line on a terminal (after the ^C the terminal echoed)."""
    text = f"{PREFIX} interrupted" + (f": {message}" if message else "")
    return ("\n" if _isatty(sys.stderr) and not _bar_ended_line else "") + text
