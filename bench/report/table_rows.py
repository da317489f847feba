"""The report's Markdown tables, row by row: targets, layers, gold scaling, the PoC, the
freshness runs and their stages and Spark progress, the stream's batches, catch-up and
writers."""

from __future__ import annotations

from bench.report.formatting import _cpu, _ms, _n, _or_dash, _whole
from bench.report.targets import _catch_up_runs, _exact, _measured, _verdict, verdicts
from bench.stages import STAGE_LABELS
from core.layout import STREAM_QUERY

QUERY = STREAM_QUERY                  # the one streaming query (pipelines/run/stream.py)


def target_rows(doc: dict) -> str:
    """Per target, its row: the target, the value measured, the verdict."""
    return "\n".join(
        f"| {v['target']} | {_measured(v)} | {_verdict(v, '**missed**')} |"
        for v in verdicts(doc))


def layer_rows(layers: dict) -> str:
    """The backlog's layers, one row each (seconds, changes/s)."""
    return "\n".join(
        f"| {name} | {_n(layers[key]['seconds'])} | {_n(layers[key]['changes_per_s'])} |"
        for name, key in ((("stream (bronze → silver/changes, silver/quarantine and "
                            "gold/service_stats, one query, `stream --once`)"), "stream"),
                          ("push (gold → dashboard, `push --once`)", "push"),
                          ("stream + push", "stream_push"),
                          ("mirrors (silver → a typed mirror per captured table, "
                           "`mirrors --once`; not in stream + push)", "mirrors"))
        if key in layers)


def scale_rows(scaling: dict) -> str:
    """The gold scaling section's runs, smallest gold first, one row each."""
    return "\n".join(
        f"| {_n(p['gold_keys'])} | {_n(p['services'])} | {_n(r['rate'])} "
        f"({_n(r['achieved_rate'])}) | {_n(r['per_batch'].get('batches'))} | "
        f"{_n(_whole(r['gold_half_s'].get('step_keys_median')))} | "
        f"{_ms(r['gold_half_s']['median'])} | {_ms(r['gold_half_s']['mean'])} | "
        f"{_ms(r['gold_half_s']['p90'])} | {_ms(r['gold_half_s'].get('ahead_median'))} | "
        f"{_n(r['gold_half_s']['folds'])} | "
        f"{_n(r['latency_s'].get('p50'))} / {_n(r['latency_s'].get('p95'))} / "
        f"{_n(r['latency_s'].get('max'))} | {r['load_before'][0]} → {r['load_after'][0]} | "
        f"{'exact' if _exact(r['lakecdc']) else 'DIFFERS'} |"
        for p in sorted(scaling["points"], key=lambda p: p["gold_keys"]) for r in p["runs"])


def _poc_row(backlog: dict, name: str, key: str) -> str:
    r = backlog[key]
    return (f"| {name} | {_n(r['changes_per_s'])} | {r['ticks']} | "
            f"{'exact' if r['exact'] else 'drifts'} | {r['keys_differing']} of {r['keys']} | "
            f"{r['total_error_pct']:+.2f}% | {r['abs_error_pct']:.2f}% |")


def poc_rows(backlog: dict) -> str:
    """lakecdc against the PoC on the backlog: lakecdc's row, then the PoC's two."""
    lk, layers = backlog["lakecdc"], backlog["layers"]
    lakecdc_row = (f"| lakecdc (stream + push) | "
                   f"{_n(layers['stream_push']['changes_per_s'])} | - | "
                   f"{'exact' if lk['gold']['exact'] and lk['dashboard']['exact'] else 'drifts'}"
                   f" | {lk['dashboard']['keys_differing']} of {lk['dashboard']['keys']} | "
                   f"{lk['dashboard']['total_error_pct']:+.2f}% | "
                   f"{lk['dashboard']['abs_error_pct']:.2f}% |")
    return "\n".join([lakecdc_row, _poc_row(backlog, "PoC, same WAL (lakecdc's replica "
                                                     "identity)", "poc_same_wal"),
                      _poc_row(backlog, "PoC, twin database, default replica identity "
                                        "(primary key)", "poc_pk_identity")])


def fresh_rows(freshness: dict) -> str:
    """The freshness section's runs, one row each."""
    return "\n".join(
        f"| {_n(r['rate'])} | {_n(r['achieved_rate'])} | {_n(r['written']['changes'])} | "
        f"{_n(r['probes']['committed'])} / {_n(r['probes']['seen'])} | "
        f"{_n(r['latency_s'].get('p50'))} | {_n(r['latency_s'].get('p95'))} | "
        f"{_n(r['latency_s'].get('max'))} | {_mirror_probes(r)} | "
        f"{r['load_before'][0]} → {r['load_after'][0]} | "
        f"{'exact' if _exact(r['lakecdc']) else 'NOT exact'} | {_neighbours(r)} |"
        for r in freshness["runs"])


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


def catch_up_rows(doc: dict) -> str:
    rows = [f"| {name} | {_n(r['workload']['changes'])} | {_n(r['seconds'])} | "
            f"{_n(r['changes_per_s'])} | {_or_dash(r.get('gold_seconds'))} | "
            f"{_or_dash(r.get('start_up_s'))} | "
            + f"{_cpu(r.get('cpu_s'))} | "
            + f"{r['load_before'][0]} | {'exact' if _exact(r['lakecdc']) else 'NOT exact'} |"
            for name, r in _catch_up_runs(doc).items()]
    return "\n".join(rows) or "| not measured in this run | | | | | | | | |"


def shape_rows(doc: dict) -> str:
    """The catch-up section's warm runs on backlogs of other shapes (none in an older
    result), with the CPU a change cost until the dashboard was exact."""
    rows = []
    for r in doc.get("catch_up", {}).get("shapes", []):
        shape, cpu = r["shape"], r.get("cpu_s") or {}
        per_change = cpu.get("total", 0) / max(r["workload"]["changes"], 1) * 1e6
        rows.append(f"| {shape['name']} | {_n(shape['tx_size'])} | "
                    f"{_n(r['workload']['changes'])} | {_n(r['seconds'])} | "
                    f"{_n(r['changes_per_s'])} | {_or_dash(r.get('gold_seconds'))} | "
                    f"{_cpu(cpu)} | {_n(per_change) if cpu else '-'} | "
                    f"{r['load_before'][0]} | "
                    f"{'exact' if _exact(r['lakecdc']) else 'NOT exact'} |")
    return "\n".join(rows) or "| not measured in this run | | | | | | | | | |"


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
