"""The report's PNG plots: throughput per layer, freshness over time, the gold half as gold
grows (matplotlib, imported only when a plot is drawn)."""

from __future__ import annotations

from pathlib import Path

from bench.report.formatting import _n
from bench.report.targets import FAST_P95_S, FAST_RATE, SLOW_P95_S, SLOW_RATE


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_throughput(doc: dict, path: Path) -> Path:
    b = doc["backlog"]
    d, layers = b["decode"], b["layers"]
    changes = b["workload"]["changes"]
    bars = [("raw decode\n(Postgres)", changes / (sum(d["raw_decode_s"]) / 2), "#9e9e9e"),
            *([("pg_recvlogical\n(Postgres)", changes / d["pg_recvlogical_s"], "#bdbdbd")]
              if d.get("pg_recvlogical_s") else []),
            ("ship\n(bronze)", d["ship_changes_per_s"], "#8d6e63"),
            ("stream\n(silver+gold)", layers["stream"]["changes_per_s"], "#42a5f5"),
            ("push", layers["push"]["changes_per_s"], "#2e7d32"),
            ("stream+push", layers["stream_push"]["changes_per_s"], "#1565c0"),
            ("PoC\n(in Postgres)", b["poc_same_wal"]["changes_per_s"], "#c62828")]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    xs = range(len(bars))
    ax.bar(xs, [v for _, v, _ in bars], color=[c for _, _, c in bars])
    ax.set_xticks(list(xs), [n for n, _, _ in bars], fontsize=9)
    ax.set_yscale("log")
    ax.set_ylabel("changes per second (log)")
    ax.axhline(30_000, color="#1565c0", ls="--", lw=1)
    ax.text(-0.4, 30_000, "catch-up target 30k/s", va="bottom", ha="left",
            fontsize=8, color="#1565c0")
    for x, (_, v, _) in zip(xs, bars):
        ax.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_title(f"throughput per layer on a {changes:,}-change backlog "
                 f"(load avg {b['load_before'][0]:.1f} on {doc['machine']['cpus']} cores)")
    return _save(plt, fig, path)


def plot_freshness(doc: dict, path: Path) -> Path:
    f = doc["freshness"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.4))
    for run, colour in zip(f["runs"], ("#1565c0", "#2e7d32", "#6a1b9a", "#8d6e63")):
        lat = run["latency_s"]
        if run["series"]:
            xs, ys = zip(*run["series"])
            ax.plot(xs, ys, color=colour, lw=1,
                    label=f"{run['achieved_rate']:,} changes/s: p50 {lat.get('p50')} s, "
                          f"p95 {lat.get('p95')} s, max {lat.get('max')} s")
    ax.axhline(FAST_P95_S, color="#c62828", ls="--", lw=1,
               label=f"p95 target {FAST_P95_S:g} s at {FAST_RATE:,.0f} changes/s")
    ax.axhline(SLOW_P95_S, color="#ef6c00", ls="--", lw=1,
               label=f"p95 target {SLOW_P95_S:g} s at {SLOW_RATE:,.0f} changes/s")
    ax.axvline(f["seconds"], color="#9e9e9e", ls=":", lw=1, label="traffic stops")
    ax.set_ylim(bottom=0)
    ax.set_title("freshness: each probe's commit → its row on the dashboard, "
                 "lakecdc run (continuous)")
    ax.set_xlabel("probe committed at (seconds since traffic started)")
    ax.set_ylabel("seconds until on the dashboard")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x


def plot_gold_scaling(doc: dict, path: Path) -> Path:
    """Per gold size, the first rate's run (2,000 changes/s in the full run): the gold half
    of its batches (median, mean) and, on a second axis, the dashboard's freshness p95."""
    pts = sorted(doc["gold_scaling"]["points"], key=lambda p: p["gold_keys"])
    runs = [p["runs"][0] for p in pts]
    keys = [p["gold_keys"] for p in pts]
    rate = _n(runs[0]["rate"])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    ax.plot(keys, [_nan(r["gold_half_s"]["median"]) for r in runs], marker="o",
            color="#ffb300", label="gold half, median")
    ax.plot(keys, [_nan(r["gold_half_s"]["mean"]) for r in runs], marker="s",
            color="#8d6e63", label="gold half, mean")
    for k, r in zip(keys, runs):
        ax.annotate(f"{r['gold_half_s']['folds']:,} folds / {r['per_batch']['batches']:,}",
                    (k, _nan(r["gold_half_s"]["mean"])), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.2)     # room for the folds' labels
    ax.set_xlabel("gold keys (log)")
    ax.set_ylabel("seconds per batch")
    fresh = ax.twinx()
    fresh.plot(keys, [_nan(r["latency_s"].get("p95")) for r in runs], marker="^", ls="--",
               color="#1565c0", label="freshness p95 (right axis)")
    fresh.set_ylim(bottom=0, top=fresh.get_ylim()[1] * 1.2)
    fresh.set_ylabel("freshness p95, seconds", color="#1565c0")
    lines = ax.get_legend_handles_labels()
    more = fresh.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title(f"the gold half of a continuous {rate} changes/s batch as gold grows")
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)
