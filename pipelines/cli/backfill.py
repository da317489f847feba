"""``lakecdc backfill``: the snapshot backfill into bronze, and the repairs that rebuild gold
or reprocess silver (``pipelines.backfill``)."""

from __future__ import annotations

import click

from pipelines.cli.context import command_engine, load_config, make_pipeline, needs_spark
from pipelines.run.signals import stop_on_signals


@click.group()
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
    from bronze.snapshot_backfill import run_snapshot_backfill
    from core.storage import Lakehouse
    from pipelines.setup.capture import captured_tables

    config = load_config(ctx)
    options = Lakehouse.from_config(config).delta_rs_options()
    engine = command_engine(ctx, config)
    config = config.with_(tables=captured_tables(config, options, engine=engine))
    report = run_snapshot_backfill(config, tables=tables or None, chunk_rows=chunk_rows,
                                   storage_options=options,
                                   stop=stop_on_signals(), new_run=new_run,
                                   timeout_s=timeout_s, engine=engine)
    click.echo(report.summary())


@backfill.command("rebuild-gold")
@click.pass_context
@needs_spark
def backfill_rebuild_gold(ctx):
    """Recompute gold from a fresh consistent baseline plus the silver changes after it,
    replace it atomically, push everything."""
    from pipelines.backfill.rebuild import rebuild_and_push

    pipeline = make_pipeline(ctx)
    report = rebuild_and_push(pipeline.spark, pipeline.config, pipeline.where, pipeline.gold_lock)
    click.echo(report.summary())


@backfill.command("reprocess-silver")
@click.option("--from-lsn", help="First commit LSN to reprocess, e.g. 0/4A3F2C0.")
@click.option("--to-lsn", help="Last commit LSN to reprocess.")
@click.option("--since", "since", help="First commit time (ISO 8601, UTC if no offset).")
@click.option("--until", "until", help="Last commit time (ISO 8601).")
@click.pass_context
@needs_spark
def backfill_reprocess_silver(ctx, from_lsn, to_lsn, since, until):
    """Re-parse bronze rows of an LSN or time range into silver (after a parser fix), then
    rebuild gold so it stays exact."""
    from pipelines.backfill.rebuild import reprocess_and_rebuild

    pipeline = make_pipeline(ctx)
    report = reprocess_and_rebuild(pipeline.spark, pipeline.config, pipeline.where,
                                   pipeline.gold_lock, from_lsn=from_lsn, to_lsn=to_lsn,
                                   since=since, until=until)
    click.echo(report.summary())
