"""How the mirrors reach their tables: the one place that knows the two engines.

``MirrorWriter`` (``silver.mirror``) folds and types each table's changes the same way
whatever the engine; what differs is only how it reads its batch, how it asks whether a
MERGE is recorded already, and who commits the MERGE:

- ``RsMirrors`` (the default): the batch's Parquet files read by pyarrow where they are local
  (``silver.writer.batch_rows``), and a delta-rs MERGE on a kept table handle, whose app
  transaction ``lakecdc-mirror@<query id>`` is read first (delta-rs skips no replay by
  itself); or, for a mirror whose MERGE is slow (a big table), an append of the MERGE's
  source to the mirror's tail, folded into its table in the background
  (``silver.mirror_pending``);
- ``SparkMirrors`` (``LAKECDC_WRITER=spark``: only Spark holds the storage credentials): the
  batch collected by Spark (``toArrow``), and the MERGE committed by ``core.spark_writes``
  with the same metadata and app transaction. Spark itself skips a MERGE whose version is
  recorded; the writer's own check (the app transaction of the table and its tail, read
  through the session's Delta log once, then kept: the mirrors' query is its tables' only
  writer) saves typing a replayed batch.

The app id carries the query's *epoch*: ``lakecdc-mirror@<query id>``, the id Spark keeps
in the mirrors' checkpoint (``txn_app_id``). Batch ids are numbered within one checkpoint,
and a new one numbers from 0 again (silver made anew, ``pipelines.run.mirrors.start_mirrors``,
or a checkpoint removed): under one app id its batches would be taken for the old ones that
the mirrors record and skipped. A tail's rows of another epoch are folded before the tail
takes one of this epoch's (their versions are not comparable).

Whether a replay is due is read from app transactions too (``due_replay``), never from the
table's history: a checkpoint carries them, while log cleanup deletes the commits whose
metadata said the same.

Both MERGEs are ``merge_clauses``: the rules are written once. Switched off (the
``mirror_txn`` guard, a negative control only), neither check runs and the Spark MERGE
carries no app transaction, so a replayed batch is merged again.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from core.commits import commit_metadata, merge_recorded, parse_commit_metadata, rs_commit
from core.config import LOG_RETENTION_MINUTES
from core.handle import WriterHandle
from core.storage import delta_rs_uri
from silver.mirror_fold import MIRROR_COLUMNS
from silver.mirror_pending import (
    FOLD_SHARE,
    MAX_PENDING_ROWS,
    VERSION,
    as_tail,
    drop_tail,
    fold_pending,
    pending_path,
    tail_schema,
)
from silver.mirror_table import (  # noqa: F401
    COMMIT_LSN,
    COMMIT_TS,
    EXISTS,
    HAS_PREFIX,
    LOAD_APP_ID,
    PROPERTIES,
    REPLAYED_APP_ID,
    SEED_APP_ID,
    TYPES_PROPERTY,
    mirror_properties,
    mirror_shape_of,
    mirrored_columns,
)

log = logging.getLogger("lakecdc.mirror")

APP_ID = "lakecdc-mirror"
PARTS = 1_000_000       # txn version = batch id * PARTS + the part of the batch (chain_cuts)
# Commits searched for the metadata of a tail's newest batch, which its fold carries into
# the table (``_batch_meta``; ``pipelines.verify.mirrors`` reads it); no decision reads it.
HISTORY = 100


def txn_app_id(epoch: str | None) -> str:
    """The app id of the mirrors' writes in ``epoch``: the id of the query (its checkpoint)
    whose batch ids their versions count (None: an app id without one, for a caller with no
    query)."""
    return APP_ID if epoch is None else f"{APP_ID}@{epoch}"


def q(name: str) -> str:
    """A column name quoted for a Spark SQL expression."""
    return "`" + name.replace("`", "``") + "`"


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
    # Neither a TRUNCATE, nor a key moved (whose source reads the mirror's table), nor the
    # changes held while the table loaded (recorded beside the table's own MERGE,
    # ``mark_replayed``): such a part may go to the tail (``silver.mirror_pending``).
    plain: bool = False
    app: str = APP_ID               # its app transaction's id: the query's (``txn_app_id``)


@dataclass
class Tail:
    """A mirror's tail as its writer knows it (``silver.mirror_pending``)."""

    exists: bool
    rows: int
    cost: float = 0.0               # seconds its last MERGE or fold took
    folded_at: float = 0.0          # ``time.monotonic()`` of its last fold


