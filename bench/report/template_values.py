"""The values the template (``bench/report.md.tmpl``) names, section by section: the
machine and its load, the backlog's decode and layers, the PoC, freshness, gold scaling,
the big transaction, the big table, catch-up and writers."""

from __future__ import annotations

from bench.report.formatting import _cpu, _ms, _n, _or_dash
from bench.report.table_rows import (
    QUERY,
    catch_up_rows,
    fresh_progress,
    fresh_rows,
    fresh_stages,
    layer_rows,
    pass_table,
    poc_rows,
    scale_rows,
    shape_rows,
    target_rows,
    writer_rows,
)
from bench.report.targets import (
    FAST_RATE,
    SLOW_RATE,
    _catch_up_runs,
    _exact,
    gold_run_at,
    largest_gold,
    run_at,
)
from bench.stages import STAGES


def _values(doc: dict, images: dict[str, str]) -> dict:
    """Every value the template names, from the result document and the images' paths."""
    return {
        **_machine_values(doc),
        **_backlog_values(doc),
        **_layer_values(doc),
        **_poc_values(doc["backlog"]),
        **_fresh_values(doc),
        **_scale_values(doc),
        **_bigtx_values(doc["big_transaction"]),
        **_big_table_values(doc.get("big_table")),
        **_catch_up_section_values(doc),
        **images,
    }


def _machine_values(doc: dict) -> dict:
    """The machine, the run's command and parameters, its load, and the targets' table."""
    b, f, g, t = (doc["backlog"], doc["freshness"], doc["gold_scaling"],
                  doc["big_transaction"])
    m = doc["machine"]
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
        "target_rows": target_rows(doc),
    }


def _backlog_values(doc: dict) -> dict:
    """The backlog's workload and its decode: raw, `pg_recvlogical`, the shipper."""
    b = doc["backlog"]
    d, w = b["decode"], b["workload"]
    return {
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
        "backlog_when": _when(doc["backlog"]),
    }


def _layer_values(doc: dict) -> dict:
    """The backlog's layers: the stream (its batches, Spark's progress), push, mirrors."""
    b = doc["backlog"]
    layers = b["layers"]
    stream = layers["stream"]
    per = stream["per_batch"]
    prog = b.get("spark_progress", {})

    def phase(name: str) -> str:
        return _n(prog.get(QUERY, {}).get(f"{name}_ms", 0) / 1000.0)

    def total(key: str) -> float:
        """A per-batch mean of the backlog's stream, summed over its batches."""
        return round(per.get(key, 0) * per.get("batches", 0), 2)

    return {
        "layer_rows": layer_rows(layers),
        "stream_batches": _n(stream["batches"]), "stream_rows": _n(stream["rows"]),
        "stream_transactions": _n(stream["transactions"]),
        "pass_rows": pass_table(doc),
        "bl_seconds": _n(per.get("seconds")), "bl_silver_s": _n(per.get("silver_s")),
        "bl_gold_s": _n(per.get("gold_s")), "bl_merge_s": _n(per.get("merge_s")),
        "bl_jobs": _n(per.get("jobs")),
        "gold_batch_s": _n(total("gold_s")), "gold_merge_s": _n(total("merge_s")),
        "push_keys": _n(layers["push"]["keys"]),
        "stream_progress": (
            f"Spark's query progress for the same run (summed `durationMs`): trigger "
            f"{phase('triggerExecution')} s, of which the `foreachBatch` (`addBatch`) "
            f"{phase('addBatch')} s and query planning {phase('queryPlanning')} s."
            if prog.get(QUERY) else
            "Spark's query progress for this `stream --once` reached Python after its timed "
            "window closed (progress events arrive asynchronously: `bench/profile.py`), so "
            "it is not in this run's results."),
        "catch_up": _n(layers["stream_push"]["changes_per_s"]),
        "mirror_rate": _n(layers["mirrors"]["changes_per_s"]),
        "stream_rate": _n(stream["changes_per_s"]),
        "push_rate": _n(layers["push"]["changes_per_s"]),
    }


