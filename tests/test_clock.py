import pytest

from feedlog.clock import ClockWentBackwards, ManualClock, MonotonicClock, SystemClock


def test_monotonic_and_seeded() -> None:
    m = ManualClock(100)
    c = MonotonicClock(m, seed_ms=50)
    assert c.now_ms() == 100
    m.advance(5)
    assert c.now_ms() == 105


def test_custom_clock_going_backwards_is_an_error() -> None:
    m = ManualClock(100)
    c = MonotonicClock(m)
    c.now_ms()
    m.set(99)
    with pytest.raises(ClockWentBackwards, match="99"):
        c.now_ms()
    with pytest.raises(ClockWentBackwards):
        MonotonicClock(ManualClock(10), seed_ms=20).now_ms()  # behind what is already persisted


def test_system_clock_stepping_back_is_held() -> None:
    c = MonotonicClock(SystemClock(), seed_ms=1 << 60)  # persisted data from "the future"
    assert c.now_ms() == 1 << 60
