"""How a cost grows with size: the fit and the verdict behind tools/bench/bench_growth.py (pure).

A row is a cost (seconds per operation) measured at a few sizes n. Its growth is
the slope of log(cost) against log(n) fitted by least squares: ~0 for a cost
that stays flat, ~1 for one that doubles when n doubles. The row states what
it should be (O(1), O(log n), O(n), O(n log n)); the verdict compares the
measured slope with the slope that class itself shows over the same sizes
(log n grows a little: 10k..10M gives ~0.08), plus a tolerance for a shared,
noisy machine. A slope past that is "worse than expected" and fails the bench.

The last step (the two largest sizes) is judged too, more loosely: a linear term
that is small at 10k and dominant at 10M hides in a fit over the whole range
but shows there.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: the growth classes a row may state, by the cost model each stands for
MODELS: dict[str, Callable[[float], float]] = {
    "O(1)": lambda n: 1.0,
    # (1 + log2 n: a search among n things takes a step even at n = 1)
    "O(log n)": lambda n: 1 + math.log2(n),
    "O(n)": lambda n: n,
    "O(n log n)": lambda n: n * (1 + math.log2(n)),
}
#: how far the fitted slope may exceed its class's own slope over the same sizes
TOLERANCE = 0.25
#: the same for the last step alone (one ratio of two medians: noisier)
STEP_TOLERANCE = 0.5


def fit_exponent(sizes: Sequence[float], costs: Sequence[float]) -> float:
    """The least-squares slope of log(cost) on log(size): the k of cost ~ size^k."""
    if len(sizes) != len(costs) or len(sizes) < 2:
        raise ValueError("a fit needs at least two (size, cost) pairs")
    if min(sizes) <= 0 or min(costs) <= 0:
        raise ValueError("sizes and costs must be positive")
    xs = [math.log(n) for n in sizes]
    ys = [math.log(c) for c in costs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a fit needs at least two different sizes")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def class_exponent(growth: str, sizes: Sequence[float]) -> float:
    """The slope a cost of exactly that class shows over these sizes (0 for O(1), 1 for O(n))."""
    model = MODELS[growth]
    return fit_exponent(sizes, [model(n) for n in sizes])


def closest_class(exponent: float, sizes: Sequence[float]) -> str:
    """The class whose slope over these sizes is nearest the measured one (what the cost looks like)."""
    return min(MODELS, key=lambda g: abs(class_exponent(g, sizes) - exponent))


@dataclass(frozen=True)
class Verdict:
    exponent: float  # fitted over every size
    allowed: float  # the class's own slope + TOLERANCE
    last_step: float  # the slope between the two largest sizes
    last_allowed: float
    looks_like: str

    @property
    def ok(self) -> bool:
        return self.exponent <= self.allowed and self.last_step <= self.last_allowed

    def describe(self, growth: str) -> str:
        if self.ok:
            return "ok"
        where = "over the range" if self.exponent > self.allowed else "in the last step"
        return f"WORSE than {growth} ({where}: looks {self.looks_like})"


def judge(
    growth: str,
    sizes: Sequence[float],
    costs: Sequence[float],
    tolerance: float = TOLERANCE,
    step_tolerance: float = STEP_TOLERANCE,
) -> Verdict:
    """Whether `costs` measured at `sizes` grow no worse than `growth` says."""
    if growth not in MODELS:
        raise ValueError(f"unknown growth {growth!r}; one of {', '.join(MODELS)}")
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    ns, cs = [sizes[i] for i in order], [costs[i] for i in order]
    k = fit_exponent(ns, cs)
    last = fit_exponent(ns[-2:], cs[-2:])
    return Verdict(
        exponent=k,
        allowed=class_exponent(growth, ns) + tolerance,
        last_step=last,
        last_allowed=class_exponent(growth, ns[-2:]) + step_tolerance,
        looks_like=closest_class(k, ns),
    )


@dataclass
class Row:
    """One measured cost: `costs[i]` (seconds) at `sizes[i]`, and the reference's at the same sizes."""

    what: str
    size_unit: str  # "entries", "commits", "live files", "feeds", "tables"
    growth: str  # expected, a key of MODELS
    reference: str  # what the reference is (none of our code)
    sizes: list[int] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    refs: list[float] = field(default_factory=list)

    def add(self, size: int, cost: float, ref: float) -> None:
        self.sizes.append(size)
        self.costs.append(cost)
        self.refs.append(ref)
        print(
            f"  {self.what} at {size:,} {self.size_unit}: {human(cost)}; reference {human(ref)} "
            f"(ours/ref {cost / ref:.2f})",
            flush=True,
        )

    def verdict(self) -> Verdict:
        return judge(self.growth, self.sizes, self.costs)


def human(seconds: float) -> str:
    """A duration in the unit that reads best: 12.3 us, 4.56 ms, 1.23 s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def short(n: int) -> str:
    """10000 -> 10k, 1000000 -> 1M (sizes in a table header)."""
    for unit, name in ((1_000_000, "M"), (1_000, "k")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{name}"
    return f"{n:,}"


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table: cost per size, ours/reference per size, expected and measured growth."""
    lines = [
        "| cost | sizes | ours | reference | ours/ref | expected | measured exponent (last step) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if len(r.sizes) < 2:
            continue
        v = r.verdict()
        lines.append(
            f"| {r.what} | {' / '.join(short(n) for n in r.sizes)} {r.size_unit} "
            f"| {' / '.join(human(c) for c in r.costs)} "
            f"| {r.reference}: {' / '.join(human(c) for c in r.refs)} "
            f"| {' / '.join(f'{c / f:.2f}' for c, f in zip(r.costs, r.refs, strict=True))} "
            f"| {r.growth} (≤ {v.allowed:.2f}) | {v.exponent:.2f} ({v.last_step:.2f}) | {v.describe(r.growth)} |"
        )
    return "\n".join(lines)


def cache_dir(given: str | None) -> Path:
    """Where built fixtures are kept between runs: `given`, else $FEEDLOG_GROWTH_CACHE, else
    /tmp/feedlog-growth (never the repository: a 10M-entry feed is ~1.5 GB)."""
    path = Path(given or os.environ.get("FEEDLOG_GROWTH_CACHE") or "/tmp/feedlog-growth")
    path.mkdir(parents=True, exist_ok=True)
    return path
