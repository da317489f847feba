"""Gold's tables: where they are, their schemas, creating them, and seeding gold.

``service_stats`` (gold), ``_pending`` and ``_deltas`` (``gold.apply``'s module text says
what each holds) are created together (``ensure_gold_tables``), so one is never lost
without the others being noticed; a baseline (setup's exported snapshot) is written once,
into a gold that holds no counts yet (``seed_gold``). Whether gold holds counts, and from
which floor, is read from its app transactions, which checkpoints carry (F30).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from core.captured import DIMS
from core.commits import commit_metadata as metadata
from core.commits import newest
from core.engine.spark_delta import read_commits, recorded
from core.errors import UserError
from core.handle import CHECKPOINTS
from core.layout import GOLD_DELTAS, GOLD_PENDING
from core.spark_tables import create_table
from core.switches import NONE, Switches
from gold import deltas as D
from gold.asof import APP_ID, REBUILD_APP_ID, SEED_APP_ID, folded_app_id, gold_state
from gold.fold import DELTAS_PROPERTIES, DELTAS_SCHEMA

GOLD_SCHEMA = StructType([
    *[StructField(c, StringType(), False) for c in DIMS],
    StructField("count", LongType(), False),
    StructField("last_commit_lsn", LongType(), True),
    StructField("updated_at", TimestampType(), True),
])

GOLD_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    # The push reads gold with delta-rs; keep to features every reader has.
    "delta.enableDeletionVectors": "false",
    **CHECKPOINTS,
}
PENDING_PROPERTIES = {**CHECKPOINTS, "delta.enableDeletionVectors": "false"}


@dataclass(frozen=True)
class GoldPaths:
    gold: str
    pending: str
    deltas: str

    @classmethod
    def beside(cls, gold_path: str) -> "GoldPaths":
        """``_pending`` and ``_deltas`` next to ``service_stats`` (``<lakehouse>/gold/``)."""
        folder = gold_path.rstrip('/').rsplit('/', 1)[0]
        return cls(gold_path, f"{folder}/{GOLD_PENDING[1]}", f"{folder}/{GOLD_DELTAS[1]}")



def ensure_gold_tables(spark: SparkSession, paths: GoldPaths) -> list[str]:
    """Create gold, ``_pending`` and ``_deltas`` if absent; returns what was created.
    Idempotent.

    Refuses (``UserError``) when one of gold and ``_pending`` exists without the other
    after gold has applied batches: the carried partial transactions would be lost or
    applied twice. ``_deltas`` is created beside a gold from before it (which folded every
    batch).
    """
    have_gold = DeltaTable.isDeltaTable(spark, paths.gold)
    have_pending = DeltaTable.isDeltaTable(spark, paths.pending)
    if have_gold != have_pending and (have_gold or have_pending):
        progress = newest(read_commits(spark, paths.gold if have_gold else paths.pending,
                                       limit=100))
        if progress and "batch_id" in progress:
            missing = paths.pending if have_gold else paths.gold
            raise UserError(f"{missing} is missing but gold has applied batches; gold cannot "
                            f"continue exactly: {D.REBUILD}.")
    created = []
    if not have_gold:
        create_table(spark, paths.gold, GOLD_SCHEMA, GOLD_PROPERTIES)
        created.append(paths.gold)
    if not have_pending:
        create_table(spark, paths.pending, D.CONTRIBUTIONS, PENDING_PROPERTIES)
        created.append(paths.pending)
    if not DeltaTable.isDeltaTable(spark, paths.deltas):
        create_table(spark, paths.deltas, DELTAS_SCHEMA, DELTAS_PROPERTIES)
        created.append(paths.deltas)
    return created


def seed_gold(spark: SparkSession, gold_path: str, counts: DataFrame, commit_lsn: int,
              commit_ts: datetime | None = None, switches: Switches = NONE) -> bool:
    """Write baseline counts (dims + ``count``) counted at consistent point ``commit_lsn``.

    For setup's exported-snapshot baseline. One commit carrying the rows, a txn
    (``lakecdc-gold-seed``, ``commit_lsn``) and metadata ``operation: seed``, floor
    ``commit_lsn``; the stream's gold half then ignores rows with ``commit_lsn <`` it
    (``seed_floor``: the snapshot holds exactly those).
    ``counts`` holds one row per key. Allowed only on a gold table that has applied no batch
    (created here if absent). Returns False if this exact seed was already written
    (idempotent retry).
    """
    if not DeltaTable.isDeltaTable(spark, gold_path):
        create_table(spark, gold_path, GOLD_SCHEMA, GOLD_PROPERTIES)
        switches.hit("after_gold_create")
    found = recorded(spark, gold_path)
    if found.version_of(SEED_APP_ID) == commit_lsn:
        return False
    if _holds_counts(found):
        raise UserError(f"gold at {gold_path} already holds counts; seed only a new table "
                        f"({D.REBUILD}).")
    now = datetime.now(timezone.utc)
    rows = counts.select(*[F.col(c).cast("string") for c in DIMS],
                         F.col("count").cast("long"),
                         F.lit(commit_lsn).cast("long").alias("last_commit_lsn"),
                         F.lit(now).cast("timestamp").alias("updated_at"))
    (rows.write.format("delta").mode("append")
     .option("txnAppId", SEED_APP_ID).option("txnVersion", commit_lsn)
     .option("userMetadata", metadata(operation="seed", commit_lsn=commit_lsn - 1,
                                      floor=commit_lsn,
                                      commit_ts=commit_ts.isoformat() if commit_ts else None))
     .save(gold_path))
    return True


def holds_counts(spark: SparkSession, gold_path: str) -> bool:
    """Whether gold records any counts of lakecdc's: a seed, a rebuild or an applied batch
    (their app transactions, which outlive the commits' log entries).

    This, not whether the table exists, decides seeding: a process killed after creating
    gold (or ``_pending``) and before the seed's commit leaves an empty table that still
    needs its baseline.
    """
    found = recorded(spark, gold_path)
    return found is not None and _holds_counts(found)


def _holds_counts(found) -> bool:
    """Whether gold, as ``found`` (``core.commits.Recorded``), records a seed, a rebuild or
    a fold of steps from before any rebuild (one after it records the rebuild; ``APP_ID``:
    the batch of a fold before folds recorded their watermark)."""
    return any(found.version_of(app) is not None
               for app in (SEED_APP_ID, REBUILD_APP_ID, folded_app_id(None), APP_ID))


def seed_floor(spark: SparkSession, gold_path: str) -> int:
    """Gold's floor: the source LSN of the baseline its counts start from (a seed or a
    rebuild; 0 if none). Silver rows at or below it are already in the counts."""
    state = gold_state(spark, gold_path)
    return state.floor if state else 0
