"""``lakecdc demo``: the whole pipeline on embedded defaults, end to end, in about a minute.

Starts its own throw-away Postgres with wal2json, creates the Notify-like schema, runs
``setup``, generates traffic (inserts, status transitions, archival moves to history, hard
deletes, rolled-back transactions) while the continuous pipeline runs, then drains every
layer and prints gold next to a direct ``GROUP BY`` on the source. Writes a summary and a
PNG (counts by status per service, freshness over the run) to ``--out``. Everything it
started is stopped again, also on Ctrl-C.
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from core.config import Config
from core.errors import DriftFound
from core.features import open_table
from core.layout import GOLD, mirror_path
from infra.localpg import LocalPostgres
from pipelines.demo.plot import plot
from pipelines.demo.traffic import SERVICE_NAMES, SERVICES, TEMPLATES, FreshnessProbe, Traffic
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from pipelines.source.truth import source_counts
from silver.mirrors.tail import read_mirror

SCHEMA = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "source_schema.sql"
REFERENCE = SCHEMA.with_name("demo_reference_schema.sql")
# Captured beside the counted tables and mirrored (docs/silver.md, "Mirrors").
REFERENCE_TABLES = ("public.services", "public.templates")
NAMES_QUERY = Path(__file__).resolve().parents[2] / "sql" / "examples" / "service_names.sql"
STEP_INSERTS = 30        # notifications per traffic step (a step every 0.1 s)
WARM_STEPS = 50          # the untimed warm-up round of real traffic
SPARK_LOG = "spark.log"  # Spark's own output, beside the summary


def _say(text: str) -> None:
    print(text, flush=True)


def gold_counts(path: str) -> dict[tuple, int]:
    rows = open_table(path).to_pyarrow_table(
        columns=["service_id", "template_id", "notification_type", "notification_status",
                 "count"]).to_pylist()
    return {(r["service_id"], r["template_id"], r["notification_type"],
             r["notification_status"]): r["count"] for r in rows if r["count"]}


def dashboard_counts(dsn: str) -> dict[tuple, int]:
    with psycopg.connect(dsn) as conn:
        return {tuple(r[:4]): r[4] for r in conn.execute(
            "SELECT service_id, template_id, notification_type, notification_status, count "
            "FROM service_stats WHERE count <> 0")}


def _diff(a: dict, b: dict) -> int:
    return sum(1 for k in set(a) | set(b) if a.get(k, 0) != b.get(k, 0))


def run_demo(seconds: float, out_dir: str, stop: threading.Event,
             log_level: str = "FATAL") -> None:
    """The demo, its output in ``out_dir``; Spark's own lines (Ivy, log4j) in its
    ``SPARK_LOG``, not on the terminal."""
    from core.spark import get_or_create

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    spark_log = out / SPARK_LOG
    shutil.rmtree(out / "lakehouse", ignore_errors=True)
    pg = LocalPostgres(Path(tempfile.mkdtemp(prefix="lakecdc-demo-pg-")))
    traffic_stop, pipeline_stop = threading.Event(), threading.Event()
    pipeline = None
    threads: list[threading.Thread] = []
    try:
        dsn = _start_source(pg)
        config = _set_up(dsn, out)
        _say("starting Spark (the first start downloads the Delta jars; Spark's own output "
             f"goes to {spark_log}) and creating the lakehouse tables ...")
        pipeline = Pipeline(config, spark_factory=lambda: get_or_create(
            log_level=log_level, output=spark_log))
        traffic = _warm_up(pipeline, dsn)

        # Freshness as a dashboard user sees it: a notification of a never-seen service
        # committed every 0.5 s, timed until its row shows on the dashboard.
        probe = FreshnessProbe(dsn=dsn, dashboard_dsn=dsn, tag=uuid.uuid4().hex)
        pipe, sources, watcher = _start_threads(pipeline, traffic, probe, pipeline_stop,
                                                traffic_stop, threads)
        _say(f"traffic and the continuous pipeline run for {seconds:.0f}s "
             "(slot → bronze → silver → gold → dashboard) ...")
        started = time.monotonic()
        while time.monotonic() - started < seconds and not stop.is_set() and pipe.is_alive():
            stop.wait(0.5)
        traffic_stop.set()
        for thread in sources:
            thread.join()
        watcher.join(timeout=0 if stop.is_set() else 150)    # every probe seen, or given up
        pipeline_stop.set()
        pipe.join(timeout=180)
        origin = min(probe.committed.values(), default=0.0)
        freshness = [(round(t - origin, 1), lag) for t, lag in probe.latencies()]
        if stop.is_set():
            _say("interrupted: stopping")
            return
        with psycopg.connect(dsn, autocommit=True) as conn:    # a change the mirror follows
            conn.execute("UPDATE services SET name = name || ' (renamed)' WHERE id = %s",
                         [SERVICES[-1]])
        _say("traffic stopped; draining every layer (lakecdc run --once) ...")
        report = pipeline.run_once()
        _summarise(config, dsn, traffic, report, freshness, out, pipeline.spark)
    finally:
        traffic_stop.set()
        pipeline_stop.set()
        for thread in threads:
            thread.join(timeout=60)
        if pipeline is not None and pipeline._spark is not None:
            pipeline._spark.stop()
        pg.destroy()


def _start_source(pg: LocalPostgres) -> str:
    """Start ``pg`` with the demo's database, its schema and reference rows; returns its
    DSN."""
    _say(f"starting a throw-away Postgres 15 with wal2json in {pg.base_dir} ...")
    pg.start()
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE notify")
    dsn = pg.dsn("notify")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA.read_text())
        conn.execute(REFERENCE.read_text())
        _reference_rows(conn)       # before setup: the mirrors start from these rows
    return dsn


def _set_up(dsn: str, out: Path) -> Config:
    """The demo's configuration, its lakehouse in ``out``, after ``lakecdc setup`` with it."""
    base = Config.load(env={}, source_dsn=dsn, lakehouse=str(out / "lakehouse"),
                       slot="lakecdc_demo")
    config = base.with_(tables=(*base.tables, *REFERENCE_TABLES))
    for line in setup(config).actions:
        _say(f"setup: {line}")
    return config


