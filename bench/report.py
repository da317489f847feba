"""The benchmark report: PNG plots and ``docs/benchmarks.md``, from the result document.

Everything here is a pure function of ``results.json`` (``bench.measure.run_all``), so the
report can be regenerated from a stored result: ``python -m bench.report RESULTS.json
[REPORT.md]``. The prose is the template below; every number in it is filled in.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from string import Template

from bench.stages import STAGE_LABELS, STAGES
from core.layout import STREAM_QUERY

QUERY = STREAM_QUERY                  # the one streaming query (pipelines/run/stream.py)
FAST_RATE, SLOW_RATE = 2000.0, 200.0    # the freshness targets' rates (changes/s)
FAST_P95_S, SLOW_P95_S = 1.0, 0.5       # and their p95s (the targets)


def run_at(doc: dict, rate: float) -> dict | None:
    """The freshness run at ``rate`` (target changes/s), or None if this run had none."""
    return next((r for r in doc["freshness"]["runs"] if r["rate"] == rate), None)


def _p95_at(rate: float):
    def value(doc: dict):
        run = run_at(doc, rate)
        return None if run is None else run["latency_s"].get("p95")
    return value


def largest_gold(doc: dict) -> dict:
    """The gold scaling point with the most gold keys."""
    return max(doc["gold_scaling"]["points"], key=lambda p: p["gold_keys"])


def gold_run_at(point: dict, rate: float) -> dict | None:
    """A gold scaling point's continuous run at ``rate`` (changes/s), or None."""
    return next((r for r in point["runs"] if r["rate"] == rate), None)


def _big_gold_p95_at(rate: float):
    def value(doc: dict):
        run = gold_run_at(largest_gold(doc), rate)
        return None if run is None else run["latency_s"].get("p95")
    return value


TARGETS = (
    # key, description, value(doc) (None: not measured in this run), limit,
    # met(value, limit), unit
    ("ship_recvlogical", "shipper ≥ 1.2× `pg_recvlogical`",
     lambda d: d["backlog"]["decode"].get("ship_vs_recvlogical"), 1.2,
     lambda v, lim: v >= lim, "×"),
    ("ship_ratio", "shipper ≥ 0.8× raw decode (the moonshot)",
     lambda d: d["backlog"]["decode"]["ratio"], 0.8, lambda v, lim: v >= lim, "×"),
    ("catch_up", "stream + push catch-up ≥ 30k changes/s",
     lambda d: d["backlog"]["layers"]["stream_push"]["changes_per_s"], 30_000,
     lambda v, lim: v >= lim, " changes/s"),
    ("catch_up_e2e", "end-to-end catch-up of a warm `run`, frozen then thawed, ≥ 50k changes/s",
     lambda d: d.get("catch_up", {}).get("warm", {}).get("changes_per_s"), 50_000,
     lambda v, lim: v >= lim, " changes/s"),
    ("freshness", f"freshness p95 ≤ {FAST_P95_S:g} s at 2k changes/s", _p95_at(FAST_RATE),
     FAST_P95_S, lambda v, lim: v <= lim, " s"),
    ("freshness_slow", f"freshness p95 ≤ {SLOW_P95_S:g} s at 200 changes/s",
     _p95_at(SLOW_RATE), SLOW_P95_S, lambda v, lim: v <= lim, " s"),
    ("gold_growth",
     "gold half of a continuous 2,000/s batch grows ≤ 1.5× from 10k to 1M gold keys",
     lambda d: d["gold_scaling"]["batch_growth"], 1.5, lambda v, lim: v <= lim, "×"),
    ("big_gold_fresh", "freshness p95 ≤ 5 s at 2k changes/s with the largest gold",
     _big_gold_p95_at(FAST_RATE), 5.0, lambda v, lim: v <= lim, " s"),
    ("big_gold_fresh_slow", "freshness p95 ≤ 3 s at 200 changes/s with the largest gold",
     _big_gold_p95_at(SLOW_RATE), 3.0, lambda v, lim: v <= lim, " s"),
    ("rss", "shipper peak RSS ≤ 512 MB through a 1M-row transaction",
     lambda d: d["big_transaction"]["peak_rss_mb"], 512, lambda v, lim: v <= lim, " MB"),
    ("mirror_catch_up", "mirrors' catch-up ≥ 50k changes/s",
     lambda d: d["backlog"]["layers"]["mirrors"]["changes_per_s"], 50_000,
     lambda v, lim: v >= lim, " changes/s"),
    ("big_table_load", "`tables add` of the big table at ≥ 0.3× the speed of its COPY",
     lambda d: d.get("big_table", {}).get("load", {}).get("of_copy"), 0.3,
     lambda v, lim: v >= lim, "×"),
    ("big_mirror_fresh", "the big table's mirror p95 ≤ 10 s at 2k changes/s",
     lambda d: d.get("big_table", {}).get("kept", {}).get("mirror_latency_s", {}).get("p95"),
     10.0, lambda v, lim: v <= lim, " s"),
    ("big_mirror_growth",
     "a mirrors' batch grows ≤ 1.5× from the smaller big table to the big one",
     lambda d: d.get("big_table", {}).get("kept_growth"), 1.5, lambda v, lim: v <= lim, "×"),
)


def _exact(check: dict) -> bool:
    return check["gold"]["exact"] and check["dashboard"]["exact"]


def all_exact(doc: dict) -> bool:
    checks = [doc["backlog"]["lakecdc"], *[r["lakecdc"] for r in doc["freshness"]["runs"]],
              *[r["lakecdc"] for p in doc["gold_scaling"]["points"] for r in p["runs"]],
              *[r["lakecdc"] for r in _catch_up_runs(doc).values()],
              *[r["lakecdc"] for r in doc.get("writers", {}).get("runs", [])],
              *([doc["big_table"]["lakecdc"]] if "lakecdc" in doc.get("big_table", {}) else [])]
    mirrors = [r["neighbours"]["mirrors_equal_source"] for r in doc["freshness"]["runs"]
               if "neighbours" in r]
    if "mirror" in doc.get("big_table", {}):
        mirrors.append(doc["big_table"]["mirror"]["sample_differing"] == 0)
    return all(c["gold"]["exact"] and c["dashboard"]["exact"] for c in checks) and all(mirrors)


def _catch_up_runs(doc: dict) -> dict:
    """The catch-up section's runs by start (warm, cold, first); none in an older result."""
    return {k: v for k, v in doc.get("catch_up", {}).items() if k in ("warm", "cold", "first")}


