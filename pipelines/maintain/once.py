"""``lakecdc maintain [--once]``: every table lakecdc writes, maintained now.

A running pipeline maintains its own tables between its batches (``schedule``); this is
for a pipeline that is stopped, a first maintenance of a table that grew before lakecdc
did it, or a schedule of its own. For each writer's tables (``plan``) it takes that
writer's lock first (``core.locks``: the shipper's on the source, the gold writer's and the
mirrors' on the dashboard database) and holds it while it works, so no writer starts
beside it; the tables of a writer that is running are passed over, with a line saying so,
since that writer maintains them itself. Without ``--once`` it does this again every
``Config.maintain_interval_s`` until stopped.
"""

from __future__ import annotations

import threading

from core.config import Config
from core.engine.api import Engine
from core.errors import UserError
from core.layout import GOLD
from core.locks import exclusive, gold_lock_name, mirrors_lock_name, ship_lock_name
from core.maintenance import TableReport
from core.storage import Lakehouse
from core.switches import Switches
from pipelines.maintain.owners import GROUPS, tables_of
from pipelines.maintain.schedule import maintain
from pipelines.setup.capture import captured_tables


def _writer_lock(config: Config, group: str) -> tuple[str, str, str]:
    """(database, lock name, what) of ``group``'s writer lock."""
    if group == "ship":
        return config.require_source(), ship_lock_name(config.slot), "source"
    if group == "stream":
        return config.dashboard, gold_lock_name(config.table_path(GOLD)), "dashboard"
    return config.dashboard, mirrors_lock_name(config.lakehouse), "dashboard"


def maintain_once(config: Config, engine: Engine | None = None) -> list[TableReport]:
    """Maintain every group's tables whose writer is not running; one report per table
    (``TableReport.line``: what ``maintain --once`` prints), with ``engine`` (None: the
    configuration's, ``core.engine.choose.engine_for``)."""
    if engine is None:
        from core.engine.choose import engine_for

        engine = engine_for(config)
    options = Lakehouse.from_config(config).delta_rs_options()
    switches = Switches.from_config(config)
    reports: list[TableReport] = []
    for group in GROUPS:
        # The stored set's tables (a ``tables add`` one too), as the mirrors' query keeps them.
        mirrored = tuple(t for t in captured_tables(config, options, engine=engine, loaded=True)
                         if config.mirrors is None or t in config.mirrors) \
            if group == "mirrors" else ()
        tables = tables_of(config, group, mirrored)
        dsn, lock, what = _writer_lock(config, group)
        running = f"passed over: its writer ({group}) is running and maintains it."
        try:
            with exclusive(dsn, lock, running, what=what):
                reports += maintain(tables, config, engine, switches)
        except UserError as exc:
            if not str(exc).startswith(running):
                raise
            reports += [TableReport(t.name, passed_over=running) for t in tables]
    return reports


def maintain_forever(config: Config, stop: threading.Event, echo,
                     engine: Engine | None = None) -> None:
    """``maintain_once`` every ``maintain_interval_s`` until ``stop`` is set."""
    while not stop.is_set():
        for line in (r.line() for r in maintain_once(config, engine)):
            echo(line)
        stop.wait(config.maintain_interval_s)
