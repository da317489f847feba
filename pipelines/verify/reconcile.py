"""``lakecdc verify [--json] [--repair] [--timeout S]``: gold and the dashboard against the
source, compared at one consistent LSN. Exit 0 exact, 1 drift (with a diff), 2 a problem a
person must fix (one sentence). The scheduled reconciliation job of the bundle.

One verification (``verify_once``) takes the five steps of docs/verify.md, "How it works":
(1) a consistent point ``P`` of the source (temporary slot, exported snapshot), a marker
committed after every transaction of it, and the truth counted inside it; (2) gold and the
dashboard past the marker: verify drives the pipeline itself when nothing holds its locks,
else waits for the running one up to ``--timeout``; (3) gold and the dashboard *as of P*:
each minus the silver deltas after ``P`` up to its own watermark (``gold.asof``); (4) the
truth plus the history rows purged in ``[floor, P)``; (5) compare, exit 0 or 1. "After the
point" is ``commit_lsn >= P`` (``_from``; docs/verify.md, "Where the cut is").

``--repair``: on drift, ``pipelines.backfill.rebuild.rebuild_and_push`` under the gold lock (one
sentence while a pipeline runs), then a whole new verification.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Callable, ContextManager

import click
import psycopg
from psycopg import sql

from bronze import slot as slots
from bronze.source import check_source
from bronze.spark_table import bronze_table
from bronze.table import numbers_as_text
from core.captured import DIMS
from core.engine.choose import start_engine
from core.errors import DriftFound, UserError
from core.layout import GOLD, SILVER
from core.locks import gold_lock_name, is_held, ship_lock_name
from core.lsn import fmt
from core.postgres import connect
from core.storage import Lakehouse, gold_key
from gold.push import PROGRESS_TABLE, STATS_TABLE
from pipelines.run.markers import mirrors_position
from pipelines.source.consistent import consistent_point, count_at, emit_marker
from pipelines.source.mirror_baseline import Sampling, write_baselines
from pipelines.verify.mirror_check import check_mirror, scratch_root, tables_to_verify
from pipelines.verify.report import LayerCounts, Verdict, document, drift_sentence, nonzero, render

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from core.config import Config
    from core.engine.api import Engine
    from pipelines.run.pipeline import Locations

log = logging.getLogger("lakecdc.verify")

POLL_S = 1.0


def run_verify(config: Config, where: Locations, *, start_spark: Callable[[], SparkSession],
               drive: Callable[[], object], gold_lock: Callable[[], ContextManager],
               as_json: bool = False, repair: bool = False,
               timeout_s: float = 600.0, sampling: Sampling | None = Sampling()) -> Verdict:
    """The command: verify, print, and on drift repair (``repair``) or raise ``DriftFound``.

    ``start_spark()`` gives the session (started only once the source is counted), ``drive()``
    runs every stage once (``run --once``), ``gold_lock()`` holds the gold writer lock
    around a repair. ``sampling``: a big mirrored table is compared by its every key and a
    sample of its rows (``check_mirror``); None: every mirror whole."""
    first = verify_once(config, where, start_spark, drive, timeout_s, sampling)
    if first.exact or not repair or first.counts_exact:     # a mirror has no repair yet
        doc = {**document(first), **({"repaired": False} if repair else {})}
        click.echo(json.dumps(doc, indent=2) if as_json else render(first))
        if not first.exact:
            raise DriftFound(drift_sentence(first))
        return first
    if not as_json:
        click.echo(render(first))
        click.echo("\nrepair: rebuilding gold from a fresh baseline and replacing the "
                   "dashboard")
    from pipelines.backfill import rebuild  # only a repair needs it

    report = rebuild.rebuild_and_push(start_spark(), config, where, gold_lock)
    if not as_json:
        click.echo(f"repair: {report.summary()}\n")
    second = verify_once(config, where, start_spark, drive, timeout_s, sampling)
    if as_json:
        click.echo(json.dumps({**document(second), "repaired": second.exact,
                               "before": document(first)}, indent=2))
    else:
        click.echo(render(second))
        if second.exact:
            click.echo("repaired: gold and the dashboard are exact again")
    if not second.exact:
        raise DriftFound("still after the rebuild: " + drift_sentence(second))
    return second


def verify_once(config: Config, where: Locations, start_spark: Callable[[], SparkSession],
                drive: Callable[[], object], timeout_s: float = 600.0,
                sampling: Sampling | None = None) -> Verdict:
    """Steps 1-5 of the module docstring; returns the verdict (does not print)."""
    source = config.require_source()
    _preflight(config)
    options = Lakehouse.from_config(config).delta_rs_options()
    # Every read of the lakehouse below is the engine's; where only Spark reaches storage,
    # its session starts here, before the source is counted, not after (none on delta-rs).
    engine = start_engine(config, start_spark)
    mirrored = tables_to_verify(config, options, engine)
    # The source's rows are read as the shipper's wal2json prints them (recorded in bronze).
    text = numbers_as_text(bronze_table(config, options, engine=engine), config.slot)

    with consistent_point(source) as point:
        # Emitted first so a running pipeline carries it along while the count runs.
        marker = emit_marker(source, "verify")
        log.info("verify: consistent point %s, marker %s; counting the source",
                 fmt(point.lsn), fmt(marker))
        truth_src = count_at(source, point, config.counted, "verify: counting source rows")
        read = {} if not mirrored else write_baselines(   # the mirrored tables at the point
            source, point.snapshot_name, mirrored, scratch_root(config.lakehouse), point.lsn,
            options, engine=engine, numbers_as_text=text, sampling=sampling)
    # The temporary slot is gone: nothing of verify pins WAL from here on.

    layers = ("gold", "dashboard", *(("mirrors",) if mirrored else ()))
    how = _past_marker(config, where, drive, marker, timeout_s, layers, engine)
    spark = start_spark()
    from gold import asof

    state = asof.gold_state(spark, where.gold)
    if state is None or state.watermark is None or state.watermark < marker:
        raise UserError(_went_back("gold", state.watermark if state else None, marker))
    if state.floor > point.lsn:
        raise UserError(f"gold was rebuilt from a baseline at LSN {fmt(state.floor)}, after "
                        f"the verification point {fmt(point.lsn)} (a rebuild ran meanwhile); "
                        "run `lakecdc verify` again.")
    dash_now, dash_version, dash_lsn = read_dashboard(config.dashboard, gold_key(where.gold))
    if dash_lsn is None or dash_lsn < marker:
        raise UserError(_went_back("the dashboard", dash_lsn, marker))
    silver = where.silver.silver_path
    _silver_holds(spark, silver, max(state.watermark, dash_lsn), timeout_s)

    gold_now = spark.read.format("delta").option("versionAsOf", state.version).load(where.gold)
    gold_at = asof.subtract(asof.counts_of(gold_now),
                            asof.net_deltas(_from(spark, silver, point.lsn, state.watermark),
                                            config.counted))
    dash_at = asof.subtract(dash_now, asof.net_deltas(_from(spark, silver, point.lsn,
                                                            dash_lsn), config.counted))

    mirrors = []
    for i, t in enumerate(mirrored, 1):              # a line each: minutes on big tables
        log.info("verify: comparing the mirror of %s with the source (%d of %d)", t, i,
                 len(mirrored))
        mirrors.append(check_mirror(spark, config, t, point.lsn, silver, read[t].lost,
                                    sampled=read[t].keys is not None))
    purged = _history_purges(spark, silver, state.floor, point.lsn, config.counted)
    truth = Counter(truth_src)
    truth.update(purged)
    return Verdict(point.lsn, marker, nonzero(truth), sum(purged.values()), (
        LayerCounts("gold", nonzero(gold_at), {
            "version": state.version, "watermark": fmt(state.watermark),
            "floor": fmt(state.floor)}),
        LayerCounts("dashboard", nonzero(dash_at), {
            "gold_version": dash_version, "watermark": fmt(dash_lsn)})), how, tuple(mirrors))


# --- step 1: before anything is created ------------------------------------------------

def _preflight(config: Config) -> None:
    """Cheap checks with one-sentence errors before a slot is created or Spark started."""
    with connect(config.require_source()) as conn:
        check_source(conn, config.tables)
        if slots.slot_state(conn, config.slot) is None:
            raise UserError(f"the replication slot {config.slot} does not exist, so there is "
                            "no pipeline to verify: run `lakecdc setup` (or "
                            "`lakecdc setup --rebaseline` after a lost slot).")
    with connect(config.dashboard, what="dashboard") as conn:
        if conn.execute("SELECT to_regclass(%s)", [STATS_TABLE]).fetchone()[0] is None:
            raise UserError(f"the dashboard database has no {STATS_TABLE} table: run "
                            "`lakecdc setup`.")


# --- step 2: gold and the dashboard past the marker -------------------------------------

def _past_marker(config: Config, where: Locations, drive: Callable[[], object], marker: int,
                 timeout_s: float, layers: tuple[str, ...], engine: Engine) -> str:
    """Get gold and the dashboard (and ``layers``) to include the marker; returns how (for
    the report); the layers' positions are read through ``engine``.

    While another process holds the shipper or the gold lock, a pipeline is running: wait
    for it. When neither is held (at the start, or because the running pipeline stopped
    while we waited), run every stage once here - a stopped gold then says why itself.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    ship_lock, gold_lock = ship_lock_name(config.slot), gold_lock_name(where.gold)
    with connect(config.require_source()) as src, \
            connect(config.dashboard, what="dashboard") as dash:
        waited = False
        while True:
            if not is_held(src, ship_lock, any_role=True) and \
                    not is_held(dash, gold_lock, any_role=True):
                log.info("verify: no pipeline running; running every stage once "
                         "(run --once)")
                drive()
                positions = _positions(config, where, dash, (*_LAYERS, *layers), engine)
                if not _passed(positions, marker, layers):
                    raise UserError(_stuck(marker, "after `run --once`", positions,
                                           waited=False))
                return (f"pipeline driven past the marker (run --once, "
                        f"{time.monotonic() - started:.1f}s)")
            if not waited:
                log.info("verify: a pipeline is running; waiting up to %.0fs for gold and "
                         "the dashboard to pass the marker %s", timeout_s, fmt(marker))
                waited = True
            positions = _positions(config, where, dash, layers, engine)
            if _passed(positions, marker, layers):
                return (f"a running pipeline passed the marker in "
                        f"{time.monotonic() - started:.1f}s")
            if time.monotonic() >= deadline:
                raise UserError(_stuck(marker, f"after waiting {timeout_s:.0f}s",
                                       _positions(config, where, dash, (*_LAYERS, *layers),
                                                  engine)))
            time.sleep(POLL_S)