def catch_up_rows(doc: dict) -> str:
    rows = [f"| {name} | {_n(r['workload']['changes'])} | {_n(r['seconds'])} | "
            f"{_n(r['changes_per_s'])} | {_or_dash(r.get('gold_seconds'))} | "
            f"{_or_dash(r.get('start_up_s'))} | "
            + f"{_cpu(r.get('cpu_s'))} | "
            + f"{r['load_before'][0]} | {'exact' if _exact(r['lakecdc']) else 'NOT exact'} |"
            for name, r in _catch_up_runs(doc).items()]
    return "\n".join(rows) or "| not measured in this run | | | | | | | | |"


def _cpu(used: dict | None) -> str:
    """A catch-up's CPU seconds per part (``bench.cpu``), ``-`` in an older result."""
    if not used:
        return "-"
    return (f"{_n(used['total'])} (Postgres {_n(used['postgres'])}, Python "
            f"{_n(used['lakecdc_python'])}, JVM {_n(used['jvm'])}, bench {_n(used['bench'])})")


def writer_rows(doc: dict) -> str:
    """The writers section's runs, one row each (none in an older result)."""
    rows = [f"| {r['writer']} | {_n(r['rate'])} | {_n(r['achieved_rate'])} | "
            f"{_n(r['latency_s'].get('p50'))} / {_n(r['latency_s'].get('p95'))} / "
            f"{_n(r['latency_s'].get('max'))} | "
            f"{' / '.join(_n(r.get('mirror_latency_s', {}).get(k)) for k in ('p50', 'p95', 'max'))}"
            f" | {r['load_before'][0]} → {r['load_after'][0]} | "
            f"{'exact' if _exact(r['lakecdc']) else 'NOT exact'} |"
            for r in doc.get("writers", {}).get("runs", [])]
    return "\n".join(rows) or "| not measured in this run | | | | | | |"


def verdicts(doc: dict) -> list[dict]:
    """Per target: its value (None when this run did not measure it: then not met)."""
    out = []
    for key, text, value, limit, met, unit in TARGETS:
        v = value(doc)
        out.append({"key": key, "target": text, "value": v, "unit": unit,
                    "met": v is not None and bool(met(v, limit))})
    return out


def _n(x) -> str:
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.2f}"
    return f"{int(x):,}" if x is not None else "n/a"


def _or_dash(x) -> str:
    """``_n``, or ``-`` for a figure not measured."""
    return "-" if x is None else _n(x)


def _whole(x: float | None) -> int | None:
    """A count's median (half-way between two counts), to the nearest whole."""
    return None if x is None else round(x)


def _ms(x: float | None) -> str:
    """Seconds to the millisecond (the gold half's figures, whose ratio is a target)."""
    return "n/a" if x is None else f"{x:.3f}"


def _measured(v: dict) -> str:
    return "n/a" if v["value"] is None else _n(v["value"]) + v["unit"]


def _verdict(v: dict, missed: str = "missed") -> str:
    if v["value"] is None:
        return "n/a"
    return "met" if v["met"] else missed


def summary(doc: dict) -> str:
    width = max(len(text) for _, text, *_ in TARGETS)
    lines = [f"{'target':<{width}} {'measured':>16}  verdict"]
    for v in verdicts(doc):
        lines.append(f"{v['target']:<{width}} {_measured(v):>16}  {_verdict(v, 'MISSED')}")
    lines.append(f"lakecdc counts exact everywhere: {'yes' if all_exact(doc) else 'NO'}; "
                 f"load average {doc['load_start']} → {doc['load_end']}")
    return "\n".join(lines)


# --- plots ------------------------------------------------------------------------------

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


# --- the Markdown report ------------------------------------------------------------------

def _loads(doc: dict) -> list[float]:
    """Every 1-min load average the run recorded."""
    f = doc["freshness"]
    return [doc["load_start"][0], doc["load_end"][0], doc["backlog"]["load_before"][0],
            f["load_before"][0], *[r["load_before"][0] for r in f["runs"]],
            *[r["load_after"][0] for r in f["runs"]],
            doc["gold_scaling"]["load_before"][0],
            *[x for p in doc["gold_scaling"]["points"] for r in p["runs"]
              for x in (r["load_before"][0], r["load_after"][0])],
            doc["big_transaction"]["load_before"][0]]


def _rows_per_batch(run: dict) -> float | None:
    """lakecdc's own count (Spark's ``numInputRows`` misses the bronze files the stream
    reads itself: ``silver.writer.batch_rows``)."""
    per = run.get("per_batch") or {}
    return round(per["rows"]) if per.get("batches") else None


def _neighbours(run: dict) -> str:
    """The other tables' traffic of a freshness run, and whether their mirrors ended equal
    to the source."""
    n = run.get("neighbours")
    if n is None:
        return "-"
    return (f"{n['tables']} × {_n(n['achieved_per_table'])} rows/s, mirrors "
            f"{'= source' if n['mirrors_equal_source'] else 'DIFFER'}")


def _mirror_probes(run: dict) -> str:
    """The mirror probe's columns of a freshness run (``-`` for a run without one)."""
    if "mirror_latency_s" not in run:
        return "- | -"
    lat = run["mirror_latency_s"]
    return (f"{_n(run['mirror_probes']['committed'])} / {_n(run['mirror_probes']['seen'])} | "
            f"{_n(lat.get('p50'))} / {_n(lat.get('p95'))} / {_n(lat.get('max'))}")


def _run_values(run: dict | None, prefix: str) -> dict:
    """A freshness run's figures for the prose, ``prefix``-named; "n/a" without the run."""
    keys = ("p50", "p95", "pmax", "rate", "probes", "placed", "shown_ahead",
            *(f"{stage}_p50" for stage in STAGES))
    if run is None:
        return {f"{prefix}_{k}": "n/a" for k in keys}
    lat = run["latency_s"]
    stages = run.get("stages") or {}
    return {f"{prefix}_{k}": v for k, v in {
        "p50": _n(lat.get("p50")), "p95": _n(lat.get("p95")), "pmax": _n(lat.get("max")),
        "rate": _n(run["achieved_rate"]), "probes": _n(run["probes"]["seen"]),
        "placed": _n(stages.get("placed")), "shown_ahead": _n(stages.get("shipped_ahead")),
        **{f"{stage}_p50": _n(stages.get(stage, {}).get("p50")) for stage in STAGES},
        }.items()}


