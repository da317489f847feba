"""The ``lakecdc`` command line (also ``python -m pipelines``).

Exit codes: 0 success, 1 verification found drift, 2 usage or configuration error (one
sentence on stderr, no traceback), 3 an unexpected failure (traceback, passwords redacted). ``main(argv)`` never raises
``SystemExit`` on success, so it can be a Databricks wheel-task entry point.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import traceback
from contextlib import contextmanager

import click

from core.config import Config
from core.errors import DriftFound, UserError, redact
from core.layout import GOLD
from core.storage import on_databricks
from pipelines.cli_tables import tables
from pipelines.logs import configure_logging
from pipelines.signals import stop_on_signals


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--source-dsn", help="Source Postgres DSN [env LAKECDC_SOURCE_DSN].")
@click.option("--dashboard-dsn", help="Dashboard Postgres DSN [env LAKECDC_DASHBOARD_DSN].")
@click.option("--lakehouse", help="Root path or URI of the Delta tables [env LAKECDC_LAKEHOUSE].")
@click.option("--slot", help="Replication slot name [env LAKECDC_SLOT].")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("--log-format", type=click.Choice(["text", "json"], case_sensitive=False),
              default="text", show_default=True, envvar="LAKECDC_LOG_FORMAT",
              help="Log lines on stderr as text or one JSON object per line "
                   "[env LAKECDC_LOG_FORMAT]. Passwords are redacted in both.")
@click.pass_context
def cli(ctx, source_dsn, dashboard_dsn, lakehouse, slot, verbose, log_format):
    """Exact CDC from Postgres into a Delta lakehouse, pushed back to Postgres dashboards."""
    configure_logging(verbose, log_format)
    ctx.obj = {"flags": {"source_dsn": source_dsn, "dashboard_dsn": dashboard_dsn,
                         "lakehouse": lakehouse, "slot": slot},
               "verbose": verbose}


def _config(ctx, **flags) -> Config:
    return Config.load(**ctx.obj["flags"], **flags)


def _metrics_option(command):
    """``--metrics-port`` of the commands that run stages: ``run`` serves every stage's
    metrics, ``ship``, ``stream`` and ``push`` their own (pipelines.metrics.STAGES).
    """
    return click.option(
        "--metrics-port", metavar="[HOST:]PORT", envvar="LAKECDC_METRICS_PORT",
        help="Serve Prometheus metrics on http://HOST:PORT/metrics while running (host "
             "127.0.0.1 unless given; 0.0.0.0:PORT opens it to the network) "
             "[env LAKECDC_METRICS_PORT].")(command)


def _shipper_safety_options(command):
    """WAL safety settings of the shipper (``ship``, and ``run``'s shipper); not given,
    ``Config`` takes them from the environment or its defaults."""
    command = click.option(
        "--reconnect-max-backoff", "reconnect_max_backoff_s", metavar="SECONDS",
        type=click.FloatRange(min=0, min_open=True),
        help="Longest wait between attempts to reconnect to the source after it went away "
             "[env LAKECDC_RECONNECT_MAX_BACKOFF; 30].")(command)
    return click.option(
        "--heartbeat-interval", "heartbeat_interval_s", metavar="SECONDS",
        type=click.FloatRange(min=0),
        help="Heartbeat transaction after this long without the slot moving while WAL is "
             "written elsewhere; 0 turns heartbeats off [env LAKECDC_HEARTBEAT_INTERVAL; "
             "30].")(command)


@contextmanager
def _stage_metrics(pipeline, listen: str | None, stage: str):
    """Serve ``stage``'s metrics while the block runs, recorded through ``pipeline``."""
    from pipelines.metrics import pipeline_exporter

    with pipeline_exporter(pipeline.config, listen, stage=stage) as pipeline.metrics:
        yield pipeline


SPARK_MISSING = ("this command runs Spark, which is not installed here: install it with "
                 "pip install 'lakecdc[spark]' (a Databricks runtime brings its own).")


def _require_spark() -> None:
    """The one check for the ``spark`` extra, before anything imports it: commands that
    need no JVM (setup, ship, push, status, metrics, backfill snapshot) never call it."""
    from importlib.util import find_spec

    if find_spec("pyspark") is None or find_spec("delta") is None:
        raise UserError(SPARK_MISSING)


def _needs_spark(command):
    """Marks a command that runs Spark: without the extra it ends in ``SPARK_MISSING``
    (exit 2) before any of its imports."""
    @functools.wraps(command)
    def checked(*args, **kwargs):
        _require_spark()
        return command(*args, **kwargs)
    return checked


def _pipeline(ctx, **flags):
    from core.spark import get_or_create
    from core.storage import Lakehouse
    from pipelines.run import Pipeline

    level = "WARN" if ctx.obj["verbose"] else "FATAL"
    config = _config(ctx, **flags)
    lakehouse = Lakehouse.from_config(config)
    return Pipeline(config, spark_factory=lambda: get_or_create(log_level=level,
                                                                lakehouse=lakehouse))


@cli.command()
@click.option("--rebaseline", is_flag=True,
              help="Drop and recreate the slot and restart bronze's position from it "
                   "(after a lost slot, failover or restore).")
@click.option("--online-not-null", is_flag=True,
              help="First make nullable identity columns NOT NULL without blocking writers "
                   "(NOT VALID check, VALIDATE, SET NOT NULL; docs/source-tables.md).")
@click.pass_context
def setup(ctx, rebaseline, online_not_null):
    """Idempotent: replica identity, slot, lakehouse tables."""
    from pipelines.setup_source import setup as run_setup

    report = run_setup(_config(ctx), rebaseline=rebaseline, online_not_null=online_not_null,
                       echo=click.echo)
    for line in report.actions:
        click.echo(line)


@cli.command()
@click.option("--once", is_flag=True, help="Drain what is committed now, then exit.")
@click.option("--max-changes", "upto_nchanges", type=int,
              help="Peek bound (upto_nchanges) per batch [200000].")
@click.option("--peek-timeout", "peek_timeout_s", type=int,
              help="Statement timeout of one peek, seconds [300].")
@click.option("--poll-interval", "poll_interval_s", type=float,
              help="Seconds between peeks unless the last one was full [0.25].")
@click.option("--chunk-mb", type=float, help="Peek rows are converted in chunks of this size [2].")
@click.option("--memory-budget-mb", type=int,
              help="Rows held in memory per batch before spilling to local disk [64].")
@_shipper_safety_options
@_metrics_option
@click.pass_context
def ship(ctx, once, metrics_port, **flags):
    """slot → bronze."""
    from bronze.ship import Shipper
    from pipelines.metrics import pipeline_exporter

    config = _config(ctx, **flags)
    with pipeline_exporter(config, metrics_port, stage="ship") as metrics:
        shipper = Shipper(config, on_batch=metrics.on_ship_batch
                          if metrics is not None else None)
        totals = shipper.run(once=once, stop=stop_on_signals())
    click.echo(f"shipped {totals.changes} changes in {totals.transactions} transactions "
               f"({totals.commits} bronze commits)")


def _once_option(help_text: str):
    return click.option("--once", is_flag=True, help=help_text)


def _wait_option(command):
    """``--wait-for-input SECONDS`` of the stages a job may start before their input
    exists (``pipelines.inputs``)."""
    return click.option(
        "--wait-for-input", "wait_s", type=click.FloatRange(min=0), default=0.0,
        metavar="SECONDS",
        help="If the input table does not exist yet (a first start), wait up to this long "
             "for it to be created [0: refuse at once].")(command)


def _await_input(ctx, stage: str, wait_s: float, stop: threading.Event) -> None:
    if wait_s > 0:
        from core.storage import Lakehouse
        from pipelines.inputs import wait_for_input

        config = _config(ctx)
        wait_for_input(config, stage, wait_s, stop=stop,
                       storage_options=Lakehouse.from_config(config).delta_rs_options())


@cli.command()
@_once_option("Process what bronze holds now (availableNow), then exit.")
@click.option("--accept-errors-upto", metavar="LSN",
              help="Treat quarantined (unparseable) silver rows up to this commit LSN as "
                   "count-neutral, after checking silver/quarantine; e.g. 0/4A3F2C0.")
@_wait_option
@_metrics_option
@click.pass_context
@_needs_spark
def stream(ctx, once, accept_errors_upto, wait_s, metrics_port):
    """bronze → silver → gold service_stats: one Spark Structured Streaming query, idempotent
    appends and MERGE of whole transactions."""
    accept = _accepted(accept_errors_upto)
    stop = stop_on_signals()
    _await_input(ctx, "stream", wait_s, stop)
    with _stage_metrics(_pipeline(ctx), metrics_port, "stream") as pipeline:
        result = pipeline.stream(once=once, stop=stop, accept_errors_upto=accept)
    click.echo(f"stream: {result.silver_rows} rows to silver ({result.quarantined} "
               f"quarantined), {result.applied_transactions} transactions applied to gold")


@cli.command()
@_once_option("Apply what silver holds now (availableNow), then exit.")
@click.option("--accept-errors-upto", metavar="LSN",
              help="Pass over silver rows that failed to parse up to this commit LSN, after "
                   "checking silver/quarantine; e.g. 0/4A3F2C0.")
@_wait_option
@click.pass_context
@_needs_spark
def mirrors(ctx, once, accept_errors_upto, wait_s):
    """silver → typed current-state mirrors of the captured tables
    (silver/tables/<schema>/<table>); `run` keeps them too."""
    stop = stop_on_signals()
    _await_input(ctx, "mirrors", wait_s, stop)
    merged = _pipeline(ctx).mirrors(once=once, stop=stop,
                                    accept_errors_upto=_accepted(accept_errors_upto))
    click.echo("mirrors: " + (", ".join(f"{t} ({n} batches)" for t, n in sorted(merged.items()))
                              or "nothing to apply"))


def _accepted(text: str | None) -> int | None:
    """``--accept-errors-upto``'s LSN."""
    from core.lsn import Lsn

    try:
        return int(Lsn.parse(text)) if text else None
    except ValueError as exc:
        raise UserError(f"--accept-errors-upto: {exc}; write an LSN like 0/4A3F2C0.") from None


@cli.command()
@_once_option("Push gold's latest version once, then exit.")
@click.option("--take-over", is_flag=True,
              help="Once: replace the counts of another pipeline this dashboard holds "
                   "(one that is retired or moved) with this one's, by a full push.")
@_wait_option
@_metrics_option
@click.pass_context
def push(ctx, once, take_over, wait_s, metrics_port):
    """gold → dashboard Postgres service_stats (JVM-free: delta-rs and psycopg)."""
    from core.faults import FaultPoints
    from gold.push import push_once, run_push
    from pipelines.metrics import pipeline_exporter

    config = _config(ctx)
    gold_path = config.table_path(GOLD)
    sole = config.guard_on("sole_dashboard")
    stop = stop_on_signals()
    _await_input(ctx, "push", wait_s, stop)
    with pipeline_exporter(config, metrics_port, stage="push") as metrics:
        on_result = metrics.on_push if metrics is not None else None
        if not once and not take_over:
            run_push(gold_path, config.dashboard, stop, interval_s=0.5,
                     on_result=on_result, sole=sole)
            return
        result = push_once(gold_path, config.dashboard, faults=FaultPoints(config.faults),
                           sole=sole, take_over=take_over)
        if on_result is not None:
            on_result(result)
    click.echo(f"push: gold version {result.gold_version}"
               + ("" if result.pushed else " (already pushed)"))


@cli.command()
@_once_option("Drain everything committed before it started through every layer, then exit.")
@_shipper_safety_options
@_metrics_option
@click.pass_context
@_needs_spark
def run(ctx, once, metrics_port, **flags):
    """All stages: ship, silver, gold, push."""
    with _stage_metrics(_pipeline(ctx, **flags), metrics_port, "run") as pipeline:
        if once:
            report = pipeline.run_once()
            timing = ", ".join(f"{k} {v:.1f}s" for k, v in report.seconds.items())
            click.echo(f"run: shipped {report.shipped}, silver {report.silver_rows} "
                       f"({report.quarantined} quarantined), gold {report.gold_transactions} "
                       f"transactions, dashboard at gold version {report.pushed_version} "
                       f"({timing})")
        else:
            pipeline.run_continuous(stop_on_signals())


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx, as_json):
    """Slot lag and wal_status; per layer the last commit LSN, version and freshness."""
    from pipelines.status import collect, render, to_json

    report = collect(_config(ctx))
    click.echo(to_json(report) if as_json else render(report))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--repair", is_flag=True,
              help="On drift, rebuild gold from a fresh baseline, push it, and verify again.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for a running pipeline to pass the verification point.")
