"""``lakecdc backfill rebuild-gold``: gold recomputed from a fresh baseline, swapped in whole.

Used after a TRUNCATE of ``notifications`` (gold stops on it), a failover or restore
(``setup --rebaseline``), or drift found by ``verify``. Under the gold writer lock
(``core.locks``: the stream is not running meanwhile, so gold's watermark ``W`` is a
commit from before anything this command does):

1. A consistent point ``L`` of the source (temporary slot + exported snapshot) and the
   ``GROUP BY`` counts inside it: the new baseline, exact as of ``L`` (``W < L``).
2. One overwrite commit of ``gold/service_stats`` with those counts, metadata ``operation:
   rebuild``, *floor* ``L`` and watermark ``L - 1`` (the snapshot holds exactly the commits
   whose commit LSN is below ``L``; ``gold.asof``), and a Delta app transaction
   (``lakecdc-gold-rebuild``, ``L``). Readers see the old gold or the new one, never an
   empty or partial table.
3. ``_pending`` and ``_deltas`` emptied (one commit each, same metadata). The stream then
   goes on from its own checkpoint, under a Delta app id of this rebuild's own
   (``gold.asof.txn_app_id``: epoch ``L``), so its batch ids never collide with what
   Delta recorded before; it skips every
   row below the floor - they are inside the baseline: whatever it replays or has not read
   yet of the old changes, a TRUNCATE that stopped gold included. Nothing silver holds is
   at or past ``L`` (the stream is stopped while the lock is held, and ``L`` is taken
   after it), so there is nothing to apply from silver. Anything ``_pending`` carried, or
   ``_deltas`` held unfolded, was committed before ``L``, so it is inside the baseline too.
4. A full push: the dashboard is replaced from gold in one Postgres transaction.

A crash anywhere is harmless: before 2 nothing changed; after 2 gold is exact as of ``L``
and the stream continues from it (if 3 did not finish, the rows ``_pending`` carried and
those ``_deltas`` held are below the floor, or of the epoch before, and skipped); rerunning
the command takes a newer baseline. A lost stream checkpoint is not repaired here: silver
must be rebuilt with it (``pipelines.run.stream``). Rows purged from
``notification_history`` before ``L`` are no longer counted afterwards: a rebuild
re-baselines on the rows the source still has, as ``setup`` does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, ContextManager

from pyspark.sql import SparkSession

from core.commits import commit_metadata as metadata
from core.config import Config
from core.engine.choose import engine_for
from core.lsn import fmt
from core.storage import Lakehouse
from gold.asof import REBUILD_APP_ID, gold_state
from gold.deltas import CONTRIBUTIONS
from gold.fold import DELTAS_SCHEMA
from gold.gold_tables import GOLD_SCHEMA, ensure_gold_tables
from gold.push import push_once
from pipelines.setup.capture import known_tables
from pipelines.source.baseline import to_table, write_baseline
from pipelines.source.consistent import consistent_point, count_at
from silver.reprocess import ReprocessReport, reprocess_silver

if TYPE_CHECKING:
    from pipelines.run.pipeline import Locations

log = logging.getLogger("lakecdc.rebuild")


@dataclass(frozen=True)
class RebuildReport:
    baseline_lsn: int
    baseline_total: int           # notifications counted in the source at the baseline
    keys: int
    gold_version: int             # the version holding the rebuilt counts
    pushed_version: int | None = None
    seconds: float = 0.0

    def summary(self) -> str:
        pushed = "" if self.pushed_version is None else \
            f"; dashboard replaced from gold version {self.pushed_version}"
        return (f"rebuilt gold from a baseline of {self.baseline_total:,} notifications in "
                f"{self.keys:,} keys at {fmt(self.baseline_lsn)} (gold version "
                f"{self.gold_version}){pushed} ({self.seconds:.1f}s)")


def rebuild_gold(spark: SparkSession, config: Config, where: Locations,
                 gold_lock: Callable[[], ContextManager]) -> RebuildReport:
    """Steps 1-3 of the module docstring, under ``gold_lock()`` (the gold writer lock; it may
    be held already); see ``rebuild_and_push`` for the command."""
    started = time.monotonic()
    dsn = config.require_source()
    with gold_lock():
        paths = where.gold_paths
        ensure_gold_tables(spark, paths)
        state = gold_state(spark, where.gold)
        with consistent_point(dsn) as point:
            counted_at = datetime.now(timezone.utc)
            baseline = count_at(dsn, point, config.counted,
                                "counting the new baseline")
        lsn = point.lsn
        if state.watermark is not None and state.watermark >= lsn:
            # Cannot happen while the lock is held (gold only holds commits from before
            # the consistent point); refuse rather than write a gold that goes backwards.
            raise RuntimeError(f"gold's watermark {fmt(state.watermark)} is past the new "
                               f"baseline {fmt(lsn)}: another process wrote gold")
        now = datetime.now(timezone.utc)
        rows = [(*key, count, lsn, now) for key, count in sorted(baseline.items()) if count]
        new_gold = spark.createDataFrame(rows, GOLD_SCHEMA)
        (new_gold.write.format("delta").mode("overwrite")
         .option("txnAppId", REBUILD_APP_ID).option("txnVersion", lsn)
         .option("userMetadata", metadata(
             operation="rebuild", floor=lsn, commit_lsn=lsn - 1, epoch=lsn,
             commit_ts=counted_at.isoformat()))
         .save(where.gold))
        version = gold_state(spark, where.gold).version
        for emptied, schema in ((paths.pending, CONTRIBUTIONS), (paths.deltas, DELTAS_SCHEMA)):
            (spark.createDataFrame([], schema).write.format("delta").mode("overwrite")
             .option("userMetadata", metadata(operation="rebuild", floor=lsn, epoch=lsn))
             .save(emptied))
        # The newest baseline is also kept where setup keeps its own (the gold quality gate
        # reconciles gold against it once the rebuild commit's files are vacuumed).
        write_baseline(config.baseline_path, to_table(baseline), lsn,
                       engine=engine_for(config, spark))
    log.info("rebuilt gold at %s: %d keys (gold version %d)", fmt(lsn), len(rows), version)
    return RebuildReport(lsn, sum(baseline.values()), len(rows), version,
                         seconds=time.monotonic() - started)


def rebuild_and_push(spark: SparkSession, config: Config, where: Locations,
                     gold_lock: Callable[[], ContextManager]) -> RebuildReport:
    """``lakecdc backfill rebuild-gold``: rebuild, then replace the dashboard from gold
    (step 4), both under ``gold_lock()``."""
    started = time.monotonic()
    with gold_lock():
        report = rebuild_gold(spark, config, where, gold_lock)
        pushed = push_once(where.gold, config.dashboard, full=True)
    return RebuildReport(**{**report.__dict__, "pushed_version": pushed.gold_version,
                            "seconds": time.monotonic() - started})


def reprocess_and_rebuild(spark: SparkSession, config: Config, where: Locations,
                          gold_lock: Callable[[], ContextManager], **range_) -> ReprocessReport:
    """``lakecdc backfill reprocess-silver`` (``silver.reprocess``): the range re-parsed into
    silver, then gold rebuilt and pushed, all under ``gold_lock()``."""
    started = time.monotonic()
    with gold_lock():
        known = known_tables(config, Lakehouse.from_config(config).delta_rs_options(),
                             engine=engine_for(config, spark))()
        report = reprocess_silver(spark, where.silver, known, **range_,
                                  counted_tables=config.counted.names)
        rebuilt = rebuild_and_push(spark, config, where, gold_lock)
    return ReprocessReport(**{**report.__dict__, "rebuild": rebuilt,
                              "seconds": time.monotonic() - started})