def _passed(positions: dict, marker: int, layers: tuple[str, ...]) -> bool:
    return all((positions.get(layer) or 0) >= marker for layer in layers)


_LAYERS = ("bronze", "silver", "gold", "dashboard")


def _positions(config: Config, where: Locations, dashboard: psycopg.Connection,
               layers: tuple[str, ...], engine: Engine) -> dict:
    """Source commit LSN each layer includes (None: nothing yet), read through ``engine``:
    bronze's recorded progress, silver's newest commit LSN (from its per-file statistics),
    gold's recorded watermark, the dashboard's, the newest marker the mirrors passed."""
    from pipelines.observe.status import delta_layer, gold_layer

    found = {}
    if "bronze" in layers:
        bronze = bronze_table(config, engine=engine)
        progress = bronze.progress(config.slot) if bronze.exists() else None
        found["bronze"] = None if progress is None else progress.commit_lsn
    if "silver" in layers:
        found["silver"] = delta_layer("silver", config.table_path(SILVER), "commit_lsn",
                                      "commit_ts", engine=engine).commit_lsn
    if "gold" in layers:
        found["gold"] = gold_layer(config.table_path(GOLD), engine=engine).commit_lsn
    if "dashboard" in layers:
        found["dashboard"] = dashboard_position(dashboard, gold_key(where.gold))
    if "mirrors" in layers:
        found["mirrors"] = mirrors_position(config.lakehouse, engine=engine)
    return found