@dataclass(frozen=True)
class Folded:
    """A fold's MERGE (``fold_tail``): the tail's rows up to ``top`` are in the table."""

    path: str
    top: int                        # the newest version folded
    rows: int
    seconds: float


def fold_tail(path: str, storage_options: dict | None, key: tuple[str, ...],
              types: dict[str, str], app: str | None = None) -> Folded | None:
    """MERGE the mirror's tail, as it is now, into its table (``silver.mirror_pending``:
    its rows folded to one per key), both opened anew (a thread of its own may run it);
    None when the tail is empty. The MERGE carries that batch's metadata
    (``pipelines.verify.mirrors`` reads it) and the app transaction ``app`` at the tail's
    newest version where the tail's rows are ``app``'s (the query's epoch): rows of
    another epoch are folded without it, since their versions count other batch ids.
    Either way the tail keeps the transactions of its appends."""
    from deltalake import DeltaTable

    from core.features import open_table

    start = time.monotonic()
    tail = DeltaTable(delta_rs_uri(pending_path(path)), storage_options=storage_options)
    rows = tail.to_pyarrow_table()
    if not rows.num_rows:
        return None
    top = int(pc.max(rows[VERSION]).as_py())
    meta = _batch_meta([c.get("userMetadata") for c in tail.history(HISTORY)], top)
    table = open_table(delta_rs_uri(path), storage_options)
    ours = app is not None and tail.transaction_version(app) is not None
    merge_changes(table, fold_pending(rows, key, mirrored_columns(key, types)), key, types,
                  rs_commit(meta, app, top) if ours else rs_commit(meta))
    return Folded(path, top, rows.num_rows, time.monotonic() - start)