@click.pass_context
@_needs_spark
def verify(ctx, as_json, repair, timeout_s):
    """Gold and the dashboard against a GROUP BY of the source at one consistent LSN.

    Exit 0 when both are exact, 1 with a readable diff when not."""
    from pipelines.verify import run_verify

    pipeline = _pipeline(ctx)
    run_verify(pipeline.config, pipeline.where, start_spark=lambda: pipeline.spark,
               drive=pipeline.run_once, gold_lock=pipeline.gold_lock, as_json=as_json,
               repair=repair, timeout_s=timeout_s)


@cli.group()
def backfill():
    """Snapshot backfill, gold rebuild, silver reprocessing."""


@backfill.command("snapshot")
@click.option("--table", "tables", multiple=True,
              help="Captured table to read (repeatable) [every captured table].")
@click.option("--chunk-rows", type=int, default=10_000, show_default=True,
              help="Rows per keyset chunk.")
@click.option("--new-run", is_flag=True,
              help="Read the tables again even if the last run of these tables completed "
                   "(an unfinished run is otherwise continued).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the shipper to bring a chunk into bronze.")
@click.pass_context
def backfill_snapshot(ctx, tables, chunk_rows, new_run, timeout_s):
    """Capture the current rows of the captured tables into bronze as `read` rows, in
    watermarked chunks, concurrently with streaming; resumable.

    Needs a running shipper (`lakecdc ship` or `lakecdc run`): the chunks reach bronze
    through it. Rerun after an interruption to continue the same run."""
    from bronze.backfill import run_snapshot_backfill
    from core.storage import Lakehouse
    from pipelines.tables import captured_tables

    config = _config(ctx)
    options = Lakehouse.from_config(config).delta_rs_options()
    config = config.with_(tables=captured_tables(config, options))
    report = run_snapshot_backfill(config, tables=tables or None, chunk_rows=chunk_rows,
                                   storage_options=options,
                                   stop=stop_on_signals(), new_run=new_run,
                                   timeout_s=timeout_s)
    click.echo(report.summary())


