from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedlog.errors import InvalidArgument
from feedlog.log.timestamps import TimestampPolicy, format_duration, parse_duration

NOW = st.integers(min_value=0, max_value=1 << 50)


def test_parse_and_format() -> None:
    assert parse_duration("30s") == 30_000 and parse_duration("5m") == 300_000 and parse_duration("1d") == 86_400_000
    assert format_duration(90_000) == "90s" and format_duration(3_600_000) == "1h"
    for bad in ("", "10", "1w", "-1s", "0s", "1.5s", "s"):
        with pytest.raises(InvalidArgument):
            parse_duration(bad)
    for text in ("off", "exact", "truncate:1s", "truncate:1h", "fuzz:30s", "fuzz:5m"):
        assert str(TimestampPolicy.parse(text)) == text
    for bad in ("sometimes", "truncate", "truncate:", "fuzz:0s", "exact:1s", "truncate:x"):
        with pytest.raises(InvalidArgument):
            TimestampPolicy.parse(bad)


@given(NOW)
def test_off_and_exact(now: int) -> None:
    assert TimestampPolicy.parse("off").apply(now) is None
    assert TimestampPolicy.parse("exact").apply(now) == now


@given(NOW, st.sampled_from(["1s", "1m", "1h", "1d"]))
def test_truncate_hides_sub_unit_time(now: int, unit: str) -> None:
    p = TimestampPolicy.parse(f"truncate:{unit}")
    ts = p.apply(now)
    assert ts is not None and ts <= now < ts + p.amount_ms and ts % p.amount_ms == 0
    # every reading in the same unit maps to the same value: nothing inside the unit leaks
    assert p.apply(ts + p.amount_ms - 1) == ts
    assert p.clock_floor(ts) == ts <= now


@given(NOW, st.sampled_from(["1s", "30s", "5m"]))
def test_fuzz_stays_within_bound(now: int, bound: str) -> None:
    p = TimestampPolicy.parse(f"fuzz:{bound}")
    ts = p.apply(now)
    assert (ts is not None and abs(ts - now) <= p.amount_ms) or ts == 0
    assert p.clock_floor(ts) <= now  # seeding from a fuzzed value never jumps past the true clock


def test_fuzz_is_random_and_uses_the_whole_range() -> None:
    p = TimestampPolicy.parse("fuzz:1s")
    now = 10_000_000
    seen = {p.apply(now) or 0 for _ in range(400)}
    assert len(seen) > 200
    assert min(seen) < now - 500 and max(seen) > now + 500


@given(NOW, st.integers(min_value=1, max_value=1 << 35))
def test_expiry_is_never_early(now: int, ttl: int) -> None:
    for text in ("exact", "truncate:1m", "truncate:7s", "truncate:1h", "fuzz:30s", "off"):
        p = TimestampPolicy.parse(text)
        for _ in range(3):  # fuzz: several draws
            assert p.expiry(now, p.apply(now), ttl) >= now + ttl, text
    off = TimestampPolicy.parse("off")
    assert off.expiry(now, None, ttl, exact=True) == now + ttl  # asked for: precise, whatever the policy


@given(NOW, st.integers(min_value=0, max_value=3_600_000 - 1), st.integers(min_value=1, max_value=1 << 35))
def test_expiry_reveals_no_more_than_the_timestamp(now: int, shift: int, ttl: int) -> None:
    # two writes that the recorded timestamps cannot tell apart get the same expiry (with the same TTL)
    hour = 3_600_000
    base = now - now % hour
    other = base + shift  # another moment of the same hour
    off = TimestampPolicy.parse("off")
    assert off.expiry(now, None, ttl) == off.expiry(other, None, ttl)
    assert off.expiry(now, None, ttl) % hour == 0  # and it is a whole hour
    trunc = TimestampPolicy.parse("truncate:1h")
    assert trunc.apply(now) == trunc.apply(other)
    assert trunc.expiry(now, trunc.apply(now), ttl) == trunc.expiry(other, trunc.apply(other), ttl)
    fuzz = TimestampPolicy.parse("fuzz:30s")
    stamped = fuzz.apply(now)
    assert fuzz.expiry(now, stamped, ttl) == fuzz.expiry(now + 7, stamped, ttl)  # depends on the stamp alone


def test_off_expiry_hides_the_minute() -> None:
    # the case: --timestamps off --ttl 7d used to round now + 7d up to the minute, revealing it
    off = TimestampPolicy.parse("off")
    week = 7 * 86_400_000
    t = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000  # the top of an hour
    expiries = {off.expiry(t + m * 60_000, None, week) for m in range(60)}
    assert expiries == {t + 3_600_000 + week}


def test_a_policy_stored_by_an_older_version_still_reads() -> None:
    # feedlog 0.1 took any case, spaces and ms; a feed it created keeps opening, shown canonically
    assert str(TimestampPolicy.parse_stored("FUZZ:1500ms")) == "fuzz:1500ms"
    assert str(TimestampPolicy.parse_stored(" truncate: 60s ")) == "truncate:1m"
    for bad in ("FUZZ:1500ms", "truncate:1ms"):
        with pytest.raises(InvalidArgument):
            TimestampPolicy.parse(bad)  # a new policy must take the one form
    with pytest.raises(InvalidArgument):
        TimestampPolicy.parse_stored("sometimes")


def test_a_feed_whose_settings_an_older_version_wrote_opens(tmp_path: Path) -> None:
    from feedlog.log.feed import SETTINGS_FILE, Feed

    Feed.create(tmp_path / "f").close()
    settings = tmp_path / "f" / SETTINGS_FILE
    settings.write_text(settings.read_text().replace('"truncate:1s"', '"FUZZ:1500ms"'))
    with Feed.open(tmp_path / "f") as f:
        assert f.info()["timestamps"] == "fuzz:1500ms"
