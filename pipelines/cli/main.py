"""The ``lakecdc`` command line (also ``python -m pipelines``): the root group, its commands
gathered from one module per command group, and the process's entry points.

Exit codes: 0 success, 1 verification found drift, 2 usage or configuration error (one
sentence on stderr, no traceback), 3 an unexpected failure (traceback, passwords redacted);
``status`` also 4 (the slot is missing or lost) and 5 (a layer holds nothing yet).
``main(argv)`` never raises ``SystemExit`` on success, so it can be a Databricks wheel-task
entry point.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

import click

from core.errors import DriftFound, UserError, redact
from core.storage import drop_empty_cloud_variables, on_databricks
from pipelines.cli import backfill, demo, maintain, observe, run, setup, tables, verify
from pipelines.observe.logs import configure_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lakecdc", prog_name="lakecdc",
                      message="%(prog)s %(version)s")
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


for command in (setup.setup, run.ship, run.stream, run.mirrors, run.push, run.run,
                observe.status, verify.verify, backfill.backfill, demo.demo, verify.quality,
                observe.sql_command, observe.metrics, tables.tables, maintain.maintain):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    drop_empty_cloud_variables(os.environ)
    try:
        code = cli.main(args=argv, prog_name="lakecdc", standalone_mode=False)
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
    return code if type(code) is int else 0      # a command's ``ctx.exit(code)``


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
