"""Gold's own commits on one engine: delta-rs (the default) or Spark's Delta
(``LAKECDC_WRITER=spark``, where only Spark reaches storage).

``gold.apply.GoldBatchWriter`` decides what to commit and when (a batch's step appended to
``_deltas``, a fold MERGEd into ``service_stats``, the app transaction and metadata of
each); this module is the one place that knows how each engine commits it and reads back
what a writer needs when it starts (``recover``). Both engines carry the same metadata
(``core.commits``) and the same app transactions, so either reads what the other wrote.
What a table holds is read from its app transactions, which checkpoints carry; the
metadata, which log cleanup deletes with its commit, only describes (F30).

- ``RsGoldWrites``: delta-rs, a kept handle per table (``core.handle``). delta-rs records
  an app transaction but skips nothing (``GoldBatchWriter`` checks first), and commits no
  MERGE that changes no row: an empty append then carries the fold's metadata
  (``core.commits.merge_recorded``).
- ``SparkGoldWrites``: Spark (``core.spark_writes``), in a session per table, so a fold in
  the background never waits for a step's append. Spark skips a commit whose app version it
  has recorded, and commits every MERGE; the versions a table records are read from Delta's
  snapshot in the JVM (``core.spark_writes.recorded_spark``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from core.captured import DIMS
from core.commits import (
    merge_recorded,
    newest,
    read_commits,
    read_commits_rs,
    recorded_rs,
    rs_commit,
)
from core.handle import WriterHandle
from core.storage import delta_rs_uri

# How far back a start looks for the metadata of ``_deltas``' newest step (its time, its
# transactions: descriptions only; maintenance commits between them).
HISTORY = 100


@dataclass(frozen=True)
class Waiting:
    """What ``_deltas`` holds when a writer starts (``GoldWrites.deltas``)."""

    step_lsn: int | None        # the newest step's watermark (its app transaction; None: none)
    meta: dict | None           # the newest lakecdc metadata of its history, if still there
    rows: pa.Table              # its rows (``gold.fold.DELTAS``)

# The fold's MERGE: a key's count moves by its delta; a new key starts at it.
_UPDATE = {"count": "{t}.count + s.delta",
           "last_commit_lsn": "greatest({t}.last_commit_lsn, s.last_commit_lsn)",
           "updated_at": "s.updated_at"}
_INSERT = {**{c: f"s.{c}" for c in DIMS}, "count": "s.delta",
           "last_commit_lsn": "s.last_commit_lsn", "updated_at": "s.updated_at"}


def _on(target: str) -> str:
    return " AND ".join(f"{target}.{c} = s.{c}" for c in DIMS)


def _update(target: str) -> dict:
    return {k: v.format(t=target) for k, v in _UPDATE.items()}


class GoldWrites(Protocol):
    def append_step(self, rows: pa.Table, meta: str, overwrite: bool,
                    app: tuple[str, int]) -> None:
        """Append a step's rows to ``_deltas`` (``overwrite``: replace what it holds) in one
        commit with ``meta`` and the app transaction ``app``."""

    def fold(self, source: pa.Table, meta: str, app: tuple[str, int] | None) -> dict:
        """MERGE key deltas (``KEY_DELTA_COLUMNS`` + ``updated_at``) into gold in one commit
        with ``meta`` and ``app``; delta-rs's MERGE metrics."""

    def recorded(self, app_id: str) -> int | None:
        """The version gold records for ``app_id`` (its app transaction)."""

    def deltas(self, step_app_id: str) -> Waiting:
        """What ``_deltas`` holds, its newest step's watermark recorded for
        ``step_app_id``."""


class RsGoldWrites:
    def __init__(self, gold: str, deltas: str, storage_options: dict | None = None) -> None:
        self.storage_options = storage_options
        self._gold = WriterHandle(delta_rs_uri(gold), storage_options)
        self._deltas = WriterHandle(delta_rs_uri(deltas), storage_options)

    def append_step(self, rows: pa.Table, meta: str, overwrite: bool,
                    app: tuple[str, int]) -> None:
        from deltalake import write_deltalake

        with self._deltas.use() as table:
            write_deltalake(table, rows, mode="overwrite" if overwrite else "append",
                            commit_properties=rs_commit(meta, *app))

    def fold(self, source: pa.Table, meta: str, app: tuple[str, int] | None) -> dict:
        commit = rs_commit(meta, *(app or (None, None)))
        with self._gold.use() as table:
            merge = (table.merge(source, _on("g"), source_alias="s", target_alias="g",
                                 commit_properties=commit)
                     .when_matched_update(updates=_update("g"))
                     .when_not_matched_insert(updates=_INSERT))
            return merge_recorded(table, merge, commit)

    def recorded(self, app_id: str) -> int | None:
        with self._gold.use() as table:
            return recorded_rs(table.table_uri, table=table).version_of(app_id)

    def deltas(self, step_app_id: str) -> Waiting:
        with self._deltas.use() as table:
            meta = newest(read_commits_rs(table.table_uri, self.storage_options,
                                          limit=HISTORY))
            return Waiting(recorded_rs(table.table_uri, table=table).version_of(step_app_id),
                           meta, table.to_pyarrow_table())


class SparkGoldWrites:
    def __init__(self, gold: str, deltas: str, spark_writes) -> None:
        from core.spark_writes import SparkWrites

        self.gold, self.deltas_path = gold, deltas
        self._folds = spark_writes
        self._steps = SparkWrites(spark_writes.spark)

    def append_step(self, rows: pa.Table, meta: str, overwrite: bool,
                    app: tuple[str, int]) -> None:
        self._steps.append(self.deltas_path, rows, meta=meta, overwrite=overwrite, app=app)

    def fold(self, source: pa.Table, meta: str, app: tuple[str, int] | None) -> dict:
        return self._folds.merge(self.gold, source, _on("t"), update=_update("t"),
                                 insert=_INSERT, meta=meta, app=app)

    def recorded(self, app_id: str) -> int | None:
        return self._folds.recorded(self.gold).version_of(app_id)

    def deltas(self, step_app_id: str) -> Waiting:
        session = self._steps.spark
        meta = newest(read_commits(session, self.deltas_path, limit=HISTORY))
        return Waiting(self._steps.recorded(self.deltas_path).version_of(step_app_id), meta,
                       session.read.format("delta").load(self.deltas_path).toArrow())


def gold_writes(gold: str, deltas: str, storage_options: dict | None = None,
                spark_writes=None) -> GoldWrites:
    """The engine of gold's commits: Spark when a ``SparkWrites`` is given, else delta-rs."""
    if spark_writes is not None:
        return SparkGoldWrites(gold, deltas, spark_writes)
    return RsGoldWrites(gold, deltas, storage_options)
