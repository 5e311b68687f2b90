"""Writer-timestamp privacy policies (hyperdb timestamps DEP, "Privacy and Security Concerns").

A writer timestamp can de-anonymise its writer: it leaks the time zone, usage
habits and, at high resolution, correlates with network traffic. So a feed
records one only as its policy allows:

    off            no timestamp field at all (nothing leaks, nothing to sort by)
    exact          the clock reading, ms since the Unix epoch, UTC
    truncate:<u>   rounded down to a multiple of u (1s, 1m, 1h, 1d...): hides
                   sub-unit timing (e.g. keystroke/network correlation)
    fuzz:<max>     uniform random error in [-max, +max] from a CSPRNG: hides
                   the precise moment while keeping a rough order

Expiry times (TTL) go through the same policy: `expires_at` is a function of the
recorded timestamp (of the hour, under `off`) and the TTL alone, so it never reveals
more than the timestamp itself would, and it is never earlier than write time + TTL.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from ..errors import InvalidArgument

UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
#: a policy with an amount, exactly as `TimestampPolicy.parse` takes it
_POLICY = re.compile(r"^(truncate|fuzz):([0-9]+)(s|m|h|d)$")
MAX_POLICY_MS = 36_525 * UNITS_MS["d"]  # a century
#: with `off` an expiry is still needed for TTL: it reveals the hour of the write, nothing finer
OFF_EXPIRY_GRANULARITY_MS = 3_600_000


def parse_duration(text: str) -> int:
    """'30s' -> 30000. Units: ms, s, m, h, d. Must be positive."""
    m = _DURATION.match(text)
    if not m:
        raise InvalidArgument(f"bad duration {text!r}: use a whole number and a unit (ms, s, m, h, d), e.g. 30s")
    ms = int(m.group(1)) * UNITS_MS[m.group(2)]
    if ms <= 0:
        raise InvalidArgument(f"bad duration {text!r}: must be greater than zero")
    return ms


def format_iso_ms(ms: int | None) -> str:
    """ms since the epoch as ISO-8601 UTC for people ("-" for none); an untrusted writer's value that no
    calendar holds (1970 or the far future, as written) prints as it is."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"{ms}ms"


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % UNITS_MS[unit] == 0:
            return f"{ms // UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


Kind = Literal["off", "exact", "truncate", "fuzz"]


@dataclass(frozen=True, slots=True)
class TimestampPolicy:
    kind: Kind
    amount_ms: int = 0  # the unit of `truncate`, the max error of `fuzz`

    @classmethod
    def parse(cls, text: str) -> TimestampPolicy:
        """`off`, `exact`, `truncate:<n><unit>` or `fuzz:<n><unit>`: n a whole number >= 1, unit s, m, h or d.

        Exactly that form, lower case (a policy is a privacy promise: a typo must not
        pass for one). Any n is allowed (`truncate:7s`); `str()` gives the canonical
        form in the largest whole unit (`truncate:60s` is `truncate:1m`).
        """
        if text in ("off", "exact"):
            return cls(text)  # type: ignore[arg-type]
        m = _POLICY.match(text)
        if m is None or int(m.group(2)) < 1:
            raise InvalidArgument(
                f"bad timestamp policy {text!r}: use off, exact, truncate:<n><unit> or fuzz:<n><unit> "
                "(n a whole number >= 1, unit s, m, h or d; lower case), e.g. truncate:1s, fuzz:30s"
            )
        amount = int(m.group(2)) * UNITS_MS[m.group(3)]
        if amount > MAX_POLICY_MS:  # keeps every stamped time and expiry far inside the entries' uint64 fields
            raise InvalidArgument(f"bad timestamp policy {text!r}: at most {MAX_POLICY_MS // UNITS_MS['d']}d")
        return cls(m.group(1), amount)  # type: ignore[arg-type]

    @classmethod
    def parse_stored(cls, text: str) -> TimestampPolicy:
        """A policy as feedlog 0.1 wrote it in a feed's settings: the form `parse` takes, or the looser
        one it took then (any case, spaces, `ms`), so a feed created then still opens."""
        try:
            return cls.parse(text)
        except InvalidArgument:
            t = text.strip().lower()
            if t in ("off", "exact"):
                return cls(t)  # type: ignore[arg-type]
            kind, sep, arg = t.partition(":")
            if sep and kind in ("truncate", "fuzz"):
                return cls(kind, parse_duration(arg))  # type: ignore[arg-type]
            raise

    def __str__(self) -> str:
        return self.kind if self.kind in ("off", "exact") else f"{self.kind}:{format_duration(self.amount_ms)}"

    def apply(self, now_ms: int) -> int | None:
        """The timestamp to record for a write at clock reading `now_ms`, or None."""
        if self.kind == "off":
            return None
        if self.kind == "exact":
            return now_ms
        if self.kind == "truncate":
            return now_ms - now_ms % self.amount_ms
        err = secrets.randbelow(2 * self.amount_ms + 1) - self.amount_ms
        return max(0, now_ms + err)

    def expiry(self, now_ms: int, stamped: int | None, ttl_ms: int, *, exact: bool = False) -> int:
        """When a write made at `now_ms` with TTL `ttl_ms` expires: never before `now_ms + ttl_ms`,
        and revealing no more than `stamped` (the timestamp this policy recorded) does.

        The expiry is a function of what the timestamp already tells (the truncated unit, the
        fuzzed value; under `off` the hour) and the TTL, so two writes the timestamps cannot tell
        apart get the same expiry. `exact=True` (a put that needs a precise deadline) is
        `now_ms + ttl_ms`: it pins the write time to the millisecond, whatever the policy.
        """
        if exact or self.kind == "exact":
            return now_ms + ttl_ms
        if self.kind == "fuzz":
            # stamped >= now - amount (clamped at 0 only when now <= amount), so this is never early
            assert stamped is not None
            return stamped + self.amount_ms + ttl_ms
        unit = self.amount_ms if self.kind == "truncate" else OFF_EXPIRY_GRANULARITY_MS
        # the write happened somewhere in [base, base + unit): take the latest such moment, then
        # round up to the unit. Rounding (now + ttl) up instead would tell which part of the unit
        # the write fell in whenever ttl is not a multiple of the unit.
        base = now_ms - now_ms % unit
        end = base + unit - 1 + ttl_ms
        return end + (-end) % unit

    def clock_floor(self, max_written: int) -> int:
        """A lower bound on the true clock reading behind the largest timestamp written.

        Truncated and exact values never exceed the reading; a fuzzed one can
        exceed it by at most `amount_ms`. Seeding the clock with this keeps
        fuzz from ratcheting the clock forward across reopens.
        """
        return max(0, max_written - self.amount_ms) if self.kind == "fuzz" else max_written
