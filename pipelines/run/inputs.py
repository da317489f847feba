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
input is a mistake to hear about at once. The table is looked for by the engine given
(``core.engine``; Spark's where only Spark reaches storage, ``LAKECDC_WRITER=spark``).
"""

from __future__ import annotations

import logging
import math
import threading
import time

from core.config import Config
from core.engine.api import Engine
from core.layout import BRONZE, GOLD, SILVER
from core.postgres import connect
from gold.push import dashboard_tables_exist

log = logging.getLogger("lakecdc.inputs")

# The table each waiting stage reads.
INPUT_OF = {"stream": BRONZE, "push": GOLD, "mirrors": SILVER, "run": BRONZE}


def wait_for_input(config: Config, stage: str, timeout_s: float, *,
                   poll_s: float = 2.0,
                   stop: threading.Event | None = None, engine: Engine | None = None) -> bool:
    """Wait until ``stage``'s input exists, ``timeout_s`` passed (``math.inf``: never) or
    ``stop`` is set; returns whether it exists (tables looked for by ``engine``; None: the
    configuration's, ``core.engine.choose.engine_for``)."""
    if engine is None:
        from core.engine.choose import engine_for

        engine = engine_for(config)
    path = config.table_path(INPUT_OF[stage])
    table = engine.exists
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