def _warm_up(pipeline: Pipeline, dsn: str) -> Traffic:
    """Run the pipeline once, then once more after a round of real traffic; returns the
    traffic generator."""
    pipeline.run_once()   # warm up: tables, JVM, first plans - before the clock runs
    traffic = Traffic(dsn, seed=42)
    # Then a round of real traffic through every layer, untimed too: the freshness
    # below is the running pipeline's, not the first batches of a cold JVM's.
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(WARM_STEPS):
            traffic.step(conn, STEP_INSERTS)
    pipeline.run_once()
    return traffic


def _start_threads(pipeline: Pipeline, traffic: Traffic, probe: FreshnessProbe,
                   pipeline_stop: threading.Event, traffic_stop: threading.Event,
                   threads: list[threading.Thread]
                   ) -> tuple[threading.Thread, list[threading.Thread], threading.Thread]:
    """Start the continuous pipeline, then, once its stream is up, the traffic, the probe
    and its watcher; each is added to ``threads`` as it starts. Returns (the pipeline's
    thread, the traffic's and the probe's, the watcher's)."""
    pipe = threading.Thread(target=pipeline.run_continuous, args=(pipeline_stop,),
                            daemon=True)
    sources = [threading.Thread(target=traffic.run, args=(traffic_stop, 0.1, STEP_INSERTS),
                                daemon=True),
               threading.Thread(target=probe.run, args=(traffic_stop,), daemon=True)]
    watcher = threading.Thread(target=probe.watch, args=(traffic_stop,), daemon=True)
    pipe.start()
    threads.append(pipe)
    while pipe.is_alive() and not pipeline.started.wait(0.5):
        pass                         # the stream is up: the clock starts with traffic
    for thread in (*sources, watcher):
        thread.start()
        threads.append(thread)
    return pipe, sources, watcher


def _reference_rows(conn: psycopg.Connection) -> None:
    for service, name in SERVICE_NAMES.items():
        conn.execute("INSERT INTO services (id, name) VALUES (%s, %s)", [service, name])
    for i, template in enumerate(TEMPLATES):
        conn.execute("INSERT INTO templates (id, service_id, name, content) "
                     "VALUES (%s, %s, %s, %s)",
                     [template, SERVICES[i % len(SERVICES)], f"template {i + 1}",
                      "Dear ((name)), " + "your request is being processed. " * 100])


def mirror_rows(config: Config, table: str, key: str) -> dict:
    """A mirror's rows by key, read with delta-rs (its lakecdc columns left out; a tail
    laid over its table, ``silver.mirrors.tail``)."""
    rows = read_mirror(mirror_path(config.lakehouse, table)).to_pylist()
    return {r[key]: {k: v for k, v in r.items() if not k.startswith("_lakecdc")}
            for r in rows}