def _values(doc: dict, images: dict[str, str]) -> dict:
    b, f, g, t = (doc["backlog"], doc["freshness"], doc["gold_scaling"],
                  doc["big_transaction"])
    d, layers = b["decode"], b["layers"]
    stream = layers["stream"]
    per = stream["per_batch"]
    m = doc["machine"]
    prog = b.get("spark_progress", {})

    def phase(name: str) -> str:
        return _n(prog.get(QUERY, {}).get(f"{name}_ms", 0) / 1000.0)

    def total(key: str) -> float:
        """A per-batch mean of the backlog's stream, summed over its batches."""
        return round(per.get(key, 0) * per.get("batches", 0), 2)

    target_rows = "\n".join(
        f"| {v['target']} | {_measured(v)} | {_verdict(v, '**missed**')} |"
        for v in verdicts(doc))
    layer_rows = "\n".join(
        f"| {name} | {_n(layers[key]['seconds'])} | {_n(layers[key]['changes_per_s'])} |"
        for name, key in ((("stream (bronze → silver/changes, silver/quarantine and "
                            "gold/service_stats, one query, `stream --once`)"), "stream"),
                          ("push (gold → dashboard, `push --once`)", "push"),
                          ("stream + push", "stream_push"),
                          ("mirrors (silver → a typed mirror per captured table, "
                           "`mirrors --once`; not in stream + push)", "mirrors"))
        if key in layers)
    scale_rows = "\n".join(
        f"| {_n(p['gold_keys'])} | {_n(p['services'])} | {_n(r['rate'])} "
        f"({_n(r['achieved_rate'])}) | {_n(r['per_batch'].get('batches'))} | "
        f"{_n(_whole(r['gold_half_s'].get('step_keys_median')))} | "
        f"{_ms(r['gold_half_s']['median'])} | {_ms(r['gold_half_s']['mean'])} | "
        f"{_ms(r['gold_half_s']['p90'])} | {_ms(r['gold_half_s'].get('ahead_median'))} | "
        f"{_n(r['gold_half_s']['folds'])} | "
        f"{_n(r['latency_s'].get('p50'))} / {_n(r['latency_s'].get('p95'))} / "
        f"{_n(r['latency_s'].get('max'))} | {r['load_before'][0]} → {r['load_after'][0]} | "
        f"{'exact' if _exact(r['lakecdc']) else 'DIFFERS'} |"
        for p in sorted(g["points"], key=lambda p: p["gold_keys"]) for r in p["runs"])

    def poc_row(name: str, key: str) -> str:
        r = b[key]
        return (f"| {name} | {_n(r['changes_per_s'])} | {r['ticks']} | "
                f"{'exact' if r['exact'] else 'drifts'} | {r['keys_differing']} of {r['keys']} | "
                f"{r['total_error_pct']:+.2f}% | {r['abs_error_pct']:.2f}% |")

    lk = b["lakecdc"]
    lakecdc_row = (f"| lakecdc (stream + push) | "
                   f"{_n(layers['stream_push']['changes_per_s'])} | - | "
                   f"{'exact' if lk['gold']['exact'] and lk['dashboard']['exact'] else 'drifts'}"
                   f" | {lk['dashboard']['keys_differing']} of {lk['dashboard']['keys']} | "
                   f"{lk['dashboard']['total_error_pct']:+.2f}% | "
                   f"{lk['dashboard']['abs_error_pct']:.2f}% |")
    w = b["workload"]
    f0 = f["runs"][0]
    fresh_rows = "\n".join(
        f"| {_n(r['rate'])} | {_n(r['achieved_rate'])} | {_n(r['written']['changes'])} | "
        f"{_n(r['probes']['committed'])} / {_n(r['probes']['seen'])} | "
        f"{_n(r['latency_s'].get('p50'))} | {_n(r['latency_s'].get('p95'))} | "
        f"{_n(r['latency_s'].get('max'))} | {_mirror_probes(r)} | "
        f"{r['load_before'][0]} → {r['load_after'][0]} | "
        f"{'exact' if _exact(r['lakecdc']) else 'NOT exact'} | {_neighbours(r)} |"
        for r in f["runs"])
    return {
        "started_at": doc["started_at"], "seconds": _n(doc.get("seconds", 0)),
        "cpus": m["cpus"], "cpu": m["cpu"] or "unknown CPU", "memory_gb": m["memory_gb"],
        "kernel": m["kernel"], "python": m["python"], "postgres": m["postgres"],
        "pyspark": m["pyspark"], "deltalake": m["deltalake"],
        "load_min": min(_loads(doc)), "load_max": max(_loads(doc)),
        "load_start": ", ".join(map(str, doc["load_start"])),
        "load_end": ", ".join(map(str, doc["load_end"])),
        "load_backlog": b["load_before"][0], "load_freshness": f["load_before"][0],
        "load_scaling": g["load_before"][0], "load_bigtx": t["load_before"][0],
        "command": doc.get("command", "python -m bench"),
        "params": ", ".join(f"{k}={v}" for k, v in doc["params"].items()),
        "target_rows": target_rows, "layer_rows": layer_rows, "scale_rows": scale_rows,
        "changes": _n(w["changes"]), "inserts": _n(w["inserts"]), "updates": _n(w["updates"]),
        "archived": _n(w["archived"]), "deletes": _n(w["deletes"]),
        "delete_pct": f"{100 * w['deletes'] / max(w['inserts'], 1):.1f}",
        "transactions": _n(w["transactions"]), "peek_rows": _n(d["peek_rows"]),
        "raw1": _n(d["raw_decode_s"][0]), "raw2": _n(d["raw_decode_s"][1]),
        "ship_s": _n(d["ship_s"]), "ratio": _n(d["ratio"]),
        "recv_s": _n(d.get("pg_recvlogical_s")), "recv_ratio": _n(d.get("ship_vs_recvlogical")),
        "recv_rows_per_s": _n(round(d["peek_rows"] / d["pg_recvlogical_s"]))
        if d.get("pg_recvlogical_s") else "n/a",
        "recv_of_raw": _n(round(sum(d["raw_decode_s"]) / len(d["raw_decode_s"])
                                / d["pg_recvlogical_s"], 2))
        if d.get("pg_recvlogical_s") else "n/a",
        **_drain_values(d),
        "raw_rows_per_s": _n(d["raw_rows_per_s"]), "ship_rows_per_s": _n(d["ship_rows_per_s"]),
        "ship_rss": _n(d["ship_peak_rss_mb"]),
        "stream_batches": _n(stream["batches"]), "stream_rows": _n(stream["rows"]),
        "stream_transactions": _n(stream["transactions"]),
        "pass_rows": pass_table(doc),
        "bl_seconds": _n(per.get("seconds")), "bl_silver_s": _n(per.get("silver_s")),
        "bl_gold_s": _n(per.get("gold_s")), "bl_merge_s": _n(per.get("merge_s")),
        "bl_jobs": _n(per.get("jobs")),
        "gold_batch_s": _n(total("gold_s")), "gold_merge_s": _n(total("merge_s")),
        "fresh_progress": fresh_progress(doc),
        "fresh_stages": fresh_stages(doc),
        "catch_up_rows": catch_up_rows(doc),
        "writer_rows": writer_rows(doc),
        "push_keys": _n(layers["push"]["keys"]),
        "stream_progress": (
            f"Spark's query progress for the same run (summed `durationMs`): trigger "
            f"{phase('triggerExecution')} s, of which the `foreachBatch` (`addBatch`) "
            f"{phase('addBatch')} s and query planning {phase('queryPlanning')} s."
            if prog.get(QUERY) else
            "Spark's query progress for this `stream --once` reached Python after its timed "
            "window closed (progress events arrive asynchronously: `bench/profile.py`), so "
            "it is not in this run's results."),
        "poc_rows": "\n".join([lakecdc_row, poc_row("PoC, same WAL (lakecdc's replica "
                                                    "identity)", "poc_same_wal"),
                               poc_row("PoC, twin database, default replica identity (primary "
                                       "key)", "poc_pk_identity")]),
        "poc_rate": _n(b["poc_same_wal"]["changes_per_s"]),
        "poc_same_counts": "exact" if b["poc_same_wal"]["exact"] else
        f"off on {b['poc_same_wal']['keys_differing']} keys",
        "poc_pk_total": f"{b['poc_pk_identity']['total_error_pct']:+.1f}",
        "poc_pk_abs": f"{b['poc_pk_identity']['abs_error_pct']:.1f}",
        "twin_identical": "identical" if b["twin_identical"] else "NOT identical",
        "lakecdc_keys": _n(lk["gold"]["keys"]), "lakecdc_total": _n(lk["gold"]["expected_total"]),
        "rate": _n(f0["rate"]), "fresh_seconds": _n(f["seconds"]), "fresh_rows": fresh_rows,
        "fresh_rates": ", ".join(_n(r["rate"]) for r in f["runs"]),
        "fresh_when": _when(f) + (" Its database was set up on its own and warmed with 2,000 "
                                  "changes, not the backlog's." if f.get("measured_at")
                                  else ""),
        **_run_values(run_at(doc, FAST_RATE), "fast"),
        **_run_values(run_at(doc, SLOW_RATE), "slow"),
        **_scale_values(doc),
        "bigtx_rows": _n(t["rows"]), "bigtx_rss": _n(t["peak_rss_mb"]),
        "bigtx_s": _n(t["ship_s"]), "bigtx_rate": _n(t["changes_per_s"]),
        **_big_table_values(doc.get("big_table")),
        "catch_up": _n(layers["stream_push"]["changes_per_s"]),
        "mirror_rate": _n(layers["mirrors"]["changes_per_s"]),
        **_catch_up_values(doc),
        "backlog_when": _when(doc["backlog"]),
        "writers_when": _when(doc.get("writers", {})),
        "catch_up_when": _when(doc.get("catch_up", {})),
        "stream_rate": _n(stream["changes_per_s"]),
        "push_rate": _n(layers["push"]["changes_per_s"]),
        **images,
    }


