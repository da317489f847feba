"""``lakecdc tables``: list, add and remove captured tables (``pipelines.setup.capture``)."""

from __future__ import annotations

import click

from pipelines.cli.context import echo_json, json_option, load_config, spark_factory
from pipelines.run.signals import stop_on_signals


def _context(ctx):
    """The configuration and the delta-rs storage options of the lakehouse."""
    from core.storage import Lakehouse

    config = load_config(ctx)
    return config, Lakehouse.from_config(config).delta_rs_options()


@click.group(invoke_without_command=True)
@json_option
@click.pass_context
def tables(ctx, as_json):
    """The captured tables: list them (the default), add one while the pipeline runs, or
    remove one. The set is stored in the lakehouse (bronze/_captured) with the pipeline's
    progress; LAKECDC_TABLES only gives setup its first version."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command, as_json=as_json)


@tables.command("list")
@json_option
@click.pass_context
def list_command(ctx, as_json):
    """Each captured (or once captured) table, its state and its mirror's freshness."""
    from pipelines.setup.capture import list_tables, render_tables, tables_json

    config, options = _context(ctx)
    lines = list_tables(config, options, spark_factory(ctx, config))
    if as_json:
        echo_json(tables_json(lines))
    else:
        click.echo(render_tables(lines))


@tables.command("add")
@click.argument("table")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Rows per key-range chunk of the table's current rows (memory grows "
                   "with it).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True),
              default=120.0, show_default=True,
              help="Seconds to wait for the shipper to take up the new set of tables.")
@click.pass_context
def add_command(ctx, table, chunk_rows, timeout_s):
    """Capture SCHEMA.TABLE from now on and load its current rows into its mirror (by
    key-range chunks, while streaming goes on); the mirror then follows its changes. Needs
    a running shipper (`lakecdc run` or `lakecdc ship`). Rerun after an interruption: it
    continues."""
    from pipelines.setup.capture import add_table

    config, options = _context(ctx)
    click.echo(add_table(config, table, options, stop_on_signals(), chunk_rows, timeout_s,
                         spark_factory=spark_factory(ctx, config, names=True)))


@tables.command("remove")
@click.argument("table")
@click.pass_context
def remove_command(ctx, table):
    """Stop capturing SCHEMA.TABLE. Its mirror is kept as it was, no longer updated."""
    from pipelines.setup.capture import remove_table

    config, options = _context(ctx)
    click.echo(remove_table(config, table, options, stop_on_signals(),
                            spark_factory=spark_factory(ctx, config)))