def source_rows(dsn: str, table: str, key: str) -> dict:
    with psycopg.connect(dsn) as conn:
        cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(
            sql.Identifier(*table.split("."))))
        names = [c.name for c in cursor.description]
        rows = [dict(zip(names, r)) for r in cursor]
    return {str(r[key]): {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in r.items()}
            for r in rows}


def _summarise(config: Config, dsn: str, traffic: Traffic, report, freshness, out: Path,
               spark=None):
    with psycopg.connect(dsn) as conn:
        truth = source_counts(conn, config.counted)
        live, archived = conn.execute(
            "SELECT (SELECT count(*) FROM notifications), "
            "(SELECT count(*) FROM notification_history)").fetchone()
    gold = gold_counts(config.table_path(GOLD))
    dashboard = dashboard_counts(dsn)
    # Service names come from the mirror of the source's services table.
    names = {k: r["name"] for k, r in mirror_rows(config, "public.services", "id").items()}
    mirrors = {t: (mirror_rows(config, t, "id"), source_rows(dsn, t, "id"))
               for t in REFERENCE_TABLES}
    by_status: dict[tuple[str, str], int] = {}
    for (service, _t, _type, status), n in dashboard.items():
        label = names.get(service, "(probes)")
        by_status[(label, status)] = by_status.get((label, status), 0) + n
    statuses = sorted({s for _, s in by_status})
    width = max([len("service"), *(len(s) for s, _ in by_status)]) + 2
    lines = [
        f"lakecdc demo - {traffic.steps} traffic steps through slot → bronze → silver → "
        "gold → dashboard",
        f"source: {live + archived:,} notifications ({live:,} in notifications, "
        f"{archived:,} archived to notification_history)",
        "",
        f"{'service':<{width}}" + "".join(f"{s[:12]:>13}" for s in statuses) + f"{'total':>9}",
    ]
    for service in sorted({s for s, _ in by_status}):
        row = [by_status.get((service, s), 0) for s in statuses]
        lines.append(f"{service:<{width}}" + "".join(f"{n:>13,}" for n in row)
                     + f"{sum(row):>9,}")
    gold_diff, dash_diff = _diff(gold, truth), _diff(dashboard, gold)
    mirror_diff = {t: _diff(m, s) for t, (m, s) in mirrors.items()}
    lines += [
        "",
        f"gold      vs source GROUP BY: {'EXACT' if not gold_diff else f'{gold_diff} keys DIFFER'}"
        f" ({len(truth)} keys, {sum(truth.values()):,} notifications)",
        f"dashboard vs gold           : {'EXACT' if not dash_diff else f'{dash_diff} keys DIFFER'}",
        *[f"mirror {t:<15} vs source rows: "
          f"{'EXACT' if not d else f'{d} rows DIFFER'} ({len(mirrors[t][1])} rows, every column)"
          for t, d in mirror_diff.items()],
    ]
    if spark is not None:
        from pipelines.observe.query import (
            read_query,
            register_tables,
            render,
            run_query,
            table_paths,
        )

        register_tables(spark, table_paths(config, spark))
        lines += ["", f"{NAMES_QUERY.relative_to(NAMES_QUERY.parents[2])} (gold joined with "
                  "the services mirror):",
                  render(run_query(spark, read_query(str(NAMES_QUERY))))]
    if freshness:
        lags = sorted(v for _, v in freshness)
        lines.append(f"freshness, source commit → row on the dashboard ({len(lags)} probes "
                     f"during traffic): p50 {statistics.median(lags):.1f}s, "
                     f"p95 {lags[int(0.95 * (len(lags) - 1))]:.1f}s, max {lags[-1]:.1f}s")
    picture = plot(by_status, freshness, out / "service_stats.png",
                   f"lakecdc demo {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC - "
                   f"gold {'=' if not gold_diff else '≠'} source")
    lines.append(f"picture: {picture}")
    lines.append(f"lakehouse: {out / 'lakehouse'} (query it: see README, 'Query gold')")
    lines.append(f"Spark's own output (Ivy, log4j): {out / SPARK_LOG}")
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    _say("")
    _say(text)
    if gold_diff or dash_diff or any(mirror_diff.values()):
        raise DriftFound(f"gold differs from the source on {gold_diff} keys, the dashboard "
                         f"from gold on {dash_diff}, the mirrors on {mirror_diff}; see "
                         f"{out / 'summary.txt'}")