def _drain_values(decode: dict) -> dict:
    """The replication-protocol witness's row (``n/a`` in runs from before it)."""
    drain = decode.get("psycopg_replication")
    if not drain:
        return {"repl_s": "n/a", "repl_rows_per_s": "n/a", "repl_cpu": "n/a"}
    return {"repl_s": _n(drain["seconds"]), "repl_cpu": _n(drain["client_cpu_s"]),
            "repl_rows_per_s": _n(round(drain["messages"] / drain["seconds"]))}


def _when(section: dict) -> str:
    """For a section measured again on its own (``python -m bench --sections``): when."""
    if not section.get("measured_at"):
        return ""
    return (f" Measured again on its own, after the rest of the page (begun "
            f"{section['measured_at'][:16].replace('T', ' ')} UTC, load "
            f"{section['load_start']} at its start).")


def _catch_up_values(doc: dict) -> dict:
    """The end-to-end catch-up's figures for the analysis (``n/a`` where not measured)."""
    runs = _catch_up_runs(doc)
    warm, cold = runs.get("warm", {}), runs.get("cold", {})
    return {"warm_rate": _n(warm.get("changes_per_s")),
            "warm_gold_s": _n(warm.get("gold_seconds")),
            "warm_cpu": _cpu(warm.get("cpu_s")),
            "cold_s": _n(cold.get("seconds")),
            "cold_start_s": _n(cold.get("start_up_s")),
            "first_s": _n(runs.get("first", {}).get("seconds")),
            "ship_changes_per_s": _n(doc["backlog"]["decode"]["ship_changes_per_s"])}


def _big_table_values(big: dict | None) -> dict:
    """The big table's section (``bench.big_table``); ``-`` where it did not run."""
    if not big or "load" not in big:
        return dict.fromkeys(("big_rows", "big_rate", "big_copy_s", "big_copy_rate",
                              *_big_kept_values(None, "big_kept"),
                              *_big_kept_values(None, "big_small_kept"), "big_small_rows",
                              "big_kept_growth",
                              "big_load_s", "big_load_rate", "big_of_copy", "big_add_s",
                              "big_replayed_s", "big_of_copy_replayed", "big_verify_s",
                              "big_verify", "big_verify_xact_s", "big_whole_s",
                              "big_whole", "big_whole_xact_s",
                              "big_rss", "big_xact_s", "big_xmin", "big_sample",
                              "big_differing", "big_exact"), "-")
    load, copy, mirror = big["load"], big["copy"], big["mirror"]
    return {"big_rows": _n(big["rows"]), "big_rate": _n(big["rate"]),
            "big_copy_s": _n(copy["seconds"]), "big_copy_rate": _n(copy["rows_per_s"]),
            "big_load_s": _n(load["seconds"]), "big_load_rate": _n(load["rows_per_s"]),
            "big_of_copy": _n(load["of_copy"]), "big_add_s": _n(load["tables_add_s"]),
            "big_replayed_s": _n(load["replayed_s"]),
            "big_of_copy_replayed": _n(load["of_copy_replayed"]),
            **_big_verify_values(big.get("verify"), "big_verify"),
            **_big_verify_values(big.get("verify_whole"), "big_whole"),
            "big_rss": _n(load["tables_add_peak_rss_mb"]),
            "big_xact_s": _n(load["oldest_transaction_s"]),
            "big_xmin": _n(load["oldest_snapshot_xids"]),
            "big_sample": _n(mirror["sample_rows"]), "big_differing": _n(mirror["sample_differing"]),
            "big_exact": "exact" if _exact(big["lakecdc"]) else "NOT exact",
            **_big_kept_values(big.get("kept"), "big_kept"),
            **_big_kept_values((big.get("smaller") or {}).get("kept"), "big_small_kept"),
            "big_small_rows": _or_dash((big.get("smaller") or {}).get("rows")),
            "big_kept_growth": _or_dash(big.get("kept_growth"))}


