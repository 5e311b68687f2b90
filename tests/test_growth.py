"""tools/bench/growth.py: the fit and the verdict of the cost-growth bench, on synthetic costs."""

import math
import random
from types import ModuleType

import pytest

from tests.conftest import load_tool

SIZES = [10_000, 100_000, 1_000_000, 10_000_000]


@pytest.fixture(scope="module")
def growth() -> ModuleType:
    return load_tool("bench/growth")


def noisy(costs: list[float], seed: int, spread: float = 0.15) -> list[float]:
    """Each cost times a factor in [1 - spread, 1 + spread]: a busy machine's medians."""
    rng = random.Random(seed)
    return [c * rng.uniform(1 - spread, 1 + spread) for c in costs]


def test_fit_recovers_the_exponent_of_a_power_law(growth: ModuleType) -> None:
    for k in (0.0, 0.5, 1.0, 2.0):
        assert growth.fit_exponent(SIZES, [3e-6 * n**k for n in SIZES]) == pytest.approx(k, abs=1e-9)


def test_fit_refuses_what_it_cannot_fit(growth: ModuleType) -> None:
    for sizes, costs in (([10], [1.0]), ([10, 10], [1.0, 2.0]), ([10, 100], [0.0, 1.0]), ([10, 100], [1.0])):
        with pytest.raises(ValueError):
            growth.fit_exponent(sizes, costs)


def test_each_class_passes_its_own_verdict_under_noise(growth: ModuleType) -> None:
    for seed in range(20):
        for name, model in growth.MODELS.items():
            costs = noisy([1e-6 * model(n) for n in SIZES], seed)
            v = growth.judge(name, SIZES, costs)
            assert v.ok, (name, seed, v)
            assert v.looks_like == name or abs(v.exponent - growth.class_exponent(name, SIZES)) < 0.1


def test_a_cost_that_grows_one_class_too_fast_fails(growth: ModuleType) -> None:
    linear = noisy([1e-9 * n for n in SIZES], 1)
    for expected in ("O(1)", "O(log n)"):
        v = growth.judge(expected, SIZES, linear)
        assert not v.ok and v.looks_like == "O(n)"
        assert "WORSE than" in v.describe(expected)
    quadratic = [1e-12 * n * n for n in SIZES]
    assert not growth.judge("O(n)", SIZES, quadratic).ok
    assert not growth.judge("O(n log n)", SIZES, quadratic).ok
    assert growth.judge("O(n)", SIZES, linear).ok


def test_a_linear_term_that_only_shows_at_the_top_fails_on_the_last_step(growth: ModuleType) -> None:
    # 1 ms flat plus a listing of 0.4 ns per item: 1.004, 1.04, 1.4, 5 ms at 10k..10M. The slope over
    # the whole range (0.22) passes for O(1); the last step (x3.6 for x10) does not
    costs = [1e-3 + 4e-10 * n for n in SIZES]
    v = growth.judge("O(1)", SIZES, costs)
    assert not v.ok
    assert v.exponent <= v.allowed and v.last_step > v.last_allowed
    assert "in the last step" in v.describe("O(1)")
    assert growth.judge("O(n)", SIZES, costs).ok


def test_log_growth_is_told_from_constant_and_linear(growth: ModuleType) -> None:
    logs = [2e-6 * (1 + math.log2(n)) for n in SIZES]
    assert growth.judge("O(log n)", SIZES, logs).ok
    assert growth.judge("O(1)", SIZES, logs).ok  # within the tolerance: log n barely grows
    assert growth.closest_class(growth.fit_exponent(SIZES, logs), SIZES) == "O(log n)"


def test_order_of_sizes_does_not_matter_and_unknown_classes_are_refused(growth: ModuleType) -> None:
    costs = [1e-9 * n for n in SIZES]
    a = growth.judge("O(n)", SIZES, costs)
    b = growth.judge("O(n)", SIZES[::-1], costs[::-1])
    assert a == b
    with pytest.raises(ValueError):
        growth.judge("O(n^3)", SIZES, costs)


def test_table_names_each_row_and_its_verdict(growth: ModuleType) -> None:
    ok = growth.Row("get", "entries", "O(log n)", "pread")
    bad = growth.Row("load", "commits", "O(1)", "delta-rs")
    for n in SIZES:
        ok.add(n, 2e-6 * (1 + math.log2(n)), 1e-6)
        bad.add(n, 1e-9 * n, 1e-3)
    text = growth.table([ok, bad])
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| get |") and lines[2].endswith("| ok |")
    assert lines[3].startswith("| load |") and "WORSE than O(1)" in lines[3]
    assert "10k / 100k / 1M / 10M" in lines[2]
