"""``gold/_pending``: the contribution lines of source transactions gold has not applied
yet (``gold.apply``'s steps (1), (2) and (5); docs/gold.md, "Exactly once").

Only the stream's gold writer writes it, through Spark, with the app transaction of the
batch (``txnAppId``/``txnVersion``), so a replayed batch finds it written (step (1)) and
Spark skips the write itself. Which batch wrote it is read from that app transaction, which
no other commit (a compaction, a rebuild's, which starts another epoch) moves and no log
cleanup loses (F30).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from core.commits import commit_metadata as metadata
from core.engine.spark_delta import recorded


@dataclass(frozen=True)
class PendingHead:
    """Steps (1)-(2) of a batch, read before its rows are needed (``Pending.head``):
    ``_pending``'s version and newest batch id, and its rows at that version."""

    version: int
    last_batch: int | None
    replayed: bool                      # step (1): the batch is already fully applied
    stored: list[tuple]                 # the carried lines (CONTRIBUTIONS order)


class Pending:
    """``_pending`` at ``path``, written by the stream whose app id is ``app_id`` (``guard``
    off: no app transaction written or read, negative controls only); ``floor`` and
    ``epoch`` go into each write's metadata, for readers of its history."""

    def __init__(self, path: str, app_id: str, guard: bool, floor: int,
                 epoch: int | None) -> None:
        self.path, self.app_id, self.guard = path, app_id, guard
        self.floor, self.epoch = floor, epoch
        # (version, batch id) of an empty _pending this writer has not written since.
        self._known_empty: tuple[int, int | None] | None = None

    def head(self, spark: SparkSession, batch_id: int) -> PendingHead:
        """What ``_pending`` holds before batch ``batch_id``, and whether that batch wrote
        it already."""
        # Without reading the log when this writer's previous batch left _pending empty
        # and unwritten (the usual case: no transaction split across batches). Only
        # lakecdc writes _pending, under the gold lock this job holds; kept only after a
        # batch that succeeded, so a failure (or a new process) reads the table again.
        known_empty, self._known_empty = self._known_empty, None
        version, last_batch = known_empty or self._head(spark)
        replayed = self.guard and last_batch is not None and last_batch >= batch_id
        stored: list[tuple] = []
        if not known_empty and not replayed:
            stored = [tuple(r.values()) for r in (
                spark.read.format("delta").option("versionAsOf", version)
                .load(self.path).toArrow().to_pylist())]
        return PendingHead(version, last_batch, replayed, stored)

    def left_empty(self, head: PendingHead) -> None:
        """The batch read at ``head`` succeeded without writing ``_pending``: empty still."""
        self._known_empty = (head.version, head.last_batch)

    def write(self, carried: DataFrame, batch_id: int, transactions: int) -> None:
        """Overwrite ``_pending`` with the ``carried`` lines of batch ``batch_id``."""
        writer = (carried.write.format("delta").mode("overwrite")
                  .option("userMetadata", metadata(batch_id=batch_id, floor=self.floor,
                                                   epoch=self.epoch,
                                                   transactions=transactions)))
        if self.guard:
            writer = writer.option("txnAppId", self.app_id).option("txnVersion", batch_id)
        writer.save(self.path)

    def _head(self, spark: SparkSession) -> tuple[int, int | None]:
        """(version, the newest batch that wrote it or None) of ``_pending``."""
        found = recorded(spark, self.path)
        return found.version, found.version_of(self.app_id)