_WHAT_MOVES = {
    "bronze": "the shipper (`lakecdc run` or `lakecdc ship`)",
    "silver": "the stream (`lakecdc run` or `lakecdc stream`)",
    "gold": "the stream (`lakecdc run` or `lakecdc stream`; a stopped gold logs why)",
    "dashboard": "the push (`lakecdc run` or `lakecdc push`)",
    "mirrors": "the mirrors' query (`lakecdc run` or `lakecdc mirrors`)",
}


def _stuck(marker: int, when: str, positions: dict, waited: bool = True) -> str:
    """One sentence: the first layer short of the marker, where it is, what to check."""
    for layer in (*_LAYERS, "mirrors"):
        if layer not in positions:
            continue
        at = positions.get(layer)
        if at is None or at < marker:
            return (f"{when}, {layer} is at LSN {fmt(at)}, short of verify's marker at "
                    f"{fmt(marker)}: check that {_WHAT_MOVES[layer]} is running and healthy "
                    "(`lakecdc status`, its log)"
                    + (", or give it longer with --timeout." if waited else "."))
    return _went_back("gold or the dashboard", None, marker)


def _went_back(layer: str, at: int | None, marker: int) -> str:
    return (f"{layer} is at LSN {fmt(at)}, behind verify's marker at {fmt(marker)} although "
            "it had passed it: it was replaced meanwhile (a rebuild?); run `lakecdc verify` "
            "again.")


