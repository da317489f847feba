"""Gold's position, and gold as of an earlier source LSN: shared by ``verify`` and rebuilds.

Gold's commits carry lakecdc metadata (``core.commits``): the watermark
(``commit_lsn``: gold holds every source commit up to and including it) and the *floor* -
the consistent point of the baseline the counts started from (a seed from ``setup``'s
snapshot, or a rebuild). The baseline's snapshot holds exactly the commits whose commit
record starts before the consistent point, and the slot decodes those starting at or after
it (wal2json's commit LSN is that start), so silver rows with ``commit_lsn < floor`` are
inside the baseline and never counted again, and rows at the floor itself are not.

Gold as of an LSN ``L`` between its floor and its watermark ``W`` is gold minus the net
deltas of the silver transactions in ``(L, W]``: gold applies whole transactions in commit
order, so those are exactly what it added after ``L``.
"""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from core.captured import DIMS
from core.commits import floor_of, read_commits
from gold import deltas as D


@dataclass(frozen=True)
class GoldState:
    version: int
    watermark: int | None        # newest source commit gold includes (None: none yet)
    watermark_ts: str | None
    floor: int                   # baseline LSN (0: counted from an empty start)
    batch_id: int | None         # newest stream batch applied since the last rebuild
    epoch: int | None = None     # the rebuild that started the stream's checkpoint afresh


def gold_state(spark: SparkSession, gold_path: str, version: int | None = None,
               limit: int = 1000) -> GoldState | None:
    """Position of gold at ``version`` (latest if None); None if gold does not exist."""
    if not DeltaTable.isDeltaTable(spark, gold_path):
        return None
    commits = read_commits(spark, gold_path, limit=limit, up_to=version)
    if not commits:
        raise ValueError(f"gold at {gold_path} has no version {version}")
    watermark = ts = batch = floor = epoch = None
    batches_done = False         # a rebuild restarts the batch ids: look no further back
    for commit in commits:
        meta = commit.meta
        if not meta:
            continue
        if watermark is None and meta.get("commit_lsn") is not None:
            watermark, ts = int(meta["commit_lsn"]), meta.get("commit_ts")
        if not batches_done and meta.get("batch_id") is not None:
            batch, batches_done = int(meta["batch_id"]), True
        if meta.get("operation") == "rebuild":
            batches_done = True
        if epoch is None and meta.get("epoch") is not None:
            epoch = int(meta["epoch"])
        if floor is None:
            floor = floor_of(meta)
        if watermark is not None and batches_done and floor is not None:
            break
    return GoldState(commits[0].version, watermark, ts, floor or 0, batch, epoch)


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


def net_deltas(silver: DataFrame, tables: D.CountedTables = D.COUNTED) -> DataFrame:
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
