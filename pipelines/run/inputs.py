"""Waiting for a stage's input table on a first start (``--wait-for-input SECONDS``).

The bundle's jobs start side by side on a fresh deployment: ``stream`` may start before
setup has created bronze, ``push`` before the stream has created gold, ``mirrors`` before it
has created silver. Such a stage waits, polling the table's Delta log (delta-rs: no JVM),
until its input exists or the time is up; then it starts, and a missing input is still
refused by the stage itself with its one sentence (exit 2). Without the flag (interactive
use) nothing waits: a missing input is a mistake to hear about at once. Where only Spark
reaches storage (``LAKECDC_WRITER=spark``) the table is looked for through the Spark
session given.
"""

from __future__ import annotations

import logging
import threading
import time

from deltalake import DeltaTable

from core.config import Config
from core.layout import BRONZE, GOLD, SILVER

log = logging.getLogger("lakecdc.inputs")

# The table each waiting stage reads.
INPUT_OF = {"stream": BRONZE, "push": GOLD, "mirrors": SILVER}


def wait_for_input(config: Config, stage: str, timeout_s: float, *,
                   storage_options: dict | None = None, poll_s: float = 2.0,
                   stop: threading.Event | None = None, spark=None) -> bool:
    """Wait until ``stage``'s input table exists, ``timeout_s`` passed or ``stop`` is set;
    returns whether it exists (looked for through ``spark`` when given)."""
    path = config.table_path(INPUT_OF[stage])
    exists = _through_spark(spark) if spark is not None else \
        (lambda p: DeltaTable.is_deltatable(p, storage_options=storage_options))
    deadline = time.monotonic() + timeout_s
    stop = stop or threading.Event()
    waited = False
    while not exists(path):
        if time.monotonic() >= deadline or stop.is_set():
            return False
        if not waited:
            log.info("%s: waiting up to %.0fs for its input %s to be created", stage,
                     timeout_s, path)
            waited = True
        stop.wait(min(poll_s, max(0.0, deadline - time.monotonic())))
    return True


def _through_spark(spark):
    from delta.tables import DeltaTable as SparkTable

    from core.storage import on_databricks, spark_path

    return lambda path: SparkTable.isDeltaTable(spark, spark_path(path, on_databricks()))