def _big_kept_values(kept: dict | None, name: str) -> dict:
    """The big table's mirror kept under traffic (``bench.big_table.kept``)."""
    keys = ("p50", "p95", "max", "batches", "mean", "busy", "folds", "fold_s")
    if not kept:
        return {f"{name}_{k}": "-" for k in keys}
    lat, folds = kept["mirror_latency_s"], kept["folds"]
    return {f"{name}_p50": _or_dash(lat.get("p50")), f"{name}_p95": _or_dash(lat.get("p95")),
            f"{name}_max": _or_dash(lat.get("max")),
            f"{name}_batches": _n(kept["mirrors_batches"]),
            f"{name}_mean": _or_dash(kept["mirrors_batch_mean_s"]),
            f"{name}_busy": _n(kept["mirrors_busy_share"]), f"{name}_folds": _n(len(folds)),
            f"{name}_fold_s": ", ".join(_n(f["seconds"]) for f in folds) or "-"}


def _big_verify_values(verify: dict | None, name: str) -> dict:
    """A ``lakecdc verify`` after the big table's run: seconds, its verdict, its snapshot."""
    if not verify:
        return {f"{name}_s": "-", name: "-", f"{name}_xact_s": "-"}
    return {f"{name}_s": _n(verify["seconds"]),
            name: "exact" if verify["exit"] == 0 else f"exit {verify['exit']}",
            f"{name}_xact_s": _n(verify["oldest_transaction_s"])}


def _scale_run_values(run: dict | None, prefix: str) -> dict:
    """A gold scaling run's figures for the prose, ``prefix``-named; "n/a" without it."""
    keys = ("p50", "p95", "pmax", "rate", "batches", "seconds", "median", "mean", "folds",
            "load")
    if run is None:
        return {f"{prefix}_{k}": "n/a" for k in keys}
    lat, half = run["latency_s"], run["gold_half_s"]
    return {f"{prefix}_{k}": v for k, v in {
        "p50": _n(lat.get("p50")), "p95": _n(lat.get("p95")), "pmax": _n(lat.get("max")),
        "rate": _n(run["achieved_rate"]), "batches": _n(run["per_batch"].get("batches")),
        "seconds": _n(run["per_batch"].get("seconds")), "median": _ms(half["median"]),
        "mean": _ms(half["mean"]), "folds": _n(half["folds"]),
        "load": f"{run['load_before'][0]} → {run['load_after'][0]}"}.items()}


def _scale_values(doc: dict) -> dict:
    """Section 3's figures: per gold size, the first rate's run (2,000 changes/s in the full
    run); the largest gold's runs at 2,000 and 200 changes/s."""
    g = doc["gold_scaling"]
    pts = sorted(g["points"], key=lambda p: p["gold_keys"])
    first = [p["runs"][0] for p in pts]
    big = largest_gold(doc)
    others = [r["rate"] for r in big["runs"][1:]]
    return {
        "key_growth": _n(g["key_growth"]), "batch_growth": _n(g["batch_growth"]),
        "batch_growth_mean": _n(g["batch_growth_mean"]),
        "scale_rate": _n(first[0]["rate"]),
        "scale_when": _when(g),
        "scale_seconds": _n(doc["params"].get("scale_s")),
        "scale_also": (f" At the largest size also at "
                       f"{' and '.join(_n(r) for r in others)} changes/s." if others else ""),
        "scale_big_rates": ", ".join(_n(r["rate"]) for r in big["runs"]),
        "keys_first": _n(pts[0]["gold_keys"]), "keys_last": _n(pts[-1]["gold_keys"]),
        "scale_keys": " → ".join(_n(p["gold_keys"]) for p in pts),
        "scale_medians": " → ".join(_ms(r["gold_half_s"]["median"]) for r in first),
        "scale_means": " → ".join(_ms(r["gold_half_s"]["mean"]) for r in first),
        "scale_folds": " → ".join(f"{_n(r['gold_half_s']['folds'])} in "
                                  f"{_n(r['per_batch'].get('batches'))}" for r in first),
        "scale_p95s": " → ".join(_n(r["latency_s"].get("p95")) for r in first),
        "scale_loads": ", ".join(f"{r['load_before'][0]}-{r['load_after'][0]}"
                                 for r in first),
        **_scale_run_values(gold_run_at(big, FAST_RATE), "big"),
        **_scale_run_values(gold_run_at(big, SLOW_RATE), "bigslow"),
    }