# --- step 3: the dashboard -------------------------------------------------------------

def dashboard_position(conn: psycopg.Connection, key: str) -> int | None:
    """The source commit LSN the dashboard's counts are exact as of (None: no push yet)."""
    row = conn.execute(sql.SQL("SELECT source_commit_lsn FROM {} WHERE gold_table = %s "
                               "AND gold_version >= 0").format(
        sql.Identifier(PROGRESS_TABLE)), [key]).fetchone()
    return None if row is None else row[0]


def read_dashboard(dsn: str, key: str) -> tuple[dict, int | None, int | None]:
    """(counts, pushed gold version, source_commit_lsn) of one REPEATABLE READ transaction:
    the counts are exactly those the progress row describes (the push writes both in one
    transaction)."""
    with connect(dsn, what="dashboard") as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            progress = conn.execute(sql.SQL(
                "SELECT gold_version, source_commit_lsn FROM {} WHERE gold_table = %s").format(
                sql.Identifier(PROGRESS_TABLE)), [key]).fetchone()
            dims = sql.SQL(", ").join(map(sql.Identifier, DIMS))
            counts = {tuple(r[:4]): r[4] for r in conn.execute(
                sql.SQL("SELECT {}, count FROM {}").format(dims, sql.Identifier(STATS_TABLE)))}
        except psycopg.errors.UndefinedTable:
            raise UserError("the dashboard database lacks lakecdc's tables: run "
                            "`lakecdc setup`.") from None
        finally:
            conn.rollback()
    version, lsn = progress if progress else (None, None)
    return counts, version, lsn


# --- steps 3 and 4: silver ranges ------------------------------------------------------

def _silver_holds(spark, silver_path: str, lsn: int, timeout_s: float) -> None:
    """Wait until silver holds every transaction up to ``lsn`` (``gold.asof.silver_holds``):
    a running stream commits gold and the dashboard's step beside silver's append, so for
    a moment they may hold a batch silver does not yet."""
    from gold.asof import silver_holds

    deadline = time.monotonic() + timeout_s
    while not silver_holds(spark, silver_path, lsn):
        if time.monotonic() >= deadline:
            raise UserError(f"after waiting {timeout_s:.0f}s, silver does not yet hold the "
                            f"source commits up to LSN {fmt(lsn)} that gold or the dashboard "
                            "hold: check that the stream (`lakecdc run` or `lakecdc stream`) "
                            "is running and healthy (`lakecdc status`, its log).")
        time.sleep(0.2)


def _from(spark, silver_path: str, first: int, last: int):
    """Silver rows with ``first <= commit_lsn <= last`` (not in a snapshot taken at
    ``first``; see "Where the cut is")."""
    from gold.asof import silver_range

    return silver_range(spark, silver_path, first, last)


def _history_purges(spark, silver_path: str, floor: int, point: int, tables) -> Counter:
    """History rows purged by transactions in ``[floor, point)``, per key; refuses a
    TRUNCATE of history there (its rows' dims are unknown)."""
    from gold.deltas import history_purges, history_truncates

    rows = _from(spark, silver_path, floor, point - 1)
    truncate = history_truncates(rows, tables).orderBy("commit_lsn").limit(1).collect()
    if truncate:
        raise UserError(
            f"{tables.name('history')} was truncated at commit LSN "
            f"{fmt(truncate[0].commit_lsn)}, after gold's baseline: the truncated rows still "
            "count but their services are unknown, so gold cannot be verified; rebuild it "
            "with `lakecdc backfill rebuild-gold` (it re-baselines), then verify.")
    return Counter({tuple(r[c] for c in DIMS): int(r["purged"])
                    for r in history_purges(rows, tables).collect()})
