"""The demo's picture: counts by status per service, and freshness over the run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from core.extras import require

STATUS_ORDER = ("created", "sending", "delivered", "temporary-failure", "permanent-failure",
                "technical-failure")
COLOURS = ("#9e9e9e", "#42a5f5", "#2e7d32", "#ffb300", "#c62828", "#6a1b9a")
LEGEND_BAND = 0.07       # the share of the figure's height under the charts, for the legend


def plot(counts: dict[tuple[str, str], int], freshness: list[tuple[float, float]],
         path: Path, title: str) -> Path:
    """``counts``: (service label, status) → count; ``freshness``: (seconds into the run,
    seconds from source commit to dashboard). Writes a PNG and returns its path."""
    require("demo")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    services = sorted({s for s, _ in counts})
    statuses = [s for s in STATUS_ORDER if any(k[1] == s for k in counts)] + sorted(
        {st for _, st in counts} - set(STATUS_ORDER))
    fig, (bars, line) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    bottoms = defaultdict(int)
    for i, status in enumerate(statuses):
        values = [counts.get((s, status), 0) for s in services]
        bars.bar(services, values, bottom=[bottoms[s] for s in services], label=status,
                 color=COLOURS[i % len(COLOURS)])
        for s, v in zip(services, values):
            bottoms[s] += v
    bars.set_title("service_stats on the dashboard: notifications by status")
    bars.set_ylabel("notifications")
    bars.tick_params(axis="x", rotation=20)
    if freshness:
        xs, ys = zip(*freshness)
        line.plot(xs, ys, marker=".", color="#1565c0")
    line.set_title("freshness: source commit → dashboard")
    line.set_xlabel("seconds into the run")
    line.set_ylabel("seconds behind the source")
    line.grid(alpha=0.3)
    fig.suptitle(title)
    # The legend in a band of its own under both charts: inside the bars' axes it covered
    # the service names on the x axis.
    fig.legend(*bars.get_legend_handles_labels(), fontsize=8, ncol=len(statuses) or 1,
               loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, LEGEND_BAND, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
