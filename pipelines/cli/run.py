"""The running pipeline's commands (``pipelines.run``): ``ship``, ``stream``, ``mirrors``,
``push`` and ``run``, each a stage or all of them."""

from __future__ import annotations

import click

from core.errors import UserError
from core.layout import GOLD
from pipelines.cli.context import (
    await_input,
    command_engine,
    echo_json,
    json_option,
    load_config,
    make_pipeline,
    metrics_option,
    needs_spark,
    once_option,
    shipper_safety_options,
    stage_metrics,
    wait_option,
)
from pipelines.run.signals import stop_on_signals


@click.command()
@click.option("--once", is_flag=True, help="Drain what is committed now, then exit.")
@click.option("--max-changes", "upto_nchanges", type=int,
              help="Peek bound (upto_nchanges) per batch [200000].")
@click.option("--peek-timeout", "peek_timeout_s", type=int,
              help="Statement timeout of one peek, seconds [300].")
@click.option("--poll-interval", "poll_interval_s", type=float,
              help="Seconds from one peek's start to the next, unless the last was full [0.1].")
@click.option("--chunk-mb", type=float, help="Peek rows are converted in chunks of this size [2].")
@click.option("--memory-budget-mb", type=int,
              help="Rows held in memory per batch before spilling to local disk [64].")
@shipper_safety_options
@metrics_option
@click.pass_context
def ship(ctx, once, metrics_port, **flags):
    """slot → bronze."""
    from bronze.ship import Shipper
    from core.switches import Switches
    from pipelines.maintain.schedule import Maintainer
    from pipelines.observe.metrics import pipeline_exporter
    from pipelines.run.shipping import Reports

    config = load_config(ctx, **flags)
    engine = command_engine(ctx, config)
    switches = Switches.from_config(config)
    maintainer = Maintainer(config, "ship", engine=command_engine(ctx, config),
                            switches=switches)
    with pipeline_exporter(config, metrics_port, stage="ship",
                           engine=lambda: command_engine(ctx, config)) as metrics:
        totals = Shipper(config, switches, engine=engine,
                         downstream=Reports(metrics, maintainer)).run(
            once=once, stop=stop_on_signals())
    click.echo(f"shipped {totals.changes} changes in {totals.transactions} transactions "
               f"({totals.commits} bronze commits)")


@click.command()
@once_option("Process what bronze holds now (availableNow), then exit.")
@click.option("--accept-errors-upto", metavar="LSN",
              help="Treat quarantined (unparseable) silver rows up to this commit LSN as "
                   "count-neutral, after checking silver/quarantine; e.g. 0/4A3F2C0.")
@wait_option
@metrics_option
@click.pass_context
@needs_spark
def stream(ctx, once, accept_errors_upto, wait_s, metrics_port):
    """bronze → silver → gold service_stats: one Spark Structured Streaming query, idempotent
    appends and MERGE of whole transactions."""
    accept = _accepted(accept_errors_upto)
    stop = stop_on_signals()
    await_input(ctx, "stream", wait_s, stop)
    with stage_metrics(make_pipeline(ctx), metrics_port, "stream") as pipeline:
        result = pipeline.stream(once=once, stop=stop, accept_errors_upto=accept)
    click.echo(f"stream: {result.silver_rows} rows to silver ({result.quarantined} "
               f"quarantined), {result.applied_transactions} transactions applied to gold")


@click.command()
@once_option("Apply what silver holds now (availableNow), then exit.")
@click.option("--accept-errors-upto", metavar="LSN",
              help="Pass over silver rows that failed to parse up to this commit LSN, after "
                   "checking silver/quarantine; e.g. 0/4A3F2C0.")
@wait_option
@click.pass_context
@needs_spark
def mirrors(ctx, once, accept_errors_upto, wait_s):
    """silver → typed current-state mirrors of the captured tables
    (silver/tables/<schema>/<table>); `run` keeps them too."""
    stop = stop_on_signals()
    await_input(ctx, "mirrors", wait_s, stop)
    merged = make_pipeline(ctx).mirrors(once=once, stop=stop,
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


@click.command()
@once_option("Push gold's latest version once, then exit.")
@click.option("--take-over", is_flag=True,
              help="Once: replace the counts of another pipeline this dashboard holds "
                   "(one that is retired or moved) with this one's, by a full push.")
@wait_option
@metrics_option
@click.pass_context
def push(ctx, once, take_over, wait_s, metrics_port):
    """gold → dashboard Postgres service_stats (JVM-free: delta-rs and psycopg; with
    LAKECDC_WRITER=spark gold is read through Spark)."""
    from core.switches import Switches
    from gold.feeder import DashboardFeeder
    from gold.push import push_once
    from pipelines.observe.metrics import pipeline_exporter

    config = load_config(ctx)
    gold_path = config.table_path(GOLD)
    engine = command_engine(ctx, config)       # what reads gold (Spark's: a session)
    switches = Switches.from_config(config)
    stop = stop_on_signals()
    await_input(ctx, "push", wait_s, stop)
    with pipeline_exporter(config, metrics_port, stage="push",
                           engine=lambda: engine) as metrics:
        on_result = metrics.on_push if metrics is not None else None
        if not once and not take_over:
            feeder = DashboardFeeder(gold_path, config.dashboard, interval_s=0.5,
                                     on_result=on_result, switches=switches, engine=engine)
            feeder.catch_up()
            feeder.run(stop)
            return
        result = push_once(gold_path, config.dashboard, switches=switches,
                           take_over=take_over, engine=engine)
        if on_result is not None:
            on_result(result)
    click.echo(f"push: gold version {result.gold_version}"
               + ("" if result.pushed else " (already pushed)"))


@click.command()
@once_option("Drain everything committed before it started through every layer, then exit.")
@json_option
@wait_option
@shipper_safety_options
@metrics_option
@click.pass_context
@needs_spark
def run(ctx, once, as_json, wait_s, metrics_port, **flags):
    """All stages: ship, silver, gold, the mirrors, push."""
    if as_json and not once:
        raise click.UsageError("--json goes with --once (one report of the run).")
    stop = stop_on_signals()
    await_input(ctx, "run", wait_s, stop)
    if stop.is_set():
        return
    with stage_metrics(make_pipeline(ctx, **flags), metrics_port, "run") as pipeline:
        if once:
            report = pipeline.run_once()
            if as_json:
                echo_json(report)
                return
            timing = ", ".join(f"{k} {v:.1f}s" for k, v in report.seconds.items())
            click.echo(f"run: shipped {report.shipped}, silver {report.silver_rows} "
                       f"({report.quarantined} quarantined), gold {report.gold_transactions} "
                       f"transactions, dashboard at gold version {report.pushed_version} "
                       f"({timing})")
        else:
            pipeline.run_continuous(stop)
