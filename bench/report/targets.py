"""The benchmark's targets and their verdicts: ``TARGETS``, the freshness targets' rates,
``verdicts``, ``all_exact`` and the console ``summary``."""

from __future__ import annotations

from bench.report.formatting import _n

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


def verdicts(doc: dict) -> list[dict]:
    """Per target: its value (None when this run did not measure it: then not met)."""
    out = []
    for key, text, value, limit, met, unit in TARGETS:
        v = value(doc)
        out.append({"key": key, "target": text, "value": v, "unit": unit,
                    "met": v is not None and bool(met(v, limit))})
    return out


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
