"""Gold's position, and gold as of an earlier source LSN: shared by ``verify`` and rebuilds.

Gold's *floor* is the consistent point of the baseline the counts started from (a seed from
``setup``'s snapshot, or a rebuild). The baseline's snapshot holds exactly the commits whose
commit record starts before the consistent point, and the slot decodes those starting at or
after it (wal2json's commit LSN is that start), so silver rows with ``commit_lsn < floor``
are inside the baseline and never counted again, and rows at the floor itself are not.

Where each part of the position is kept:

- the floor and the *epoch* (a rebuild's floor: the stream's app id after it,
  ``txn_app_id``) in the app transactions of the seed (``SEED_APP_ID``, version = its floor)
  and of the newest rebuild (``REBUILD_APP_ID``, version = its floor): table state, which
  every checkpoint carries, so a gold whose log was cleaned of all its lakecdc commits still
  has them (``baseline_of``; F30). The writer copies them into every step;
- the *watermark* (``commit_lsn``: gold holds every source commit up to and including it) in
  the metadata of gold's commits (``core.commits``): the newest commit recording one. It
  describes (``verify``, ``status``, the push ahead of gold); a gold whose log holds no such
  commit any more has none until its next step records one.

Gold as of an LSN ``L`` between its floor and its watermark ``W`` is gold minus the net
deltas of the silver transactions in ``(L, W]``: gold applies whole transactions in commit
order, so those are exactly what it added after ``L``.
"""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from core.captured import COUNTED, DIMS, CountedTables
from core.commits import Recorded, floor_of
from core.engine.spark_delta import read_commits, recorded
from core.spark import is_connect
from gold import deltas as D

APP_ID = "lakecdc-gold"
SEED_APP_ID = "lakecdc-gold-seed"
REBUILD_APP_ID = "lakecdc-gold-rebuild"


def txn_app_id(epoch: int | None) -> str:
    """The Delta app id of the stream's writes. A rebuild starts the stream's checkpoint
    afresh (``pipelines.backfill.rebuild``), so batch ids restart at 0: each such *epoch* (the
    rebuild's floor) gets an app id of its own, whose versions Delta has not seen yet."""
    return APP_ID if epoch is None else f"{APP_ID}@{epoch}"


def step_app_id(epoch: int | None) -> str:
    """The Delta app id of the steps the stream's ``epoch`` appends to ``_deltas``; its
    version is the newest step's watermark (``gold.apply.GoldBatchWriter.recover``)."""
    return f"{APP_ID}-step" if epoch is None else f"{APP_ID}-step@{epoch}"


def folded_app_id(epoch: int | None) -> str:
    """The Delta app id of the folds of ``epoch``'s steps into gold; its version is the
    newest folded step's watermark, so gold holds exactly the rows of ``_deltas`` whose
    ``last_commit_lsn`` is at or below it (``gold.fold.unfolded``)."""
    return f"{APP_ID}-folded" if epoch is None else f"{APP_ID}-folded@{epoch}"


@dataclass(frozen=True)
class GoldState:
    version: int
    watermark: int | None        # newest source commit gold includes (None: none yet)
    watermark_ts: str | None
    floor: int                   # baseline LSN (0: counted from an empty start)
    epoch: int | None = None     # the rebuild that started the stream's checkpoint afresh


def baseline_of(found: Recorded) -> tuple[int, int | None]:
    """(floor, epoch) of the gold table ``found`` was read from: its newest rebuild's
    consistent point for both, else its seed's floor and no epoch; (0, None) for neither."""
    rebuilt = found.version_of(REBUILD_APP_ID)
    if rebuilt is not None:
        return rebuilt, rebuilt
    return found.version_of(SEED_APP_ID) or 0, None


def gold_state(spark: SparkSession, gold_path: str, version: int | None = None,
               limit: int = 1000) -> GoldState | None:
    """Position of gold at ``version`` (latest if None); None if gold does not exist.

    The floor and the epoch of the latest version are its app transactions'
    (``baseline_of``). Those of an earlier version (time travel, which needs that version's
    log anyway) and, on Spark Connect (no reader of app transactions), of the latest come
    from the newest commits' metadata that record them; so does the watermark."""
    if not DeltaTable.isDeltaTable(spark, gold_path):
        return None
    commits = read_commits(spark, gold_path, limit=limit, up_to=version)
    found = recorded(spark, gold_path) if version is None and not is_connect(spark) else None
    if not commits and found is None:
        raise ValueError(f"gold at {gold_path} has no version {version}")
    watermark = ts = floor = epoch = None
    for commit in commits:
        meta = commit.meta
        if not meta:
            continue
        if watermark is None and meta.get("commit_lsn") is not None:
            watermark, ts = int(meta["commit_lsn"]), meta.get("commit_ts")
        if epoch is None and meta.get("epoch") is not None:
            epoch = int(meta["epoch"])
        if floor is None:
            floor = floor_of(meta)
        if watermark is not None and floor is not None:
            break
    if found is None:
        return GoldState(commits[0].version, watermark, ts, floor or 0, epoch)
    return GoldState(found.version, watermark, ts, *baseline_of(found))


def silver_range(spark: SparkSession, silver_path: str, first: int, last: int) -> DataFrame:
    """Silver rows with ``first <= commit_lsn <= last``."""
    return (spark.read.format("delta").load(silver_path)
            .where(F.col("commit_lsn").between(F.lit(first), F.lit(last))))


def silver_holds(spark: SparkSession, silver_path: str, lsn: int) -> bool:
    """Whether silver holds every row of every source transaction with ``commit_lsn <= lsn``.

    Silver appends bronze in commit order, so a row of a later commit means it does; else
    the transaction at ``lsn`` must be whole (its rows against its ``tx_changes``). The
    stream's two halves commit side by side and the dashboard takes gold's step before
    either (``pipelines.run.stream``), so gold and the dashboard may briefly hold a batch silver
    has not appended yet."""
    at = F.col("commit_lsn") == F.lit(lsn)
    row = (spark.read.format("delta").load(silver_path)
           .where(F.col("commit_lsn") >= F.lit(lsn))
           .agg(F.max("commit_lsn").alias("newest"),
                F.count(F.when(at, F.lit(1))).alias("rows"),
                F.max(F.when(at, F.col("tx_changes"))).alias("size"))
           .first())
    if row["newest"] is None:
        return False
    return row["newest"] > lsn or row["rows"] >= row["size"]


def net_deltas(silver: DataFrame, tables: CountedTables = COUNTED) -> DataFrame:
    """Net count delta per key of ``silver`` rows (dims, delta), zero nets dropped."""
    return D.key_deltas(D.contributions(silver, tables)).select(*DIMS, "delta")


def counts_of(gold: DataFrame) -> dict[tuple, int]:
    """Collect (dims, count) rows into a dict, zero counts dropped."""
    return {tuple(r[c] for c in DIMS): int(r["count"]) for r in gold.collect() if r["count"]}


def subtract(counts: dict[tuple, int], deltas: DataFrame) -> dict[tuple, int]:
    """``counts`` minus per-key ``deltas`` (collected), zero counts dropped."""
    result = dict(counts)
    for r in deltas.collect():
        key = tuple(r[c] for c in DIMS)
        result[key] = result.get(key, 0) - int(r["delta"])
    return {k: v for k, v in result.items() if v}