class RsMirrors:
    """The mirrors' tables through delta-rs (see the module's text): one kept handle per
    mirror and per tail. A mirror whose MERGE took more than ``merge_s`` seconds takes its
    next batches into its tail, folded by ``fold_due`` (``silver.mirror_pending``); a tail is
    created with its log kept ``log_retention_minutes`` (``mirror_properties``)."""

    writes = None                   # no Spark writer: every read and write is delta-rs's

    def __init__(self, storage_options: dict | None = None, guard: bool = True,
                 merge_s: float = float("inf"),
                 log_retention_minutes: int = LOG_RETENTION_MINUTES) -> None:
        self.storage_options = storage_options
        self.guard = guard
        self.merge_s = merge_s
        self.log_retention_minutes = log_retention_minutes
        self._handles: dict[str, WriterHandle] = {}
        self._tails: dict[str, Tail] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._folding: tuple[str, Future] | None = None    # a fold in the background
        # The app id of the query's epoch, once a batch brought it (``MergeJob.app``): the
        # folds' MERGEs record it where the tail's rows are of that epoch.
        self.app: str | None = None

    def rows(self, batch) -> pa.Table:
        from silver.writer import batch_rows

        return batch_rows(batch, MIRROR_COLUMNS)

    def merge(self, job: MergeJob) -> bool:
        """Commit ``job`` unless its version is recorded for its app id (in the mirror's
        table or its tail); False: a replay, skipped."""
        self.app = job.app
        tail = self._tail(job.path)
        if self.guard:
            recorded = self._recorded(job.path, tail, job.app)
            if recorded is not None and recorded >= job.version:
                return False                            # merged before a kill: a replay
        if job.plain and (tail.rows or self.merge_s == 0 or tail.cost > self.merge_s):
            if tail.rows and self._tail_version(job.path, job.app) is None:
                self.fold(job.path)     # rows of another epoch: their versions go first
            self._append(job, tail)
            return True
        self.fold(job.path)
        start = time.monotonic()
        with self._handle(job.path).use() as table:
            commit = rs_commit(job.meta, job.app, job.version)
            merge_changes(table, job.source(), job.key, job.types, commit, job.truncate)
        tail.cost = time.monotonic() - start
        return True

    def fold(self, path: str) -> None:
        """MERGE the mirror's tail into its table, here and now (after its fold running in
        the background, if any): the table then holds every batch the tail took. Called
        by the thread that writes this mirror in a batch (``silver.mirror.TABLE_THREADS``
        tables at a time), or between batches."""
        self._settle(wait=True, path=path)
        if self._tail(path).rows:
            key, types = self.shape(path)
            self._folded(fold_tail(path, self.storage_options, key, types, self.app))

    def fold_due(self, paths: Iterable[str] = ()) -> None:
        """Between two batches: collect a fold that ended; else, none running, start one
        of a tail (of ``paths``' mirrors, and any this writer wrote) whose folds would take
        at most ``FOLD_SHARE`` of the time since its last, or that holds
        ``MAX_PENDING_ROWS``. It runs in a thread of its own (delta-rs's
        MERGE lets go of the interpreter), beside the next batches: they go to the tail,
        and the table has no other writer meanwhile (a batch that needs the table waits
        for it, ``fold``)."""
        if not self._settle(wait=False):
            return
        now = time.monotonic()
        for path in self._known(paths):
            tail = self._tail(path)
            if tail.rows and (tail.rows >= MAX_PENDING_ROWS
                              or now - tail.folded_at >= tail.cost / FOLD_SHARE):
                key, types = self.shape(path)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="lakecdc-fold")
                self._folding = (path, self._pool.submit(fold_tail, path,
                                                         self.storage_options, key, types,
                                                         self.app))
                return

    def fold_all(self, paths: Iterable[str] = ()) -> None:
        """Fold every tail (of ``paths``' mirrors, and any this writer wrote): each mirror's
        table then holds all its changes (a verify marker passed, ``pipelines.verify.
        mirrors``; the end of a run). A tail an earlier run left, of a table that has not
        changed since, is folded too."""
        for path in self._known(paths):
            self.fold(path)

    def _known(self, paths: Iterable[str]) -> list[str]:
        return list(dict.fromkeys([*paths, *self._tails]))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No fold inside the block (the mirrors' maintenance, in the query's thread, which
        alone starts folds): a running one is waited for."""
        self._settle(wait=True)
        yield

    def _settle(self, wait: bool, path: str | None = None) -> bool:
        """Whether no fold (of ``path``'s tail, if given) runs in the background; one that
        ended (or, ``wait``, once it ends) is collected here, its failure raised. Only the
        thread that writes that tail collects it: its rows are dropped from the tail."""
        if self._folding is None or path not in (None, self._folding[0]):
            return True
        if not wait and not self._folding[1].done():
            return False
        (_, future), self._folding = self._folding, None
        self._folded(future.result())
        return True

    def _folded(self, done: "Folded | None") -> None:
        """After a fold's MERGE: the rows it folded dropped from the tail (which only this
        thread writes); a kill before folds them again, to the same table."""
        if done is None:
            return
        self._handle(done.path).reset()         # the fold committed beside the kept handle
        tail = self._tails[done.path]
        with self._handle(pending_path(done.path)).use() as pending:
            metrics = pending.delete(f"{VERSION} <= {done.top}", commit_properties=rs_commit(
                commit_metadata("mirror", folded=done.top)))
        tail.rows = max(0, tail.rows - int(metrics.get("num_deleted_rows") or 0))
        tail.cost, tail.folded_at = done.seconds, time.monotonic()
        log.info("mirror at %s: %d rows of its tail merged in %.2f s", done.path, done.rows,
                 done.seconds)

    def drop_tail(self, path: str) -> None:
        """Empty the mirror's tail, unmerged: its table was replaced (new initial rows)."""
        drop_tail(path, self.storage_options, rs_commit(commit_metadata("mirror", folded=None)))
        self._handle(pending_path(path)).reset()
        self._tails.pop(path, None)

    def _append(self, job: MergeJob, tail: Tail) -> None:
        from deltalake import write_deltalake

        with self._handle(job.path).use() as table:
            base = pa.schema(table.schema().to_arrow())
        rows = as_tail(job.source(), tail_schema(base, job.key, mirrored_columns(
            job.key, job.types)), job.version)
        commit = rs_commit(job.meta, job.app, job.version)
        uri = pending_path(job.path)
        if not tail.exists:
            write_deltalake(delta_rs_uri(uri), rows, mode="append", schema_mode="merge",
                            commit_properties=commit, storage_options=self.storage_options,
                            configuration=mirror_properties(self.log_retention_minutes))
            tail.exists = True
        else:
            with self._handle(uri).use() as pending:
                write_deltalake(pending, rows, mode="append", schema_mode="merge",
                                commit_properties=commit)
        tail.rows += rows.num_rows

    def _tail(self, path: str) -> Tail:
        if path not in self._tails:
            from deltalake import DeltaTable

            uri = delta_rs_uri(pending_path(path))
            exists = DeltaTable.is_deltatable(uri, storage_options=self.storage_options)
            rows = _rows_of(DeltaTable(uri, storage_options=self.storage_options)) \
                if exists else 0
            self._tails[path] = Tail(exists, rows, folded_at=time.monotonic())
        return self._tails[path]

    def _recorded(self, path: str, tail: Tail, app: str) -> int | None:
        with self._handle(path).use() as table:
            versions = [table.transaction_version(app)]
        if tail.exists:
            versions.append(self._tail_version(path, app))
        return max((v for v in versions if v is not None), default=None)

    def _tail_version(self, path: str, app: str) -> int | None:
        """The newest version of ``app`` the mirror's tail took (None: none, or no tail)."""
        if not self._tail(path).exists:
            return None
        with self._handle(pending_path(path)).use() as pending:
            return pending.transaction_version(app)

    def changed_beside(self, path: str) -> None:
        """Another writer committed to the mirror beside the kept handles: Spark (a column
        added), or a load (``tables add``), which may also have emptied its tail."""
        self._settle(wait=True, path=path)
        self._handle(path).reset()
        self._handle(pending_path(path)).reset()
        self._tails.pop(path, None)

    def shape(self, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """The mirror's key and (column → Postgres type), from its table properties: a
        read of its log, not Spark's ``detail()``, which took seconds for a few mirrors at
        the query's first batch."""
        from deltalake import DeltaTable

        return mirror_shape_of(DeltaTable(delta_rs_uri(path),
                                          storage_options=self.storage_options)
                               .metadata().configuration)

    def seed_state(self, path: str) -> tuple[int | None, dict[str, str]]:
        """The point of the mirror's initial rows (``start_point``) and its column →
        Postgres type."""
        table = self._fresh(path)
        return (start_point(table.transaction_version),
                json.loads(table.metadata().configuration[TYPES_PROPERTY]))

    def replay_due(self, path: str) -> int | None:
        """``due_replay`` of the mirror's app transactions (a load commits beside the kept
        handle: read anew)."""
        table = self._fresh(path)
        return due_replay(table.transaction_version(LOAD_APP_ID),
                          table.transaction_version(REPLAYED_APP_ID))

    def mark_replayed(self, path: str, floor: int, meta: str) -> None:
        """Record that the changes held while the load of floor ``floor`` ran are applied
        (``due_replay``): an empty commit after the MERGE that applied them, with its
        metadata ``meta`` (what the mirror holds, as ``pipelines.verify.mirrors`` reads
        it from the newest commit)."""
        from deltalake import write_deltalake

        with self._handle(path).use() as table:
            write_deltalake(table, pa.schema(table.schema().to_arrow()).empty_table(),
                            mode="append",
                            commit_properties=rs_commit(meta, REPLAYED_APP_ID, floor))

    def _fresh(self, path: str):
        from deltalake import DeltaTable

        return DeltaTable(delta_rs_uri(path), storage_options=self.storage_options)

    def _handle(self, path: str) -> WriterHandle:
        """The kept handle of a mirror's table, or of its tail (``pending_path``)."""
        if path not in self._handles:
            self._handles[path] = WriterHandle(delta_rs_uri(path), self.storage_options)
        return self._handles[path]


class SparkMirrors:
    """The mirrors' tables through Spark (see the module's text); ``writes``: the mirrors'
    own ``core.spark_writes.SparkWrites``."""

    def __init__(self, writes, guard: bool = True) -> None:
        self.writes = writes
        self.guard = guard
        self._recorded: dict[tuple[str, str], int | None] = {}  # (path, app) → its newest
        self._settled: set[str] = set()         # mirrors whose tail was looked at

    def rows(self, batch) -> pa.Table:
        return batch.select(*MIRROR_COLUMNS).toArrow()

    def merge(self, job: MergeJob) -> bool:
        """Commit ``job`` unless its version is recorded; False: a replay, skipped (by this
        check or by Spark's own). Every batch is MERGEd into the mirror's table."""
        self.fold(job.path, job.app)
        if self.guard:
            recorded = self.recorded(job.path, job.app)
            if recorded is not None and recorded >= job.version:
                return False
        c = merge_clauses(job.key, job.types)
        self.writes.merge(job.path, job.source(), c.on, delete=c.delete_when, update=c.update,
                          update_when=c.exists, insert=c.insert, insert_when=c.exists,
                          delete_unmatched=job.truncate, meta=job.meta,
                          app=(job.app, job.version) if self.guard else None)
        self._recorded[(job.path, job.app)] = job.version
        return True

    def fold(self, path: str, app: str | None = None) -> None:
        """Fold a tail the delta-rs writer left (``RsMirrors.fold``; its MERGE records
        ``app`` only where the tail's rows are ``app``'s, as ``fold_tail``'s), once per
        query: this writer keeps none."""
        from delta.tables import DeltaTable

        if path in self._settled:
            return
        self._settled.add(path)
        spark, tail = self.writes.spark, pending_path(path)
        if not tail_exists_spark(spark, path):
            return
        rows = spark.read.format("delta").load(tail).toArrow()
        if rows.num_rows:
            key, types = self.shape(path)
            c = merge_clauses(key, types)
            top = int(pc.max(rows[VERSION]).as_py())
            meta = _batch_meta([r.userMetadata for r in DeltaTable.forPath(
                spark, tail).history(HISTORY).collect()], top)
            ours = app is not None and self._version_of(tail, app) is not None
            self.writes.merge(path, fold_pending(rows, key, mirrored_columns(key, types)),
                              c.on, delete=c.delete_when, update=c.update,
                              update_when=c.exists, insert=c.insert, insert_when=c.exists,
                              meta=meta, app=(app, top) if ours else None)
            self._recorded = {k: v for k, v in self._recorded.items() if k[0] != path}
        self.drop_tail(path)

    def fold_due(self, paths: Iterable[str] = ()) -> None:
        """Nothing: this writer keeps no tail."""

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing to pause: this writer folds nothing in the background."""
        yield

    def fold_all(self, paths: Iterable[str] = ()) -> None:
        """Nothing: this writer keeps no tail (one left is folded at its first MERGE)."""

    def drop_tail(self, path: str) -> None:
        """Empty the mirror's tail, if it has one (``RsMirrors.drop_tail``)."""
        drop_tail_spark(self.writes.spark, path)

    def changed_beside(self, path: str) -> None:
        """Nothing kept that a commit beside it makes stale (Spark reads the log anew)."""

    def shape(self, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """As ``RsMirrors.shape``, from Spark's ``detail()``."""
        return mirror_shape(self.writes.spark, path)

    def seed_state(self, path: str) -> tuple[int | None, dict[str, str]]:
        """As ``RsMirrors.seed_state``, the app transactions read from Spark's snapshot of
        the table (``SparkWrites.recorded``)."""
        from delta.tables import DeltaTable

        types = json.loads(DeltaTable.forPath(self.writes.spark, path).detail().first()
                           .properties[TYPES_PROPERTY])
        return start_point(self.writes.recorded(path).version_of), types

    def replay_due(self, path: str) -> int | None:
        """As ``RsMirrors.replay_due``."""
        recorded = self.writes.recorded(path)
        return due_replay(recorded.version_of(LOAD_APP_ID),
                          recorded.version_of(REPLAYED_APP_ID))

    def mark_replayed(self, path: str, floor: int, meta: str) -> None:
        """As ``RsMirrors.mark_replayed``: an empty append (Spark skips it where the
        version is recorded already)."""
        empty = self.writes.spark.read.format("delta").load(path).limit(0).toArrow()
        self.writes.append(path, empty, meta=meta, app=(REPLAYED_APP_ID, floor))

    def recorded(self, path: str, app: str) -> int | None:
        """The newest version of ``app`` the mirror records, in its table or in a tail the
        delta-rs writer left (None: none): read once, then kept (this query is its only
        writer)."""
        if (path, app) not in self._recorded:
            versions = [self._version_of(path, app)]
            if tail_exists_spark(self.writes.spark, path):
                versions.append(self._version_of(pending_path(path), app))
            self._recorded[(path, app)] = max((v for v in versions if v is not None),
                                              default=None)
        return self._recorded[(path, app)]

    def _version_of(self, path: str, app: str) -> int | None:
        """The version of ``app`` the table at ``path`` records (None: none, or no table)."""
        recorded = self.writes.recorded(path)
        return None if recorded is None else recorded.version_of(app)


def current_mirror(spark, path: str, table=None):
    """(Spark) The current rows of the Delta table at ``path``: a mirror's table with its
    tail laid over it as ``silver.mirror_pending.current_rows`` does (any other table, or a
    mirror without a tail, as it is). The tail is read now (it is small: at most
    ``MAX_PENDING_ROWS``), the table when the DataFrame runs. ``table``: the table as
    already read (e.g. through a catalog's name for it); None: read from ``path``."""
    from pyspark.sql import functions as F

    table = spark.read.format("delta").load(path) if table is None else table
    tail = pending_path(path)
    if not tail_exists_spark(spark, path):
        return table
    rows = spark.read.format("delta").load(tail).toArrow()
    if rows.num_rows == 0:
        return table
    key, types = mirror_shape(spark, path)
    others = mirrored_columns(key, types)
    folded = spark.createDataFrame(fold_pending(rows, key, others))
    kept = table.join(folded.select(*[q(k) for k in key]), list(key), "left_anti")
    made = folded.where(F.col(EXISTS)).alias("s").join(
        table.alias("t"), [F.col(f"s.{q(k)}") == F.col(f"t.{q(k)}") for k in key], "left")
    columns = []
    for name in table.columns:
        if name in others and name in folded.columns:
            value = F.when(F.col(f"s.{q(HAS_PREFIX + str(others.index(name)))}"),
                           F.col(f"s.{q(name)}")).otherwise(F.col(f"t.{q(name)}"))
        elif name in folded.columns:
            value = F.col(f"s.{q(name)}")
        else:                                   # a column the tail does not have yet
            value = F.col(f"t.{q(name)}")
        columns.append(value.cast(table.schema[name].dataType).alias(name))
    return kept.unionByName(made.select(*columns))


def mirror_shape(spark, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(Spark) A mirror's key and (column → Postgres type), from its table properties."""
    from delta.tables import DeltaTable

    return mirror_shape_of(DeltaTable.forPath(spark, path).detail().first().properties)


def _rows_of(table) -> int:
    """The rows of a delta-rs table, from its files' statistics."""
    files = pa.table(table.get_add_actions(flatten=True))
    return int(pc.sum(files["num_records"]).as_py() or 0) if files.num_rows else 0


def _batch_meta(metadata: list[str | None], version: int) -> str:
    """Of a tail's commits' metadata, that of the batch part of app transaction version
    ``version``: its fold carries it into the mirror's table."""
    for text in metadata:
        meta = parse_commit_metadata(text, "mirror")
        if meta is not None and "batch_id" in meta \
                and int(meta["batch_id"]) * PARTS + int(meta.get("part") or 0) == version:
            return text
    return commit_metadata("mirror")


def tail_exists_spark(spark, path: str) -> bool:
    """(Spark) Whether the mirror at ``path`` has a tail (``core.tables.is_table``)."""
    from core.tables import is_table

    return is_table(spark, pending_path(path))


def drop_tail_spark(spark, path: str) -> None:
    """(Spark) Empty the tail of the mirror at ``path``, if it has one, unmerged."""

    tail = pending_path(path)
    if tail_exists_spark(spark, path):
        (spark.read.format("delta").load(tail).limit(0).write.format("delta")
         .mode("overwrite").option("userMetadata", commit_metadata("mirror", folded=None))
         .save(tail))


def due_replay(loaded: int | None, replayed: int | None) -> int | None:
    """From a mirror's app transactions: the floor of its newest complete load
    (``pipelines.setup.mirror_load``, ``LOAD_APP_ID``) while the changes held back during
    that load are not applied yet, i.e. no ``REPLAYED_APP_ID`` at that floor
    (``mark_replayed``); else None. A later load has a later floor. Pure."""
    if loaded is None or (replayed is not None and replayed >= loaded):
        return None
    return loaded


def start_point(transaction_version: Callable[[str], int | None]) -> int | None:
    """The point of a mirror's initial rows, from its app transactions
    (``transaction_version(app id)``): the newer of a baseline's seed (``SEED_APP_ID``) and
    a complete load (``LOAD_APP_ID``); None: it started empty. Its changes below it are in
    those rows."""
    points = [transaction_version(SEED_APP_ID), transaction_version(LOAD_APP_ID)]
    return max((p for p in points if p is not None), default=None)


def mirror_store(writes=None, storage_options: dict | None = None, guard: bool = True,
                 merge_s: float = float("inf"),
                 log_retention_minutes: int = LOG_RETENTION_MINUTES):
    """The mirrors' engine: Spark's with ``writes`` (a ``SparkWrites``; the entry point
    makes one where ``Config.spark_writes``), else delta-rs's, keeping a tail (its log kept
    ``log_retention_minutes``) for each mirror whose MERGE takes more than ``merge_s``
    seconds."""
    return SparkMirrors(writes, guard) if writes is not None else RsMirrors(
        storage_options, guard, merge_s, log_retention_minutes)
