"""Waiting for a stage's input on a first start (``--wait-for-input SECONDS|forever``).

A deployment may start a stage before what it reads exists: the bundle's ``run`` job is
deployed running, before anyone ran its setup job; a stage run on its own may start before
the stage upstream created its table (``stream`` before setup created bronze, ``push``
before the stream created gold, ``mirrors`` before it created silver). Such a stage says
once, in one line, what it waits for, and polls (delta-rs: no JVM; the dashboard's catalog)
until it is there or the time is up; then it starts, and a missing input is still refused
by the stage itself with its one sentence (exit 2). ``run``'s input is a finished setup:
bronze, which setup creates after the slot, and the dashboard's tables, which it creates
after the mirrors' loads. Without the flag (interactive use) nothing waits: a missing
input is a mistake to hear about at once. Where only Spark reaches storage
(``LAKECDC_WRITER=spark``) the table is looked for through the Spark session given.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from deltalake import DeltaTable

from core.config import Config
from core.layout import BRONZE, GOLD, SILVER
from core.postgres import connect
from gold.push import dashboard_tables_exist

log = logging.getLogger("lakecdc.inputs")

# The table each waiting stage reads.
INPUT_OF = {"stream": BRONZE, "push": GOLD, "mirrors": SILVER, "run": BRONZE}


def wait_for_input(config: Config, stage: str, timeout_s: float, *,
                   storage_options: dict | None = None, poll_s: float = 2.0,
                   stop: threading.Event | None = None, spark=None) -> bool:
    """Wait until ``stage``'s input exists, ``timeout_s`` passed (``math.inf``: never) or
    ``stop`` is set; returns whether it exists (tables looked for through ``spark`` when
    given)."""
    path = config.table_path(INPUT_OF[stage])
    table = _through_spark(spark) if spark is not None else \
        (lambda p: DeltaTable.is_deltatable(p, storage_options=storage_options))
    if stage == "run":
        def ready() -> bool:
            return table(path) and _setup_done_on(config.dashboard)
        what = f"`lakecdc setup` (bronze at {path} and the dashboard's tables)"
    else:
        def ready() -> bool:
            return table(path)
        what = f"its input {path} to be created"
    deadline = time.monotonic() + timeout_s
    stop = stop or threading.Event()
    waited = False
    while not ready():
        if time.monotonic() >= deadline or stop.is_set():
            return False
        if not waited:
            bound = "" if math.isinf(timeout_s) else f" up to {timeout_s:.0f}s"
            log.info("%s: waiting%s for %s", stage, bound, what)
            waited = True
        stop.wait(min(poll_s, max(0.0, deadline - time.monotonic())))
    return True


def _setup_done_on(dsn: str) -> bool:
    """Whether setup created the dashboard's tables (a DSN that cannot connect: one
    sentence, exit 2, not a wait)."""
    with connect(dsn, what="dashboard") as conn:
        return dashboard_tables_exist(conn)


def _through_spark(spark):
    from delta.tables import DeltaTable as SparkTable

    from core.storage import on_databricks, spark_path

    return lambda path: SparkTable.isDeltaTable(spark, spark_path(path, on_databricks()))
