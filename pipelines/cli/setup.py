"""``lakecdc setup``: the source, the slot and the lakehouse prepared (``pipelines.setup``)."""

from __future__ import annotations

import click

from pipelines.cli.context import load_config, spark_factory


@click.command()
@click.option("--rebaseline", is_flag=True,
              help="Drop and recreate the slot and restart bronze's position from it "
                   "(after a lost slot, failover or restore).")
@click.option("--online-not-null", is_flag=True,
              help="First make nullable identity columns NOT NULL without blocking writers "
                   "(NOT VALID check, VALIDATE, SET NOT NULL; docs/source-tables.md).")
@click.pass_context
def setup(ctx, rebaseline, online_not_null):
    """Idempotent: replica identity, slot, lakehouse tables; with LAKECDC_CATALOG and
    LAKECDC_SCHEMA, every table registered by name in that schema (Spark starts for it)."""
    from pipelines.setup.prepare import setup as run_setup

    config = load_config(ctx)
    report = run_setup(config, rebaseline=rebaseline, online_not_null=online_not_null,
                       echo=click.echo, spark_factory=spark_factory(ctx, config, names=True))
    for line in report.actions:
        click.echo(line)
