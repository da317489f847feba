"""How the mirrors reach their tables: the one place that knows the two engines.

``MirrorWriter`` (``silver.mirror``) folds and types each table's changes the same way
whatever the engine; what differs is only how it reads its batch, how it asks whether a
MERGE is recorded already, and who commits the MERGE:

- ``RsMirrors`` (the default): the batch's Parquet files read by pyarrow where they are local
  (``silver.writer.batch_rows``), and a delta-rs MERGE on a kept table handle, whose app
  transaction ``lakecdc-mirror`` is read first (delta-rs skips no replay by itself);
- ``SparkMirrors`` (``LAKECDC_WRITER=spark``: only Spark holds the storage credentials): the
  batch collected by Spark (``toArrow``), and the MERGE committed by ``core.spark_writes``
  with the same metadata and app transaction. Spark itself skips a MERGE whose version is
  recorded; the writer's own check (the newest mirror commit's batch and part, read from
  the table's history once, then kept: the mirrors' query is its tables' only writer) saves
  typing a replayed batch.

Both MERGEs are ``merge_clauses``: the rules are written once. Switched off (the
``mirror_txn`` guard, a negative control only), neither check runs and the Spark MERGE
carries no app transaction, so a replayed batch is merged again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from core.commits import merge_recorded, parse_commit_metadata, rs_commit
from core.handle import WriterHandle
from core.storage import delta_rs_uri
from silver.mirror_fold import HAS_PREFIX, MIRROR_COLUMNS
from silver.mirror_table import (  # noqa: F401
    COMMIT_LSN,
    COMMIT_TS,
    TYPES_PROPERTY,
    mirror_shape_of,
)

APP_ID = "lakecdc-mirror"
PARTS = 1_000_000       # txn version = batch id * PARTS + the part of the batch (chain_cuts)
EXISTS = "__lakecdc_exists"
HISTORY = 100           # commits searched for the newest MERGE's batch (Spark)


def q(name: str) -> str:
    """A column name quoted for a Spark SQL expression."""
    return "`" + name.replace("`", "``") + "`"


def mirrored_columns(key: tuple[str, ...], types: dict[str, str]) -> list[str]:
    """The mirror's non-key columns, in the order ``silver.mirror.merge_source`` numbers
    them."""
    return [n for n in types if n not in key]


@dataclass(frozen=True)
class MergeClauses:
    """A mirror's MERGE of ``merge_source``'s rows (``s``) into the mirror (``t``): a key
    whose final row does not exist is deleted; one that exists is updated, each non-key
    column from the source where the batch carried it (else kept: a TOASTed value an
    UPDATE left out), or inserted. A TRUNCATE's part also deletes every row the source
    does not name (``truncate`` of the engines' ``merge``)."""

    on: str
    delete_when: str
    update: dict[str, str]
    insert: dict[str, str]
    exists: str


def merge_clauses(key: tuple[str, ...], types: dict[str, str]) -> MergeClauses:
    """The MERGE's conditions and column expressions, for either engine. Pure."""
    meta = {COMMIT_LSN: f"s.{COMMIT_LSN}", COMMIT_TS: f"s.{COMMIT_TS}"}
    update = {q(n): f"CASE WHEN s.{q(f'{HAS_PREFIX}{i}')} THEN s.{q(n)} ELSE t.{q(n)} END"
              for i, n in enumerate(mirrored_columns(key, types))}
    return MergeClauses(on=" AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key),
                        delete_when=f"NOT s.{EXISTS}", update={**update, **meta},
                        insert={**{q(n): f"s.{q(n)}" for n in types}, **meta},
                        exists=f"s.{EXISTS}")


def merge_changes(table, source, key: tuple[str, ...], types: dict[str, str], commit,
                  truncate: bool = False) -> dict:
    """The mirror's MERGE (delta-rs) of ``source`` (``merge_source``'s rows, in Arrow) into
    ``table``, committed with ``commit``; its metrics."""
    c = merge_clauses(key, types)
    merge = (table.merge(source, c.on, source_alias="s", target_alias="t",
                         commit_properties=commit)
             .when_matched_delete(predicate=c.delete_when)
             .when_matched_update(updates=c.update, predicate=c.exists)
             .when_not_matched_insert(updates=c.insert, predicate=c.exists))
    if truncate:
        merge = merge.when_not_matched_by_source_delete()
    return merge_recorded(table, merge, commit)


@dataclass(frozen=True)
class MergeJob:
    """One MERGE of a part of a batch: ``source()`` types its rows (called only when the
    MERGE is not recorded yet)."""

    path: str
    version: int                    # its app transaction's
    meta: str                       # lakecdc's commit metadata
    source: Callable[[], pa.Table]
    key: tuple[str, ...]
    types: dict[str, str]
    truncate: bool = False


class RsMirrors:
    """The mirrors' tables through delta-rs (see the module's text): one kept handle per
    mirror."""

    writes = None                   # no Spark writer: every read and write is delta-rs's

    def __init__(self, storage_options: dict | None = None, guard: bool = True) -> None:
        self.storage_options = storage_options
        self.guard = guard
        self._handles: dict[str, WriterHandle] = {}

    def rows(self, batch) -> pa.Table:
        from silver.writer import batch_rows

        return batch_rows(batch, MIRROR_COLUMNS)

    def merge(self, job: MergeJob) -> bool:
        """Commit ``job`` unless its version is recorded; False: a replay, skipped."""
        with self._handle(job.path).use() as table:
            recorded = table.transaction_version(APP_ID) if self.guard else None
            if recorded is not None and recorded >= job.version:
                return False                            # merged before a kill: a replay
            commit = rs_commit(job.meta, APP_ID, job.version)
            merge_changes(table, job.source(), job.key, job.types, commit, job.truncate)
        return True

    def changed_beside(self, path: str) -> None:
        """Spark committed to the mirror beside the kept handle (a column added)."""
        self._handle(path).reset()

    def shape(self, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """The mirror's key and (column → Postgres type), from its table properties: a
        read of its log. Through Spark's ``detail()`` it took 2.9 s for five mirrors at
        the query's first batch (docs/silver.md, the catch-up)."""
        from deltalake import DeltaTable

        return mirror_shape_of(DeltaTable(delta_rs_uri(path),
                                          storage_options=self.storage_options)
                               .metadata().configuration)

    def seed_state(self, path: str, app_id: str) -> tuple[int | None, dict[str, str]]:
        """The version of ``app_id`` the mirror records (its initial rows) and its
        column → Postgres type."""
        from deltalake import DeltaTable

        table = DeltaTable(delta_rs_uri(path), storage_options=self.storage_options)
        return (table.transaction_version(app_id),
                json.loads(table.metadata().configuration[TYPES_PROPERTY]))

    def replay_due(self, path: str) -> int | None:
        """``due_replay`` of the mirror's newest commits."""
        from deltalake import DeltaTable

        return due_replay([c.get("userMetadata") for c in DeltaTable(
            delta_rs_uri(path), storage_options=self.storage_options).history(HISTORY)])

    def _handle(self, path: str) -> WriterHandle:
        if path not in self._handles:
            self._handles[path] = WriterHandle(delta_rs_uri(path), self.storage_options)
        return self._handles[path]


class SparkMirrors:
    """The mirrors' tables through Spark (see the module's text); ``writes``: the mirrors'
    own ``core.spark_writes.SparkWrites``."""

    def __init__(self, writes, guard: bool = True) -> None:
        self.writes = writes
        self.guard = guard
        self._recorded: dict[str, int | None] = {}      # path → the newest MERGE's version

    def rows(self, batch) -> pa.Table:
        return batch.select(*MIRROR_COLUMNS).toArrow()

    def merge(self, job: MergeJob) -> bool:
        """Commit ``job`` unless its version is recorded; False: a replay, skipped (by this
        check or by Spark's own)."""
        if self.guard:
            recorded = self.recorded(job.path)
            if recorded is not None and recorded >= job.version:
                return False
        c = merge_clauses(job.key, job.types)
        self.writes.merge(job.path, job.source(), c.on, delete=c.delete_when, update=c.update,
                          update_when=c.exists, insert=c.insert, insert_when=c.exists,
                          delete_unmatched=job.truncate, meta=job.meta,
                          app=(APP_ID, job.version) if self.guard else None)
        self._recorded[job.path] = job.version
        return True

    def changed_beside(self, path: str) -> None:
        """Nothing kept that a commit beside it makes stale (Spark reads the log anew)."""

    def shape(self, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """As ``RsMirrors.shape``, from Spark's ``detail()``."""
        return mirror_shape(self.writes.spark, path)

    def seed_state(self, path: str, app_id: str) -> tuple[int | None, dict[str, str]]:
        """As ``RsMirrors.seed_state``; the initial rows' point from the newest commit
        that seeded the mirror (its metadata's ``seed``: Spark has no reader of app
        transactions but its own skip)."""
        from delta.tables import DeltaTable

        table = DeltaTable.forPath(self.writes.spark, path)
        types = json.loads(table.detail().first().properties[TYPES_PROPERTY])
        for row in (table.history(HISTORY).select("version", "userMetadata")
                    .orderBy("version", ascending=False).collect()):
            meta = parse_commit_metadata(row.userMetadata, "mirror")
            if meta is not None and "seed" in meta:
                return int(meta["seed"]), types
        return None, types

    def replay_due(self, path: str) -> int | None:
        """``due_replay`` of the mirror's newest commits."""
        from delta.tables import DeltaTable

        return due_replay([r.userMetadata for r in DeltaTable.forPath(
            self.writes.spark, path).history(HISTORY).select("version", "userMetadata")
            .orderBy("version", ascending=False).collect()])

    def recorded(self, path: str) -> int | None:
        """The version of the mirror's newest MERGE: its batch and part, from the newest
        mirror commit's metadata that has them (None: none in ``HISTORY`` commits)."""
        if path not in self._recorded:
            self._recorded[path] = recorded_version(self.writes.spark, path)
        return self._recorded[path]


def mirror_shape(spark, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(Spark) A mirror's key and (column → Postgres type), from its table properties."""
    from delta.tables import DeltaTable

    return mirror_shape_of(DeltaTable.forPath(spark, path).detail().first().properties)


def due_replay(metadata: list[str | None]) -> int | None:
    """From a mirror's newest commits' metadata (newest first): the floor of a load of
    its table (``pipelines.setup.mirror_load``) that is complete, when no MERGE has applied
    the changes held back meanwhile since (its metadata's ``replayed``); else None. Pure."""
    for text in metadata:
        meta = parse_commit_metadata(text, "mirror")
        if meta is None:
            continue
        if "replayed" in meta:
            return None
        if meta.get("complete") and "load" in meta:
            return int(meta["seed"])
    return None


def recorded_version(spark, path: str) -> int | None:
    """(Spark) The app transaction version of the mirror's newest MERGE, from lakecdc's
    metadata in its history."""
    from delta.tables import DeltaTable

    for row in (DeltaTable.forPath(spark, path).history(HISTORY)
                .select("version", "userMetadata").orderBy("version", ascending=False)
                .collect()):
        meta = parse_commit_metadata(row.userMetadata, "mirror")
        if meta is not None and "batch_id" in meta:
            return int(meta["batch_id"]) * PARTS + int(meta.get("part") or 0)
    return None


def mirror_store(writes=None, storage_options: dict | None = None, guard: bool = True):
    """The mirrors' engine: Spark's with ``writes`` (a ``SparkWrites``; the entry point
    makes one where ``Config.spark_writes``), else delta-rs's."""
    return SparkMirrors(writes, guard) if writes is not None else RsMirrors(storage_options,
                                                                            guard)
