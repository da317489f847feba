"""What shows where the pipeline is (``pipelines.observe``): ``lakecdc status``,
``lakecdc metrics`` and ``lakecdc sql``."""

from __future__ import annotations

import click

from core.errors import UserError
from pipelines.cli.context import (
    command_engine,
    json_option,
    load_config,
    make_pipeline,
    needs_spark,
)
from pipelines.run.signals import stop_on_signals


@click.command()
@json_option
@click.pass_context
def status(ctx, as_json):
    """Slot lag and wal_status; per layer the last commit LSN, version and freshness.
    Exits 0 when all is well, 4 when the slot is missing or lost, 5 when a layer is not
    created yet or holds nothing yet."""
    from pipelines.observe.status import collect, exit_code, render, to_json

    # Read by the configuration's engine (Spark's where only Spark reaches storage).
    config = load_config(ctx)
    report = collect(config, command_engine(ctx, config))
    click.echo(to_json(report) if as_json else render(report))
    ctx.exit(exit_code(report))


@click.command("sql")
@click.argument("query", required=False)
@click.option("-f", "--file", "query_file", type=click.Path(dir_okay=False),
              help="Read the query from a .sql file (e.g. sql/top_services.sql).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]),
              default="table", show_default=True)
@click.option("--limit", type=int, default=1000, show_default=True, help="Rows shown at most.")
@click.option("--engine", type=click.Choice(["auto", "delta-rs", "spark"]), default="auto",
              show_default=True,
              help="delta-rs: DataFusion, no JVM; spark: Spark SQL; auto: delta-rs, and Spark "
                   "(saying why) for what only Spark answers.")
@click.pass_context
def sql_command(ctx, query, query_file, fmt, limit, engine):
    """SQL on the lakehouse tables, by name: bronze_wal2json_changes, silver_changes,
    silver_quarantine, gold_service_stats, silver_<schema>_<table> (the catalog's tables
    with LAKECDC_CATALOG and LAKECDC_SCHEMA set). One query; it never changes a table."""
    from pipelines.observe.query import NeedsSpark, read_query, render
    from pipelines.observe.query_rs import run_query_rs

    if bool(query) == bool(query_file):
        raise click.UsageError("give a query or --file, not both and not neither.")
    text = read_query(query_file) if query_file else query
    if engine != "spark":
        try:
            click.echo(render(run_query_rs(load_config(ctx), text, limit), fmt, limit))
            return
        except NeedsSpark as why:
            if engine == "delta-rs":
                raise UserError(f"{why}; run it with --engine spark.") from None
            click.echo(f"lakecdc sql: {why}: running it on Spark (a JVM starts).", err=True)
    _spark_sql(ctx, text, fmt, limit)


@needs_spark
def _spark_sql(ctx, text: str, fmt: str, limit: int) -> None:
    from pipelines.observe.query import render, run_query, use_tables

    pipeline = make_pipeline(ctx, names=True)
    use_tables(pipeline.spark, pipeline.config)
    click.echo(render(run_query(pipeline.spark, text), fmt, limit))


@click.command()
@click.option("--port", "listen", metavar="[HOST:]PORT", required=True,
              envvar="LAKECDC_METRICS_PORT",
              help="Where to serve http://HOST:PORT/metrics (host 127.0.0.1 unless given) "
                   "[env LAKECDC_METRICS_PORT].")
@click.pass_context
def metrics(ctx, listen):
    """Serve the pipeline's state as Prometheus metrics until stopped: slot lag and
    wal_status, per layer version, commit LSN and freshness, quarantined rows. Read from
    the source and the tables on scrape, wherever the pipeline runs (no Spark needed,
    except with LAKECDC_WRITER=spark: then the tables are read through a Spark session)."""
    from pipelines.observe.metrics import serve_state

    # The engine is made at the first scrape (with LAKECDC_WRITER=spark, a session then).
    config = load_config(ctx)
    serve_state(config, listen, stop_on_signals(),
                engine=lambda: command_engine(ctx, config))
