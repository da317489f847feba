"""``lakecdc verify`` and ``lakecdc quality``: the pipeline checked against the source and
against its own contract (``pipelines.verify``)."""

from __future__ import annotations

import click

from core.errors import DriftFound
from pipelines.cli.context import make_pipeline, needs_spark
from pipelines.source.mirror_baseline import Sampling


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--repair", is_flag=True,
              help="On drift, rebuild gold from a fresh baseline, push it, and verify again.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for a running pipeline to pass the verification point.")
@click.option("--sample-above", "sample_above", type=click.IntRange(min=0),
              default=Sampling.above, show_default=True,
              help="A mirrored table of more rows than this (the source's estimate) is "
                   "compared by its every key and a sample of its rows, every column; "
                   "smaller ones whole, every row.")
@click.option("--sample-rows", "sample_rows", type=click.IntRange(min=1),
              default=Sampling.rows, show_default=True,
              help="About how many rows of such a table the sample holds.")
@click.option("--whole", is_flag=True, help="Compare every mirror whole, whatever its size.")
@click.pass_context
@needs_spark
def verify(ctx, as_json, repair, timeout_s, sample_above, sample_rows, whole):
    """Gold and the dashboard against a GROUP BY of the source at one consistent LSN.

    Exit 0 when both are exact, 1 with a readable diff when not."""
    from pipelines.verify.reconcile import run_verify

    pipeline = make_pipeline(ctx)
    run_verify(pipeline.config, pipeline.where, start_spark=lambda: pipeline.spark,
               drive=pipeline.run_once, gold_lock=pipeline.gold_lock, as_json=as_json,
               repair=repair, timeout_s=timeout_s,
               sampling=None if whole else Sampling(sample_above, sample_rows))


@click.command()
@click.option("--suite", "suites", type=click.Choice(["silver", "gold"]), multiple=True,
              help="Run only this suite (repeatable) [silver and gold].")
@click.option("--all-silver", is_flag=True,
              help="Check every silver row, not only those after gold's baseline.")
@click.option("--full", is_flag=True,
              help="Check everything since gold's baseline, not only what is new since the "
                   "last pass.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@needs_spark
def quality(ctx, suites, all_silver, full, as_json):
    """Great Expectations gates: the silver suite (keys, known ops, LSN order) and the gold
    suite (keys, counts >= 0, gold = baseline + silver deltas), on what is new since the
    last pass (gold/_quality).

    Exit 0 when every suite passes, 1 when one fails (the job task fails: stop policy)."""
    from core.extras import require
    from core.layout import QUALITY_STATE
    from core.storage import Lakehouse, on_databricks, spark_path
    from pipelines.maintain.owners import Maintained
    from pipelines.maintain.schedule import maintain

    require("quality")
    from pipelines.verify.quality import SUITES, render, run_gates, summary, to_json

    pipeline = make_pipeline(ctx)
    config = pipeline.config
    options = Lakehouse.from_config(config).delta_rs_options()
    state_path = config.table_path(QUALITY_STATE)
    results = run_gates(pipeline.spark, pipeline.where.silver.silver_path,
                        pipeline.where.gold, config.counted, tuple(suites) or SUITES,
                        baseline_path=config.baseline_path, storage_options=options,
                        all_silver=all_silver, full=full,
                        state_path=spark_path(state_path, on_databricks()))
    maintain([Maintained("quality", state_path, config.log_retention_minutes)],
             config, switches=pipeline.switches)    # its one writer
    click.echo(to_json(results) if as_json else render(results))
    if not all(r.success for r in results):
        raise DriftFound(summary(results))