def pass_table(doc: dict) -> str:
    """lakecdc's own account of the stream's batches (``bench.profile.PassLog``): per-batch
    means on the backlog, and for every freshness run that recorded them."""
    rows = [("backlog, `stream --once`", doc["backlog"]["layers"]["stream"].get("per_batch"))]
    rows += [(f"freshness at {_n(r['rate'])} changes/s", r.get("per_batch"))
             for r in doc["freshness"]["runs"] if r.get("per_batch")]
    lines = [("| | batches | rows per batch | s per batch | parse s | parse + silver appends s "
              "| gold half s | of which MERGE s | Spark jobs per batch |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for name, p in rows:
        if not p or not p.get("batches"):
            lines.append(f"| {name} | 0 | - | - | - | - | - | - | - |")
            continue
        lines.append(f"| {name} | {_n(p['batches'])} | {_n(round(p['rows']))} | "
                     f"{_n(p['seconds'])} | {_n(p.get('parse_s'))} | {_n(p['silver_s'])} | "
                     f"{_n(p['gold_s'])} | {_n(p['merge_s'])} | {_n(p['jobs'])} |")
    return "\n".join(lines)


def fresh_stages(doc: dict) -> str:
    """Each freshness run's probe latency, stage by stage (``bench.stages``)."""
    runs = [r for r in doc["freshness"]["runs"] if r.get("stages", {}).get("placed")]
    if not runs:
        return "(no stage breakdown in this run)"
    head = "| stage | " + " | ".join(
        f"{_n(r['rate'])}/s p50 / p95 s (share)" for r in runs) + " |"
    lines = [head, "|---|" + "---|" * len(runs)]
    for stage, name in STAGE_LABELS.items():
        cells = [f"{_n(s.get('p50'))} / {_n(s.get('p95'))} ({_n(s.get('share'))})"
                 for s in (r["stages"].get(stage, {}) for r in runs)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| probes placed / seen | " + " | ".join(
        f"{_n(r['stages']['placed'])} / {_n(r['stages']['probes'])}" for r in runs) + " |")
    lines.append("| of them, shown ahead of the stream | " + " | ".join(
        _n(r["stages"].get("shipped_ahead")) for r in runs) + " |")
    return "\n".join(lines)


def fresh_progress(doc: dict) -> str:
    """Spark's account of every freshness run, per streaming query, as a table."""
    lines = [("| run | query | micro-batches | rows per batch | s per batch (trigger) | "
              "of which `addBatch` s | `queryPlanning` s | `latestOffset` s |"),
             "|---|---|---|---|---|---|---|---|"]
    for run in doc["freshness"]["runs"]:
        for name, q in sorted((run.get("spark_progress") or {}).items()):
            n = max(q.get("batches", 0), 1)
            rows = _rows_per_batch(run) if name == QUERY else round(q.get("input_rows", 0) / n)
            lines.append(f"| {_n(run['rate'])} changes/s | `{name}` | "
                         f"{_n(q.get('batches', 0))} | {_n(rows)} | "
                         f"{_n(q.get('triggerExecution_ms', 0) / 1000 / n)} | "
                         f"{_n(q.get('addBatch_ms', 0) / 1000 / n)} | "
                         f"{_n(q.get('queryPlanning_ms', 0) / 1000 / n)} | "
                         f"{_n(q.get('latestOffset_ms', 0) / 1000 / n)} |")
    if len(lines) == 2:
        return "(not recorded in this run)"
    return "\n".join(lines)


def _change_path(run: str) -> str:
    """A change's path in `lakecdc run`, for a freshness run's text (``run``: the values'
    prefix, ``fast`` or ``slow``) whether its target is met or not."""
    return """A change's path in `lakecdc run`: the shipper's next peek
(every 0.1 s, `--poll-interval`), the peek and its bronze commit; then the batch's step goes
ahead of the stream: parsed in Arrow, planned by gold and upserted into the dashboard in one
transaction beside the slot's advance (docs/gold.md, "Ahead of the stream"), so the stream's
own batch later finds the dashboard past it. ${RUN_shown_ahead} of the ${RUN_placed}
probes placed on the pipeline's timeline were shown that way. The stages' medians: poll
wait ${RUN_poll_wait_p50} s, ship ${RUN_ship_p50} s, ahead of the stream
${RUN_ship_ahead_p50} s, seen ${RUN_seen_p50} s (the stage table above; their budget
below). The ${RUN_probes} probes saw p50 ${RUN_p50} s, max ${RUN_pmax} s.""".replace(
        "${RUN_", "${" + run + "_")


# The gold half as gold grows, whether its target is met or not.
_GOLD_FOLD = """At ${scale_rate} changes/s its median went ${scale_medians} s and its mean
${scale_means} s while gold's keys went ${scale_keys}; folds in batches: ${scale_folds};
freshness p95 ${scale_p95s} s (1-min load over the runs ${scale_loads}). A copy-on-write
MERGE rewrites every file holding a key it changes, and a batch's keys are spread over a
large gold, so one MERGE per batch rewrote nearly all of gold (delta-rs alone on this
machine: 0.03 s at 10,000 keys, 0.29 s at 1,000,000 for 1,000 key deltas, 0.38 s for
50,000). Each batch now appends its step to `gold/_deltas` (a few milliseconds whatever
gold's size), and a fold in the background MERGEs what accumulated into `service_stats`
when at most a tenth of the time has gone to folding (`gold/fold.py`,
`LAKECDC_GOLD_FOLD_SHARE`): the cheaper a fold, the more often. Neither the batches nor the
dashboard, which takes each step at once (`gold.push.push_ahead`), wait for a fold."""

# Per target: (text when met, text when missed), filled with the same values as the page.
ANALYSIS = {
    "ship_recvlogical": (
        """**Shipper vs `pg_recvlogical` (met, ${recv_ratio}×).** `pg_recvlogical` took
${recv_s} s for the backlog's ${peek_rows} rows, the shipper ${ship_s} s.""",
        """**Shipper vs `pg_recvlogical` (${recv_ratio}×, target 1.2×).** `pg_recvlogical`
took ${recv_s} s for the backlog's ${peek_rows} rows, the shipper ${ship_s} s into bronze.
Where each one's time goes is measured in docs/bronze.md, "Against `pg_recvlogical`": the
SQL peek decodes its whole window before it sends the first row, so the server's decode
(about three quarters of `pg_recvlogical`'s time) overlaps none of the shipper's work
(reading the rows, the Parquet encode, the commit); the replication protocol would stream
as the server decodes, but its walsender alone costs the server as much as
`pg_recvlogical` takes in all, and through psycopg merely receiving the rows took
${repl_s} s here, ${repl_cpu} CPU seconds of the reading thread, before any of the
shipper's work (docs/bronze.md, "The replication protocol through psycopg"). With every
client cost overlapped, the peek's ceiling is about 1.1× on two cores; a read-ahead copy
of the slot measured 0.92-0.93× and is not built."""),
    "ship_ratio": (
        "**Shipper vs raw decode (met, ${ratio}×).**",
        """**Shipper vs raw decode (${ratio}×, the moonshot 0.8×).** Raw decode ran at
${raw_rows_per_s} rows/s, the shipper at ${ship_rows_per_s} rows/s. The raw decode counts
rows in the server and sends none; the shipper pays the same decode, then the transfer of
the rows' wal2json text, their Parquet encode and bronze's commit and the slot's advance.
No client shipped with Postgres comes near: `pg_recvlogical` ran at ${recv_of_raw}× raw
decode in this run (docs/bronze.md, "Against `pg_recvlogical`")."""),
    "catch_up": (
        """**Catch-up (met, ${catch_up} changes/s).** The stream ran ${stream_rate}
changes/s on the backlog: ${stream_batches} batch(es) of ${bl_seconds} s on average (parse
+ silver's appends ${bl_silver_s} s, the gold half ${bl_gold_s} s beside the appends, of
which the MERGE ${bl_merge_s} s, ${bl_jobs} Spark jobs per batch). A batch's rows never
enter Spark: pyarrow reads its bronze files, the parse and gold's contribution lines are
Arrow, the appends and the MERGE delta-rs (docs/silver.md, "Parsing"; docs/gold.md, "The
catch-up in Arrow").""",
        """**Stream + push catch-up (${catch_up} changes/s, target 30,000).** Almost all of it
is the stream: ${stream_rate} changes/s on the backlog, ${stream_batches} batch(es) of
${bl_seconds} s on average, each parsing bronze once (parse + silver's appends
${bl_silver_s} s), with the gold half (${bl_gold_s} s, of which the MERGE ${bl_merge_s} s)
running next to silver's appends, and ${bl_jobs} Spark jobs per batch; the push
${push_rate} changes/s (it moves keys, not changes: it is not a limit). A batch's rows never
enter Spark: pyarrow reads its bronze files, the parse and gold's contribution lines are
Arrow, the appends and the MERGE delta-rs. *What limits the rest*, measured on 308,289
rows, warm (docs/silver.md, "Parsing"): the parse costs about 12 core-µs a row (the JSON
read about half of it, the number quoting about a fifth) in two threads, and silver's
append 1.1-1.5 s inside the stream; everything else on the machine shares the same two
cores. What would move it further, not built: writing silver while the parse goes on
(0.3-0.5 s measured), and more cores - the parse runs in as many threads as there are
chunks."""),
    "freshness": (
        "**Freshness at 2,000 changes/s (met, p95 ${fast_p95} s).** " + _change_path("fast"),
        """**Freshness at 2,000 changes/s (p95 ${fast_p95} s at ${fast_rate} changes/s,
target 1 s).** ${saturation} """ + _change_path("fast"),
    ),
    "freshness_slow": (
        "**Freshness at 200 changes/s (met, p95 ${slow_p95} s).** " + _change_path("slow"),
        """**Freshness at 200 changes/s (p95 ${slow_p95} s at ${slow_rate} changes/s, target
0.5 s).** """ + _change_path("slow") + """ What is left is the shipper's own cycle (its
poll interval, the peek's decode from the slot's restart point, the bronze commit, the
dashboard's transaction) on two cores shared with Postgres, the traffic, the stream's
batches and the mirrors' query."""),
    "gold_growth": (
        """**The gold half as gold grows (met, ${batch_growth}× over ${key_growth}× keys).**
""" + _GOLD_FOLD,
        """**The gold half as gold grows (${batch_growth}× over ${key_growth}× keys, target
1.5×).** """ + _GOLD_FOLD + """ What is left of the growth is not gold's MERGE: the
step's push into a dashboard table that has 1,000,000 rows too (an upsert of 800 keys, alone
on this machine: 7 ms at 10,000 rows, 14 ms at 1,000,000), the append of larger batches,
and the folds, whose MERGE takes both cores for about a second every several seconds. The
ratio also starts lower than before: with folds in the background the 10,000-key batches
no longer fold in the batch (median 0.052 → 0.037 s, 2026-11-27 → 11-28), while the
1,000,000-key ones stayed at about 0.06 s (mean 0.086 → 0.066 s)."""),
    "big_gold_fresh": (
        """**Freshness with ${keys_last} gold keys at 2,000 changes/s (met, p95
${big_p95} s).**""",
        """**Freshness with ${keys_last} gold keys at 2,000 changes/s (p95 ${big_p95} s at
${big_rate} changes/s, target 5 s).** The dashboard takes each shipper batch's step
ahead of the stream (`gold.ahead`), and gold folds beside the batches, so gold's size
reaches it only through the upsert into a dashboard as large and the cores a fold takes: ${big_batches} batches of ${big_seconds} s on average, the gold
half ${big_median} s median and ${big_mean} s mean, ${big_folds} folds; p50 ${big_p50} s,
max ${big_pmax} s; load ${big_load}."""),
    "big_gold_fresh_slow": (
        """**Freshness with ${keys_last} gold keys at 200 changes/s (met, p95
${bigslow_p95} s).**""",
        """**Freshness with ${keys_last} gold keys at 200 changes/s (p95 ${bigslow_p95} s at
${bigslow_rate} changes/s, target 3 s).** As at 2,000 changes/s, the dashboard takes each
shipper batch's step ahead of the stream; the stream's: ${bigslow_batches} batches of
${bigslow_seconds} s on average, the gold half ${bigslow_median} s median and
${bigslow_mean} s mean, ${bigslow_folds} folds; p50 ${bigslow_p50} s, max
${bigslow_pmax} s; load ${bigslow_load}."""),
    "rss": (
        """**Shipper memory (met, ${bigtx_rss} MB through ${bigtx_rows} rows in one
transaction).** *Fixed since the first report* (659 MB): delta-rs's `write_deltalake` kept a
few hundred MB more than its input in memory through a write (+300-430 MB for this
transaction, not reduced by smaller row groups or files), so bronze's Parquet files are now
written by pyarrow one row group (16,384 rows) at a time straight to storage and committed
by delta-rs with their statistics in one log entry (`bronze.table.DataFiles`); peek rows
are converted in 2 MB chunks (was 16 MB), and the transaction still open spills to an
unlinked temporary file past `--memory-budget-mb`. About 190 MB is the process before any
data (Python with pyarrow, deltalake and psycopg).""",
        """**Shipper memory (${bigtx_rss} MB through ${bigtx_rows} rows in one transaction,
target 512 MB).** About 190 MB is the process before any data (Python with pyarrow,
deltalake and psycopg). Bronze's Parquet files are written by pyarrow one row group (16,384
rows) at a time and committed by delta-rs; peek rows are converted in 2 MB chunks and the
open transaction spills past `--memory-budget-mb`. What grew past the target in this run is
not profiled here: re-measure with `python -m bench --big-tx-rows 1000000` and sample
`/proc/<pid>/status` during the write."""),
    "catch_up_e2e": (
        """**End-to-end catch-up (met, ${warm_rate} changes/s warm).** Cold, the same
backlog was exact on the dashboard after ${cold_s} s (the stream's first batch at
${cold_start_s} s); a very first run after ${first_s} s.""",
        """**End-to-end catch-up (${warm_rate} changes/s warm, target 50,000).** In a
catch-up the dashboard follows a thawed `lakecdc run`'s shipper batch by batch, the stream
and the mirrors held meanwhile (docs/gold.md, "Ahead of the stream"): Postgres's decoder,
the shipper and the parse and push of each batch's step share the 2 cores (alone, the
shipper ran at ${ship_changes_per_s} changes/s in the backlog section). Until the
dashboard was exact they used ${warm_cpu} CPU seconds.
Gold was exact ${warm_gold_s} s after the thaw. Cold, started again on the backlog: exact
on the dashboard after ${cold_s} s, the stream's first batch at ${cold_start_s} s; a very
first run: ${first_s} s."""),
    "mirror_catch_up": (
        """**Mirrors' catch-up (met, ${mirror_rate} changes/s).** The fold is Arrow and numpy
on the driver, only the columns whose mirror type is not text are typed in Spark, and
delta-rs MERGEs; docs/silver.md, "How fresh", has the parts of a catch-up batch.""",
        """**Mirrors' catch-up (${mirror_rate} changes/s, target 50,000).** A catch-up batch's
parts (reading it, finding each table's changes, the fold, Spark's typing, the MERGEs) are
timed in docs/silver.md, "How fresh"; the mirrors' first big batch in a JVM pays its JIT's
warm-up (about 2.5 s of this backlog's batch, against the same batch repeated)."""),
    "big_table_load": (
        """**A big table's initial rows (met, ${big_of_copy}× COPY's speed).** Loaded
straight into the mirror by key-range COPY chunks, parsed by Arrow (docs/source-tables.md).""",
        """**A big table's initial rows (${big_of_copy}× COPY's speed, target 0.3×).** The
rows are loaded straight into the mirror (docs/source-tables.md): one COPY per
100,000-row chunk, parsed by Arrow and appended, the next chunk read while one is written,
on the two cores that also run Postgres, the traffic and `lakecdc run`. COPY hands the same
rows to one client in ${big_copy_s} s."""),
    "big_mirror_fresh": (
        """**The big table's mirror as fresh as gold (met, p95 ${big_kept_p95} s).** Its
batches go to its tail, folded into the table in the background (docs/silver.md, "Big
mirrors"); the probe reads the table with its tail laid over it.""",
        """**The big table's mirror (p95 ${big_kept_p95} s, target 10 s).** Its batches go
to its tail (docs/silver.md, "Big mirrors"); its folds (${big_kept_folds}) rewrite the
table in the background, on the two cores every batch shares."""),
    "big_mirror_growth": (
        """**A mirrors' batch beside the big table (met, ${big_kept_growth}× from
${big_small_rows} to ${big_rows} rows).** A batch appends to the tail, whatever the
table's size; the folds' share of the time is bounded (`FOLD_SHARE`).""",
        """**A mirrors' batch beside the big table (${big_kept_growth}× from
${big_small_rows} to ${big_rows} rows, target 1.5×).** A batch appends to the tail, but
its folds, in the background, take the same two cores."""),
}


def saturation(run: dict) -> tuple[float, float]:
    """Median latency of the first and of the last quarter of a run's probes: a pipeline
    that keeps up shows about the same; one that falls behind, a growing lag."""
    lats = [lat for _, lat in run["series"]]
    if len(lats) < 8:
        return 0.0, 0.0
    q = len(lats) // 4
    first, last = sorted(lats[:q]), sorted(lats[-q:])
    return first[len(first) // 2], last[len(last) // 2]


def _saturation_text(doc: dict, values: dict) -> str:
    """How the run at 2,000 changes/s (else the first) kept up, for the freshness text."""
    run = run_at(doc, FAST_RATE) or doc["freshness"]["runs"][0]
    first, last = saturation(run)
    rate = _n(run["achieved_rate"])
    if last > 2 * max(first, 1.0) and last - first > 10:
        return Template(
            """*Throughput first*: at ${rate} changes/s the pipeline did not keep up on this
machine under this load - the median latency grew from ${lag_first} s over the first
quarter of the probes to ${lag_last} s over the last (the rising line in the plot); the
stream drained ${stream_rate} changes/s at best in section 1 - so every micro-batch is
larger than the last and the lag grows for as long as the traffic lasts. No trigger setting
changes that; only the throughput work of the catch-up target does. *Latency
second*:""").substitute(values, rate=rate, lag_first=_n(first), lag_last=_n(last))
    return Template("""The pipeline kept up with ${rate} changes/s on average (median
latency ${lag_first} s over the first quarter of the probes, ${lag_last} s over the last):
the more changes arrive per batch, the longer each batch takes, so latency and rate settle
together.""").substitute(values, rate=rate, lag_first=_n(first), lag_last=_n(last))


def analysis(doc: dict, values: dict) -> str:
    """Per target, the met or the missed text; a target this run did not measure (no
    run at its rate, e.g. ``--quick``) says so."""
    out = []
    for v in verdicts(doc):
        if v["value"] is None:
            why = ("its section did not run" if v["key"].startswith(("big_table",
                                                                        "big_mirror")) else
                   "`pg_recvlogical` was not in this run's backlog section"
                   if v["key"] == "ship_recvlogical" else
                   "the catch-up section did not run" if v["key"] == "catch_up_e2e" else
                   "no run at that rate on the largest gold measured a latency; its rates: "
                   f"{values['scale_big_rates']} changes/s" if v["key"].startswith("big_gold")
                   else "no freshness run at that rate measured a latency; this run's rates: "
                   f"{values['fresh_rates']} changes/s")
            out.append(f"**{v['target'][0].upper()}{v['target'][1:]}: not measured** "
                       f"({why}).")
        else:
            out.append(Template(ANALYSIS[v["key"]][0 if v["met"] else 1]).substitute(values))
    return "\n\n".join(out)


def write(doc: dict, out: Path, report_path: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    made = {"img_throughput": plot_throughput(doc, out / "throughput.png"),
            "img_freshness": plot_freshness(doc, out / "freshness.png"),
            "img_gold": plot_gold_scaling(doc, out / "gold_scaling.png")}
    images = {k: _relative(v, report_path.parent) for k, v in made.items()}
    images["results_json"] = _relative(out / "results.json", report_path.parent)
    template = Template(Path(__file__).with_name("report.md.tmpl").read_text())
    values = _values(doc, images)
    values["saturation"] = _saturation_text(doc, values)
    values["analysis"] = analysis(doc, values)
    report_path.write_text(template.substitute(values))
    return report_path


def _relative(path: Path, start: Path) -> str:
    import os
    return os.path.relpath(path.resolve(), start.resolve())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    results = Path(argv[0])
    report_path = Path(argv[1]) if len(argv) > 1 else results.parent / "benchmarks.md"
    write(json.loads(results.read_text()), results.parent, report_path)
    print(report_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
