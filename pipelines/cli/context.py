"""What every ``lakecdc`` command shares: the configuration, the pipeline, the Spark check,
and the options several commands take. Imports no command module, so the command modules
and ``pipelines.cli.main`` import it without a circle."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import math
import threading
from contextlib import contextmanager

import click

from core.config import Config
from core.extras import require


def load_config(ctx, **flags) -> Config:
    """The configuration: the root group's flags and the command's, over the environment."""
    return Config.load(**ctx.obj["flags"], **flags)


def json_option(command):
    """``--json`` of the commands that report something a script reads."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Machine-readable output: one JSON document.")(command)


def echo_json(value) -> None:
    """``value`` (dataclasses, lists, dicts, datetimes) as one JSON document on stdout."""
    click.echo(json.dumps(value, indent=2, default=_plain))


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return str(value)


def metrics_option(command):
    """``--metrics-port`` of the commands that run stages: ``run`` serves every stage's
    metrics, ``ship``, ``stream`` and ``push`` their own (pipelines.observe.metrics.STAGES).
    """
    return click.option(
        "--metrics-port", metavar="[HOST:]PORT", envvar="LAKECDC_METRICS_PORT",
        help="Serve Prometheus metrics on http://HOST:PORT/metrics while running (host "
             "127.0.0.1 unless given; 0.0.0.0:PORT opens it to the network) "
             "[env LAKECDC_METRICS_PORT].")(command)


def shipper_safety_options(command):
    """WAL safety settings of the shipper (``ship``, and ``run``'s shipper); not given,
    ``Config`` takes them from the environment or its defaults."""
    command = click.option(
        "--reconnect-max-backoff", "reconnect_max_backoff_s", metavar="SECONDS",
        type=click.FloatRange(min=0, min_open=True),
        help="Longest wait between attempts to reconnect to the source after it went away "
             "[env LAKECDC_RECONNECT_MAX_BACKOFF; 30].")(command)
    return click.option(
        "--heartbeat-interval", "heartbeat_interval_s", metavar="SECONDS",
        type=click.FloatRange(min=0),
        help="Heartbeat transaction after this long without the slot moving while WAL is "
             "written elsewhere; 0 turns heartbeats off [env LAKECDC_HEARTBEAT_INTERVAL; "
             "30].")(command)


@contextmanager
def stage_metrics(pipeline, listen: str | None, stage: str):
    """Serve ``stage``'s metrics while the block runs, recorded through ``pipeline``."""
    from pipelines.observe.metrics import pipeline_exporter

    with pipeline_exporter(pipeline.config, listen, stage=stage,
                           engine=pipeline.engine) as pipeline.metrics:
        yield pipeline


def _require_spark() -> None:
    """The one check for the ``spark`` extra, before anything imports it: commands that
    need no JVM (setup, ship, push, status, metrics, backfill snapshot) never call it."""
    require("spark")


def needs_spark(command):
    """Marks a command that runs Spark: without the extra it ends in one sentence naming it
    (``core.extras``, exit 2) before any of its imports."""
    @functools.wraps(command)
    def checked(*args, **kwargs):
        _require_spark()
        return command(*args, **kwargs)
    return checked


def make_pipeline(ctx, names: bool = False, **flags):
    """The ``Pipeline`` a command runs, with the Spark session it starts when it needs one.
    ``names``: the command reads tables by name, so with LAKECDC_CATALOG set its session
    keeps them in a metastore (``spark_factory``)."""
    from pipelines.run.pipeline import Pipeline

    config = load_config(ctx, **flags)
    return Pipeline(config, spark_factory=spark_factory(ctx, config, names))


def command_engine(ctx, config: Config):
    """The command's storage engine (``core.engine.choose.start_engine``): Spark's Delta on
    the command's session when ``LAKECDC_WRITER=spark``, else delta-rs, which starts no
    JVM."""
    from core.engine.choose import start_engine

    return start_engine(config, spark_factory(ctx, config))


def spark_factory(ctx, config: Config, names: bool = False):
    """What starts the command's Spark session, when it needs one. ``names``: a command that
    registers or reads tables by name (``setup``, ``tables add``, ``sql``); with
    LAKECDC_CATALOG set, its local session keeps names in Spark's Hive metastore
    (``core.catalog_names``). The others never open the metastore: a local one (Derby) admits
    one process at a time, and a long ``run`` would hold it."""
    from core.storage import Lakehouse

    level = "WARN" if ctx.obj["verbose"] else "FATAL"
    lakehouse = Lakehouse.from_config(config)

    def start():
        _require_spark()
        from core.spark import get_or_create

        return get_or_create(log_level=level, lakehouse=lakehouse, output=config.spark_log,
                             master=config.spark_master, metastore=names and config.registers)
    return start




def once_option(help_text: str):
    """``--once``, with the command's own meaning of it."""
    return click.option("--once", is_flag=True, help=help_text)


class _Seconds(click.ParamType):
    """Seconds (at least 0), or ``forever``."""

    name = "seconds"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        if str(value).strip().lower() == "forever":
            return math.inf
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0:
            self.fail(f"{value!r} is not a number of seconds (at least 0) or 'forever'.",
                      param, ctx)
        return seconds


def wait_option(command):
    """``--wait-for-input SECONDS|forever`` of the stages a job may start before their
    input exists (``pipelines.run.inputs``)."""
    return click.option(
        "--wait-for-input", "wait_s", type=_Seconds(), default=0.0,
        metavar="SECONDS|forever",
        help="If the input does not exist yet (a first start: for `run`, a setup not run "
             "yet), say so once and wait up to this long for it [0: refuse at once].")(command)


def await_input(ctx, stage: str, wait_s: float, stop: threading.Event) -> None:
    """``--wait-for-input``: wait for ``stage``'s input table, when asked to."""
    if wait_s > 0:
        from pipelines.run.inputs import wait_for_input

        config = load_config(ctx)
        wait_for_input(config, stage, wait_s, stop=stop, engine=command_engine(ctx, config))
