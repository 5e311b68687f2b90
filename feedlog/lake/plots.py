"""Pictures of writer-timestamp activity and freshness (matplotlib, headless: the Agg backend).

`plot_activity` draws a heatmap of feeds x time buckets (entries per bucket, log-scaled
colour) above a line of the totals, with UTC time axes and a caption that says what the
timestamps are worth: the bucket width and why it may be wider than asked, the feeds whose
policy is unknown here, and the entries counted apart (no timestamp, an unset clock, the
future, a clock that went back). `plot_freshness` draws, per feed, how many shared keys it
holds the newest write of, ties and the rest. The format follows the file name (.png or .svg).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any, BinaryIO

from ..errors import InvalidArgument
from ..log.timestamps import format_duration
from .insight import Activity, Freshness

#: the most time columns a heatmap draws; wider ranges are merged for the picture only (the caption says so)
MAX_COLUMNS = 400
#: the most feed rows drawn; the busiest are kept (the caption says how many are left out)
MAX_ROWS = 60


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    matplotlib.rcParams["svg.fonttype"] = "none"  # SVG text stays text: searchable, selectable, smaller
    import matplotlib.pyplot as plt

    return plt


def check_plot_target(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".png", ".svg"):
        raise InvalidArgument(f"--plot {path}: use a .png or .svg file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InvalidArgument(f"--plot {path}: directory {parent} does not exist")
    return ext[1:]


def _save(fig: Any, path: str, fmt: str) -> None:
    """Write the picture whole or not at all (a temp file renamed over the target)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fig.savefig(tmp, format=fmt, dpi=120)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _caveats(a: Activity) -> str:
    parts = [f"UTC; buckets of {format_duration(a.every_ms)}"]
    if a.widened_by:
        parts.append(f"(asked {format_duration(a.requested_ms)}, widened for {len(a.widened_by)} feed policies)")
    unknown = sum(1 for p in a.policies.values() if p.startswith("unknown"))
    if unknown:
        parts.append(f"{unknown} feed(s) of unknown policy (may be fuzzed)")
    apart = {c: sum(x[c] for x in a.apart.values()) for c in ("missing", "epoch", "future", "skew", "cleared")}
    shown = ", ".join(f"{n:,} {c}" for c, n in apart.items() if n)
    if shown:
        parts.append(f"not placed: {shown}")
    parts.append("writer timestamps are self-reported and untrusted")
    return "; ".join(parts)


def plot_activity(a: Activity, path: str) -> str:
    """Draw `a` to `path` (.png/.svg); returns the path."""
    fmt = check_plot_target(path)
    plt = _pyplot()
    fig = _activity_figure(a, plt)
    _save(fig, path, fmt)
    plt.close(fig)
    return path


def draw_activity(a: Activity, out: BinaryIO, fmt: str = "svg") -> None:
    """The picture `plot_activity` draws, written to `out` (the console serves it from memory)."""
    plt = _pyplot()
    fig = _activity_figure(a, plt)
    try:
        fig.savefig(out, format=fmt, dpi=120)
    finally:
        plt.close(fig)


def _activity_figure(a: Activity, plt: Any) -> Any:
    import matplotlib.dates
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import FuncFormatter

    mdates: Any = matplotlib.dates  # its functions are not annotated

    feeds = sorted(a.per_feed, key=lambda f: -sum(a.per_feed[f]))[:MAX_ROWS]
    fig, (heat, line) = plt.subplots(
        2,
        1,
        figsize=(11, 3 + 0.22 * max(len(feeds), 4)),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1]},
        layout="constrained",
    )
    fig.get_layout_engine().set(rect=(0, 0.05, 1, 0.95))  # room for the caption below
    if a.buckets:
        first, last = a.buckets[0], a.buckets[-1] + a.every_ms
        width = a.every_ms * max(1, -(-((last - first) // a.every_ms) // MAX_COLUMNS))
        cols = max(1, -(-(last - first) // width))
        grid = np.zeros((len(feeds), cols))
        totals = np.zeros(cols)
        for i, b in enumerate(a.buckets):
            c = min((b - first) // width, cols - 1)
            totals[c] += a.totals[i]
            for r, f in enumerate(feeds):
                grid[r, c] += a.per_feed[f][i]
        edges = [datetime.fromtimestamp((first + k * width) / 1000, UTC) for k in range(cols + 1)]
        x = mdates.date2num(edges)
        masked = np.ma.masked_equal(grid, 0)
        mesh = heat.pcolormesh(
            x, np.arange(len(feeds) + 1), masked, cmap="viridis", norm=LogNorm(vmin=1, vmax=max(grid.max(), 1))
        )
        bar = fig.colorbar(mesh, ax=(heat, line), label="entries per bucket", pad=0.01)  # both axes one width
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
        bar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))
        line.stairs(totals, x, color="black", linewidth=1.2)
        line.stairs(totals, x, fill=True, alpha=0.2, color="black")
        line.set_xlim(x[0], x[-1])
        placed = totals[totals > 0]
        if placed.size and placed.max() > 20 * np.median(placed):  # one burst would flatten the rest
            line.set_yscale("log")
            line.set_ylim(bottom=0.8)
            line.set_ylabel("all feeds (log)")
        if width != a.every_ms:
            line.set_title(f"drawn in columns of {format_duration(width)}", fontsize=8, loc="right")
    heat.set_yticks([r + 0.5 for r in range(len(feeds))])
    heat.set_yticklabels([f"{f[:10]}… {a.policies.get(f, '')}" for f in feeds], fontsize=7, family="monospace")
    heat.set_ylabel("feed")
    more = len(a.per_feed) - len(feeds)
    heat.set_title(f"entries per feed over time{f' (busiest {len(feeds)}; {more} more not drawn)' if more else ''}")
    if line.get_yscale() != "log":
        line.set_ylabel("all feeds")
    line.set_xlabel("time (UTC)")
    line.xaxis_date(tz=UTC)
    line.xaxis.set_major_formatter(mdates.ConciseDateFormatter(line.xaxis.get_major_locator(), tz=UTC))
    fig.text(0.01, 0.005, _caveats(a), fontsize=7, wrap=True, va="bottom")
    return fig


def plot_freshness(f: Freshness, path: str) -> str:
    """Per feed: shared keys it holds the newest write of, ties, the rest (stacked bars)."""
    fmt = check_plot_target(path)
    plt = _pyplot()
    feeds = f.feeds[:MAX_ROWS]
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.35 * max(len(feeds), 2)))
    names = [x.feed[:12] + "…" for x in feeds]
    newest = [x.newest for x in feeds]
    ties = [x.ties for x in feeds]
    rest = [x.shared - x.newest - x.ties for x in feeds]
    ax.barh(names, newest, color="tab:green", label="newest")
    ax.barh(names, ties, left=newest, color="tab:orange", label="tied (within fuzz)")
    ax.barh(names, rest, left=[a + b for a, b in zip(newest, ties, strict=True)], color="lightgray", label="older")
    ax.set_xlabel(f"shared keys ({f.shared_keys:,}; {f.disagreeing:,} where the feeds' latest writes differ)")
    ax.set_title("which feed holds the newest write of each shared key (by writer timestamp)")
    ax.legend(loc="lower right", fontsize=8)
    ax.invert_yaxis()
    fig.text(0.01, 0.005, "writer timestamps are self-reported and untrusted; within a feed, seq decides", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _save(fig, path, fmt)
    plt.close(fig)
    return path