@backfill.command("rebuild-gold")
@click.pass_context
@_needs_spark
def backfill_rebuild_gold(ctx):
    """Recompute gold from a fresh consistent baseline plus the silver changes after it,
    replace it atomically, push everything."""
    from pipelines.rebuild import rebuild_and_push

    pipeline = _pipeline(ctx)
    report = rebuild_and_push(pipeline.spark, pipeline.config, pipeline.where, pipeline.gold_lock)
    click.echo(report.summary())


@backfill.command("reprocess-silver")
@click.option("--from-lsn", help="First commit LSN to reprocess, e.g. 0/4A3F2C0.")
@click.option("--to-lsn", help="Last commit LSN to reprocess.")
@click.option("--since", "since", help="First commit time (ISO 8601, UTC if no offset).")
@click.option("--until", "until", help="Last commit time (ISO 8601).")
@click.pass_context
@_needs_spark
def backfill_reprocess_silver(ctx, from_lsn, to_lsn, since, until):
    """Re-parse bronze rows of an LSN or time range into silver (after a parser fix), then
    rebuild gold so it stays exact."""
    from pipelines.rebuild import reprocess_and_rebuild

    pipeline = _pipeline(ctx)
    report = reprocess_and_rebuild(pipeline.spark, pipeline.config, pipeline.where,
                                   pipeline.gold_lock, from_lsn=from_lsn, to_lsn=to_lsn,
                                   since=since, until=until)
    click.echo(report.summary())