def _poc_values(b: dict) -> dict:
    """lakecdc against the PoC on the backlog, and the twin database."""
    lk = b["lakecdc"]
    return {
        "poc_rows": poc_rows(b),
        "poc_rate": _n(b["poc_same_wal"]["changes_per_s"]),
        "poc_same_counts": "exact" if b["poc_same_wal"]["exact"] else
        f"off on {b['poc_same_wal']['keys_differing']} keys",
        "poc_pk_total": f"{b['poc_pk_identity']['total_error_pct']:+.1f}",
        "poc_pk_abs": f"{b['poc_pk_identity']['abs_error_pct']:.1f}",
        "twin_identical": "identical" if b["twin_identical"] else "NOT identical",
        "lakecdc_keys": _n(lk["gold"]["keys"]), "lakecdc_total": _n(lk["gold"]["expected_total"]),
    }


def _fresh_values(doc: dict) -> dict:
    """The freshness section: its runs, their stages and Spark progress, the two targets'."""
    f = doc["freshness"]
    f0 = f["runs"][0]
    return {
        "fresh_progress": fresh_progress(doc),
        "fresh_stages": fresh_stages(doc),
        "rate": _n(f0["rate"]), "fresh_seconds": _n(f["seconds"]), "fresh_rows": fresh_rows(f),
        "fresh_rates": ", ".join(_n(r["rate"]) for r in f["runs"]),
        "fresh_when": _when(f) + (" Its database was set up on its own and warmed with 2,000 "
                                  "changes, not the backlog's." if f.get("measured_at")
                                  else ""),
        **_run_values(run_at(doc, FAST_RATE), "fast"),
        **_run_values(run_at(doc, SLOW_RATE), "slow"),
    }


def _bigtx_values(t: dict) -> dict:
    """The big transaction through the shipper."""
    return {"bigtx_rows": _n(t["rows"]), "bigtx_rss": _n(t["peak_rss_mb"]),
            "bigtx_s": _n(t["ship_s"]), "bigtx_rate": _n(t["changes_per_s"])}


def _catch_up_section_values(doc: dict) -> dict:
    """The end-to-end catch-up's and the writers' sections."""
    return {
        "catch_up_rows": catch_up_rows(doc),
        "shape_rows": shape_rows(doc),
        "writer_rows": writer_rows(doc),
        **_catch_up_values(doc),
        "writers_when": _when(doc.get("writers", {})),
        "catch_up_when": _when(doc.get("catch_up", {})),
    }


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
    shapes = doc.get("catch_up", {}).get("shapes", [])
    slowest = min(shapes, key=lambda r: r["changes_per_s"], default=None)
    fastest = max(shapes, key=lambda r: r["changes_per_s"], default=None)
    return {"warm_rate": _n(warm.get("changes_per_s")),
            "shapes_range": "not measured in this run" if slowest is None else
            f"from {_n(slowest['changes_per_s'])} changes/s ({slowest['shape']['name']}) "
            f"to {_n(fastest['changes_per_s'])} ({fastest['shape']['name']})",
            "warm_gold_s": _n(warm.get("gold_seconds")),
            "warm_cpu": _cpu(warm.get("cpu_s")),
            "cold_s": _n(cold.get("seconds")),
            "cold_start_s": _n(cold.get("start_up_s")),
            "first_s": _n(runs.get("first", {}).get("seconds")),
            "ship_changes_per_s": _n(doc["backlog"]["decode"]["ship_changes_per_s"])}


def _big_table_values(big: dict | None) -> dict:
    """The big table's section (``bench.big_table``); ``-`` where it did not run."""
    if not big or "load" not in big:
        return dict.fromkeys(("big_rows", "big_table_rate", "big_copy_s", "big_copy_rate",
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
    return {"big_rows": _n(big["rows"]), "big_table_rate": _n(big["rate"]),
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
            "big_sample": _n(mirror["sample_rows"]),
            "big_differing": _n(mirror["sample_differing"]),
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
        "scale_rows": scale_rows(g),
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
