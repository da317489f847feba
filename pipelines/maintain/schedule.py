"""Maintenance between a writer's batches: ``Maintainer`` is the hook each writer calls
after a batch of its own (the shipper's ``Downstream.shipped``, the stream's ``on_pass``,
the mirrors' ``after_batch``), in the writer's thread, so no write of lakecdc's runs beside
it (gold's fold, which runs beside the stream's batches, waits: ``Maintainer.exclusive``).

At most once per ``Config.maintain_interval_s`` it maintains every table of its group
(``Engine.maintain``, ``core.engine``), one after the other; the writer's next batch waits
for it. The bound is the interval's worth of small files per table: measured in
docs/operations.md, "Running for months". Between those, every ``LOG_CLEAN_INTERVAL_S`` it
cleans their expired log entries (``Engine.clean_log``: a snapshot load and the deletes).
A failure is logged and tried again at the next interval; it never stops the writer (the
table is then only larger, never wrong: F25).

Each table is kept by the writer's engine (``core.engine``: delta-rs, or Spark's Delta where
only Spark reaches storage), which reads its stream's checkpoint too.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Callable, ContextManager

from core.config import LOG_CLEAN_INTERVAL_S, Config
from core.engine.api import Engine
from core.maintenance import TableReport
from core.switches import Switches
from pipelines.maintain.owners import Maintained, tables_of

log = logging.getLogger("lakecdc.maintain")


def maintain(tables: list[Maintained], config: Config, engine: Engine | None = None,
             switches: Switches | None = None) -> list[TableReport]:
    """Maintain each of ``tables`` now (the caller is their writer, or holds its lock),
    with ``engine`` (None: the configuration's, ``core.engine.choose.engine_for``) and
    ``switches`` (None: the configuration's, ``Switches.from_config``)."""
    engine = _engine(config, engine)
    switches = switches or Switches.from_config(config)
    reports = []
    for table in tables:
        # Files removed from a table are kept as long as its log, in whole hours (time
        # travel inside the log reads them): a day for the tables others read.
        retention_hours = max(config.retention_hours, table.log_retention_minutes // 60)
        reports.append(engine.maintain(
            table.name, table.uri, retention_hours=retention_hours,
            log_retention_minutes=table.log_retention_minutes,
            reader_floor=_position(table, switches, engine),
            log_floor=_position(table, switches, engine, True),
            switches=switches))
    return reports


def clean_logs(tables: list[Maintained], config: Config, engine: Engine | None = None,
               switches: Switches | None = None) -> None:
    """Clean the expired log of each of ``tables`` now (``Engine.clean_log``; ``engine``
    and ``switches`` as for ``maintain``)."""
    engine = _engine(config, engine)
    switches = switches or Switches.from_config(config)
    for table in tables:
        note = engine.clean_log(table.uri, log_retention_minutes=table.log_retention_minutes,
                                log_floor=_position(table, switches, engine, True))
        if note:
            log.info("%s: %s", table.name, note)


def _engine(config: Config, engine: Engine | None) -> Engine:
    if engine is not None:
        return engine
    from core.engine.choose import engine_for

    return engine_for(config)


def _watched(table: Maintained, switches: Switches) -> bool:
    """Whether the stream reading the table holds back its vacuum and log cleanup
    (``core.maintenance``); the guard is off only in a negative control
    (docs/reliability.md, F17)."""
    return table.reader is not None and switches.on("reader_floor")


def _position(table: Maintained, switches: Switches, engine: Engine,
              replayed: bool = False) -> int | None:
    """Where the table's stream is (``Engine.stream_position``; ``replayed``: where it
    restarts); None when unwatched."""
    if not _watched(table, switches):
        return None
    return engine.stream_position(table.reader, replayed=replayed)


class Maintainer:
    """Maintains ``group``'s tables when due; call ``after_batch`` from the writer's thread.
    ``mirrored``: the mirrors the group writes, asked for at each run (a table added while
    running gets its mirror then). ``exclusive``: held through each run, for a writer of the
    group that works beside the batches (gold's fold: ``GoldBatchWriter.paused``)."""

    def __init__(self, config: Config, group: str,
                 mirrored: Callable[[], tuple[str, ...]] = tuple,
                 clock: Callable[[], float] = time.monotonic,
                 exclusive: Callable[[], ContextManager] = nullcontext,
                 engine: Engine | None = None, switches: Switches | None = None) -> None:
        self.config = config
        self.switches = switches or Switches.from_config(config)
        self._engine = engine            # the writer's (``maintain``; None: made when due)
        self.group = group
        self.mirrored = mirrored
        self.exclusive = exclusive
        self.clock = clock
        self.last = clock()            # the first run one interval after the start
        self.last_log = self.last
        self.runs = 0

    @property
    def engine(self) -> Engine:
        """The writer's engine, or the configuration's, made at the first need."""
        if self._engine is None:
            self._engine = _engine(self.config, None)
        return self._engine

    def due(self) -> bool:
        return self.clock() - self.last >= self.config.maintain_interval_s

    def log_due(self) -> bool:
        return self.clock() - self.last_log >= min(LOG_CLEAN_INTERVAL_S,
                                                   self.config.maintain_interval_s)

    def after_batch(self, *_args) -> list[TableReport]:
        """Maintain the group's tables if due, else clean their logs if that is due (any
        arguments a writer's hook passes are ignored). Never raises: a failure is logged
        and retried at the next interval."""
        if not self.due():
            if self.log_due():
                self._clean_logs()
            return []
        self.last = self.clock()
        try:
            tables = tables_of(self.config, self.group, self.mirrored())
            with self.exclusive():
                reports = maintain(tables, self.config, self.engine, self.switches)
        except Exception as exc:
            log.warning("maintenance of the %s tables failed, tried again in %.0fs: %s",
                        self.group, self.config.maintain_interval_s, exc)
            return []
        finally:
            self.last = self.last_log = self.clock()
        self.runs += 1
        for report in reports:
            log.info("maintained %s", report.line())
        return reports

    def _clean_logs(self) -> None:
        try:
            tables = tables_of(self.config, self.group, self.mirrored())
            with self.exclusive():
                clean_logs(tables, self.config, self.engine, self.switches)
        except Exception as exc:
            log.warning("cleaning the %s tables' logs failed, tried again in %.0fs: %s",
                        self.group, LOG_CLEAN_INTERVAL_S, exc)
        finally:
            self.last_log = self.clock()