@cli.command()
@click.option("--seconds", type=float, default=60.0, show_default=True,
              help="How long traffic and the continuous pipeline run.")
@click.option("--out", type=click.Path(), default="demo-output", show_default=True,
              help="Where the lakehouse, the summary and the PNG go.")
@click.pass_context
@_needs_spark
def demo(ctx, seconds, out):
    """Own local Postgres + wal2json, Notify-like traffic, the whole pipeline, a summary
    and a picture."""
    from core.spark import get_or_create
    from pipelines.demo import run_demo

    level = "WARN" if ctx.obj["verbose"] else "FATAL"
    run_demo(seconds=seconds, out_dir=out, stop=stop_on_signals(),
             spark_factory=lambda: get_or_create(log_level=level))


@cli.command()
@click.option("--suite", "suites", type=click.Choice(["silver", "gold"]), multiple=True,
              help="Run only this suite (repeatable) [silver and gold].")
@click.option("--all-silver", is_flag=True,
              help="Check every silver row, not only those after gold's baseline.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_needs_spark
def quality(ctx, suites, all_silver, as_json):
    """Great Expectations gates: the silver suite (keys, known ops, LSN order) and the gold
    suite (keys, counts >= 0, gold = baseline + silver deltas).

    Exit 0 when every suite passes, 1 when one fails (the job task fails: stop policy)."""
    from core.storage import Lakehouse
    from pipelines.quality import SUITES, render, run_gates, summary, to_json

    pipeline = _pipeline(ctx)
    config = pipeline.config
    results = run_gates(pipeline.spark, pipeline.where.silver.silver_path,
                        pipeline.where.gold, config.counted, tuple(suites) or SUITES,
                        baseline_path=config.baseline_path,
                        storage_options=Lakehouse.from_config(config).delta_rs_options(),
                        all_silver=all_silver)
    click.echo(to_json(results) if as_json else render(results))
    if not all(r.success for r in results):
        raise DriftFound(summary(results))


@cli.command("sql")
@click.argument("query", required=False)
@click.option("-f", "--file", "query_file", type=click.Path(dir_okay=False),
              help="Read the query from a .sql file (e.g. sql/top_services.sql).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]),
              default="table", show_default=True)
@click.option("--limit", type=int, default=1000, show_default=True, help="Rows shown at most.")
@click.pass_context
@_needs_spark
def sql_command(ctx, query, query_file, fmt, limit):
    """Spark SQL on the lakehouse tables, registered by name: bronze_wal2json_changes,
    silver_changes, silver_quarantine, gold_service_stats."""
    from pipelines.query import read_query, register_tables, render, run_query, table_paths

    if bool(query) == bool(query_file):
        raise click.UsageError("give a query or --file, not both and not neither.")
    text = read_query(query_file) if query_file else query
    pipeline = _pipeline(ctx)
    register_tables(pipeline.spark, table_paths(pipeline.config))
    click.echo(render(run_query(pipeline.spark, text), fmt, limit))


@cli.command()
@click.option("--port", "listen", metavar="[HOST:]PORT", required=True,
              envvar="LAKECDC_METRICS_PORT",
              help="Where to serve http://HOST:PORT/metrics (host 127.0.0.1 unless given) "
                   "[env LAKECDC_METRICS_PORT].")
@click.pass_context
def metrics(ctx, listen):
    """Serve the pipeline's state as Prometheus metrics until stopped: slot lag and
    wal_status, per layer version, commit LSN and freshness, quarantined rows. Read from
    the source and the tables on scrape, wherever the pipeline runs (no Spark needed)."""
    from pipelines.metrics import serve_state

    serve_state(_config(ctx), listen, stop_on_signals())


cli.add_command(tables)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    try:
        cli.main(args=argv, prog_name="lakecdc", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("lakecdc: aborted", err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"lakecdc: {redact(exc.format_message())}", err=True)
        return 2
    except UserError as exc:
        click.echo(f"lakecdc: error: {redact(str(exc))}", err=True)
        return 2
    except DriftFound as exc:
        click.echo(f"lakecdc: drift: {redact(str(exc))}", err=True)
        return 1
    except Exception:
        # Not the user's doing: keep the traceback (passwords redacted), and keep exit 1
        # free for drift.
        click.echo(redact(traceback.format_exc()), err=True)
        return 3
    return 0


def entry() -> None:
    """Entry point of the ``lakecdc`` console script and of the bundle's wheel tasks.

    Everything the process creates - local lakehouse tables, checkpoints, spill files, the
    demo's output - is its owner's alone (umask 077: directories 0700, files 0600), and so
    is what its local Spark JVM writes (Hadoop's own umask setting, ``core.spark``):
    bronze holds personal data (``to``, ``personalisation``).

    On Databricks a wheel task calls it inside a process that goes on after it: it returns
    on success and exits only with a non-zero code. Anywhere else the process ends here, as
    ``process_entry`` ends it."""
    if not on_databricks():
        process_entry()
    os.umask(0o077)
    code = main()
    if code:
        sys.exit(code)


def process_entry() -> None:
    """``python -m pipelines``, and ``lakecdc`` outside Databricks: ``main``, then the
    process ends without the interpreter's finalization. pyarrow's dataset threads
    (delta-rs reads) can abort it while it is torn down ("terminate called without an
    active exception"; 4 exits in 60 of a script that read a Delta table), which turns
    exit 0 or 2 into a crash. Everything is committed and written by then; a Spark JVM
    ends by itself when its parent is gone. (On Databricks ``entry`` returns instead: a
    wheel task calls it in a process that goes on.)"""
    os.umask(0o077)
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
