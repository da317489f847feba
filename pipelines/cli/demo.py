"""``lakecdc demo`` (``pipelines.demo``)."""

from __future__ import annotations

import click

from pipelines.cli.context import needs_spark
from pipelines.run.signals import stop_on_signals


@click.command()
@click.option("--seconds", type=float, default=60.0, show_default=True,
              help="How long traffic and the continuous pipeline run.")
@click.option("--out", type=click.Path(), default="demo-output", show_default=True,
              help="Where the lakehouse, the summary and the PNG go.")
@click.pass_context
@needs_spark
def demo(ctx, seconds, out):
    """Own local Postgres + wal2json, Notify-like traffic, the whole pipeline, a summary
    and a picture."""
    from core.extras import require
    from pipelines.demo.run_demo import run_demo

    require("demo")                 # before minutes of traffic, not at the picture
    run_demo(seconds=seconds, out_dir=out, stop=stop_on_signals(),
             log_level="WARN" if ctx.obj["verbose"] else "FATAL")
