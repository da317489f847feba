"""``lakecdc maintain [--once]``: compaction, checkpoints and vacuum of every table lakecdc
writes (``pipelines.maintain``); a running pipeline does it itself."""

from __future__ import annotations

import click

from pipelines.cli.context import command_engine, echo_json, json_option, load_config, once_option
from pipelines.run.signals import stop_on_signals


@click.command()
@once_option("Maintain every table once, then exit.")
@json_option
@click.pass_context
def maintain(ctx, once, as_json):
    """Compact small files, checkpoint and vacuum every table lakecdc writes, passing over
    the tables of a writer that is running (it maintains them itself); without --once,
    again every LAKECDC_MAINTAIN_INTERVAL seconds until stopped. No Spark needed, unless
    every write goes through Spark (LAKECDC_WRITER=spark)."""
    from pipelines.maintain.once import maintain_forever, maintain_once

    config = load_config(ctx)
    if as_json and not once:
        raise click.UsageError("--json goes with --once (one report of every table).")
    engine = command_engine(ctx, config)
    if once:
        reports = maintain_once(config, engine)
        if as_json:
            echo_json(reports)
        for report in () if as_json else reports:
            click.echo(report.line())
    else:
        maintain_forever(config, stop_on_signals(), click.echo, engine)
