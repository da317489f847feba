"""Maintenance between a writer's batches: ``Maintainer`` is the hook each writer calls
after a batch of its own (the shipper's ``on_batch``, the stream's ``on_pass``, the mirrors'
``after_batch``), in the writer's thread, so no write of lakecdc's runs beside it (gold's
fold, which runs beside the stream's batches, waits: ``Maintainer.exclusive``).

At most once per ``Config.maintain_interval_s`` it maintains every table of its group
(``core.maintenance.maintain_table``), one after the other; the writer's next batch waits
for it. The bound is the interval's worth of small files per table: measured in
docs/operations.md, "Running for months". Between those, every ``LOG_CLEAN_INTERVAL_S`` it
cleans their expired log entries (``core.maintenance.clean_log``: a snapshot load and the
deletes). A failure is logged and tried again at the next interval; it never stops the
writer (the table is then only larger, never wrong: F25).

Where every write goes through Spark (``Config.spark_writes``) the writer hands a
``SparkWrites`` (``writes``) and each table is kept by ``core.maintenance_spark`` instead,
its stream's checkpoint read by Spark too; ``maintain`` and ``clean_logs`` are the one place
that chooses.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Callable, ContextManager

from core.checkpoints import stream_position
from core.config import LOG_CLEAN_INTERVAL_S, Config
from core.faults import FaultPoints
from core.maintenance import TableReport, clean_log, maintain_table
from core.maintenance_spark import clean_log_spark, maintain_table_spark, stream_position_spark
from core.storage import on_databricks, spark_path
from pipelines.maintain.plan import Maintained, tables_of

log = logging.getLogger("lakecdc.maintain")


def maintain(tables: list[Maintained], config: Config, storage_options: dict | None,
             writes=None) -> list[TableReport]:
    """Maintain each of ``tables`` now (the caller is their writer, or holds its lock);
    through Spark with ``writes`` (a ``SparkWrites``)."""
    reports = []
    for table in tables:
        # Files removed from a table are kept as long as its log, in whole hours (time
        # travel inside the log reads them): a day for the tables others read.
        retention_hours = max(config.retention_hours, table.log_retention_minutes // 60)
        floors = {"reader_floor": _position(table, config, storage_options, writes),
                  "log_floor": _position(table, config, storage_options, writes, True)}
        if writes is not None:
            reports.append(maintain_table_spark(
                writes, table.name, spark_path(table.uri, on_databricks()),
                retention_hours=retention_hours,
                log_retention_minutes=table.log_retention_minutes, **floors))
            continue
        reports.append(maintain_table(
            table.name, table.uri, storage_options, retention_hours=retention_hours,
            log_retention_minutes=table.log_retention_minutes, **floors,
            faults=FaultPoints(config.faults)))
    return reports


def clean_logs(tables: list[Maintained], config: Config, storage_options: dict | None,
               writes=None) -> None:
    """Clean the expired log of each of ``tables`` now (``core.maintenance.clean_log``;
    through Spark with ``writes``)."""
    for table in tables:
        log_floor = _position(table, config, storage_options, writes, True)
        note = clean_log_spark(writes, spark_path(table.uri, on_databricks()),
                               log_retention_minutes=table.log_retention_minutes,
                               log_floor=log_floor) if writes is not None else \
            clean_log(table.uri, storage_options,
                      log_retention_minutes=table.log_retention_minutes, log_floor=log_floor)
        if note:
            log.info("%s: %s", table.name, note)


def _watched(table: Maintained, config: Config) -> bool:
    """Whether the stream reading the table holds back its vacuum and log cleanup
    (``core.maintenance``); the guard is off only in a negative control
    (docs/reliability.md, F17)."""
    return table.reader is not None and config.guard_on("reader_floor")


def _position(table: Maintained, config: Config, storage_options: dict | None, writes,
              replayed: bool = False) -> int | None:
    """Where the table's stream is (``core.checkpoints.stream_position``; ``replayed``:
    where it restarts), read by Spark with ``writes``; None when unwatched."""
    if not _watched(table, config):
        return None
    if writes is not None:
        return stream_position_spark(writes.spark, spark_path(table.reader, on_databricks()),
                                     replayed)
    return stream_position(table.reader, storage_options, replayed=replayed)


class Maintainer:
    """Maintains ``group``'s tables when due; call ``after_batch`` from the writer's thread.
    ``mirrored``: the mirrors the group writes, asked for at each run (a table added while
    running gets its mirror then). ``exclusive``: held through each run, for a writer of the
    group that works beside the batches (gold's fold: ``GoldBatchWriter.paused``)."""

    def __init__(self, config: Config, group: str, storage_options: dict | None = None,
                 mirrored: Callable[[], tuple[str, ...]] = tuple,
                 clock: Callable[[], float] = time.monotonic,
                 exclusive: Callable[[], ContextManager] = nullcontext,
                 writes=None) -> None:
        self.config = config
        self.writes = writes             # a SparkWrites where only Spark writes (``maintain``)
        self.group = group
        self.storage_options = storage_options
        self.mirrored = mirrored
        self.exclusive = exclusive
        self.clock = clock
        self.last = clock()            # the first run one interval after the start
        self.last_log = self.last
        self.runs = 0

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
                reports = maintain(tables, self.config, self.storage_options, self.writes)
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
                clean_logs(tables, self.config, self.storage_options, self.writes)
        except Exception as exc:
            log.warning("cleaning the %s tables' logs failed, tried again in %.0fs: %s",
                        self.group, LOG_CLEAN_INTERVAL_S, exc)
        finally:
            self.last_log = self.clock()
