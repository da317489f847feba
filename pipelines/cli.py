"""The ``lakecdc`` command line (also ``python -m pipelines``).

Exit codes: 0 success, 1 verification found drift, 2 usage or configuration error (one
sentence on stderr, no traceback), anything else a failure. ``main(argv)`` never raises
``SystemExit`` on success, so it can be a Databricks wheel-task entry point.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from pipelines.config import Config
from pipelines.errors import DriftFound, UserError, redact


class _Redacting(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(str(record.msg))
        if record.args:
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Redacting())
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger("lakecdc")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False


def _stop_on_signals() -> threading.Event:
    """SIGTERM and Ctrl-C set an event the loops check between batches."""
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
    return stop


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--source-dsn", help="Source Postgres DSN [env LAKECDC_SOURCE_DSN].")
@click.option("--dashboard-dsn", help="Dashboard Postgres DSN [env LAKECDC_DASHBOARD_DSN].")
@click.option("--lakehouse", help="Root path or URI of the Delta tables [env LAKECDC_LAKEHOUSE].")
@click.option("--slot", help="Replication slot name [env LAKECDC_SLOT].")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.pass_context
def cli(ctx, source_dsn, dashboard_dsn, lakehouse, slot, verbose):
    """Exact CDC from Postgres into a Delta lakehouse, pushed back to Postgres dashboards."""
    _configure_logging(verbose)
    ctx.obj = {"source_dsn": source_dsn, "dashboard_dsn": dashboard_dsn,
               "lakehouse": lakehouse, "slot": slot}


def _config(ctx, **flags) -> Config:
    return Config.load(**ctx.obj, **flags)


@cli.command()
@click.option("--rebaseline", is_flag=True,
              help="Drop and recreate the slot and restart bronze's position from it "
                   "(after a lost slot, failover or restore).")
@click.pass_context
def setup(ctx, rebaseline):
    """Idempotent: replica identity, slot, lakehouse tables."""
    from pipelines.setup_source import setup as run_setup

    report = run_setup(_config(ctx), rebaseline=rebaseline)
    for line in report.actions:
        click.echo(line)


@cli.command()
@click.option("--once", is_flag=True, help="Drain what is committed now, then exit.")
@click.option("--max-changes", "upto_nchanges", type=int,
              help="Peek bound (upto_nchanges) per batch [50000].")
@click.option("--peek-timeout", "peek_timeout_s", type=int,
              help="Statement timeout of one peek, seconds [300].")
@click.option("--poll-interval", "poll_interval_s", type=float,
              help="Seconds between peeks when idle [1].")
@click.option("--chunk-mb", type=float, help="Peek rows are converted in chunks of this size [32].")
@click.option("--memory-budget-mb", type=int,
              help="Rows held in memory per batch before spilling to local disk [256].")
@click.pass_context
def ship(ctx, once, **flags):
    """slot → bronze."""
    from bronze.ship import Shipper

    totals = Shipper(_config(ctx, **flags)).run(once=once, stop=_stop_on_signals())
    click.echo(f"shipped {totals.changes} changes in {totals.transactions} transactions "
               f"({totals.commits} bronze commits)")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    try:
        cli.main(args=argv, prog_name="lakecdc", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("lakecdc: aborted", err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"lakecdc: {exc.format_message()}", err=True)
        return 2
    except UserError as exc:
        click.echo(f"lakecdc: error: {redact(str(exc))}", err=True)
        return 2
    except DriftFound as exc:
        click.echo(f"lakecdc: drift: {exc}", err=True)
        return 1
    return 0


def entry() -> None:
    """Console-script entry point: exits only with a non-zero code."""
    code = main()
    if code:
        sys.exit(code)
