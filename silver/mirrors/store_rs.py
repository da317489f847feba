"""The mirrors' tables through delta-rs (``silver.mirrors.store``'s text): ``RsMirrors``,
the default, with its own performance path, the tail (``silver.mirrors.tail``): a mirror
whose MERGE is slow takes its batches into an append-only tail, drained into its table in
the background (``drain_tail``), on kept handles of its own (``core.handle``).
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from core.commits import commit_metadata
from core.config import LOG_RETENTION_MINUTES
from core.engine.delta_rs import DeltaRs, merge_recorded, rs_commit
from core.handle import WriterHandle
from core.storage import delta_rs_uri
from core.switches import NONE, Switches
from silver.mirrors.merge import (
    HISTORY,
    MergeJob,
    batch_meta,
    due_replay,
    merge_clauses,
    start_point,
)
from silver.mirrors.mirror_table import (
    LOAD_APP_ID,
    REPLAYED_APP_ID,
    TYPES_PROPERTY,
    mirror_properties,
    mirror_shape_of,
    mirrored_columns,
)
from silver.mirrors.net_changes import MIRROR_COLUMNS
from silver.mirrors.tail import (
    DRAIN_SHARE,
    MAX_TAIL_ROWS,
    VERSION,
    as_tail,
    drop_tail,
    net_tail,
    tail_path,
    tail_schema,
)

log = logging.getLogger("lakecdc.mirror")


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


@dataclass
class Tail:
    """A mirror's tail as its writer knows it (``silver.mirrors.tail``)."""

    exists: bool
    rows: int
    cost: float = 0.0               # seconds its last MERGE or drain took
    drained_at: float = 0.0          # ``time.monotonic()`` of its last drain


@dataclass(frozen=True)
class Drained:
    """A drain's MERGE (``drain_tail``): the tail's rows up to ``top`` are in the table."""

    path: str
    top: int                        # the newest version drained
    rows: int
    seconds: float


def drain_tail(path: str, storage_options: dict | None, key: tuple[str, ...],
              types: dict[str, str], app: str | None = None) -> Drained | None:
    """MERGE the mirror's tail, as it is now, into its table (``silver.mirrors.tail``:
    its rows netted to one per key), both opened anew (a thread of its own may run it);
    None when the tail is empty. The MERGE carries that batch's metadata
    (``pipelines.verify.mirror_check`` reads it) and the app transaction ``app`` at the tail's
    newest version where the tail's rows are ``app``'s (the query's epoch): rows of
    another epoch are drained without it, since their versions count other batch ids.
    Either way the tail keeps the transactions of its appends."""
    from deltalake import DeltaTable

    from core.features import open_table

    start = time.monotonic()
    tail = DeltaTable(delta_rs_uri(tail_path(path)), storage_options=storage_options)
    rows = tail.to_pyarrow_table()
    if not rows.num_rows:
        return None
    top = int(pc.max(rows[VERSION]).as_py())
    meta = batch_meta([c.get("userMetadata") for c in tail.history(HISTORY)], top)
    table = open_table(delta_rs_uri(path), storage_options)
    ours = app is not None and tail.transaction_version(app) is not None
    merge_changes(table, net_tail(rows, key, mirrored_columns(key, types)), key, types,
                  rs_commit(meta, app, top) if ours else rs_commit(meta))
    return Drained(path, top, rows.num_rows, time.monotonic() - start)


class RsMirrors:
    """The mirrors' tables through delta-rs (see the module's text): one kept handle per
    mirror and per tail. A mirror whose MERGE took more than ``merge_s`` seconds takes its
    next batches into its tail, drained by ``drain_due`` (``silver.mirrors.tail``); a tail is
    created with its log kept ``log_retention_minutes`` (``mirror_properties``).
    ``engine``: the pipeline's delta-rs engine (None: one for ``storage_options``), for the
    callers that read or write beside the mirrors (``engine`` of every store); the MERGEs
    and the tails use handles of their own."""

    def __init__(self, storage_options: dict | None = None, switches: Switches = NONE,
                 merge_s: float = float("inf"),
                 log_retention_minutes: int = LOG_RETENTION_MINUTES,
                 engine: DeltaRs | None = None) -> None:
        if storage_options is None and engine is not None:
            storage_options = engine.storage_options
        self.engine = engine if engine is not None else DeltaRs(storage_options)
        self.storage_options = storage_options
        self.guard = switches.on("mirror_txn")
        self.merge_s = merge_s
        self.log_retention_minutes = log_retention_minutes
        self._handles: dict[str, WriterHandle] = {}
        self._tails: dict[str, Tail] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._draining: tuple[str, Future] | None = None    # a drain in the background
        # The app id of the query's epoch, once a batch brought it (``MergeJob.app``): the
        # drains' MERGEs record it where the tail's rows are of that epoch.
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
                self.drain(job.path)     # rows of another epoch: their versions go first
            self._append(job, tail)
            return True
        self.drain(job.path)
        start = time.monotonic()
        with self._handle(job.path).use() as table:
            commit = rs_commit(job.meta, job.app, job.version)
            merge_changes(table, job.source(), job.key, job.types, commit, job.truncate)
        tail.cost = time.monotonic() - start
        return True

    def drain(self, path: str) -> None:
        """MERGE the mirror's tail into its table, here and now (after its drain running in
        the background, if any): the table then holds every batch the tail took. Called
        by the thread that writes this mirror in a batch
        (``silver.mirrors.mirror_writer.TABLE_THREADS`` tables at a time), or between batches."""
        self._settle(wait=True, path=path)
        if self._tail(path).rows:
            key, types = self.shape(path)
            self._drained(drain_tail(path, self.storage_options, key, types, self.app))

    def drain_due(self, paths: Iterable[str] = ()) -> None:
        """Between two batches: collect a drain that ended; else, none running, start one
        of a tail (of ``paths``' mirrors, and any this writer wrote) whose drains would take
        at most ``DRAIN_SHARE`` of the time since its last, or that holds
        ``MAX_TAIL_ROWS``. It runs in a thread of its own (delta-rs's
        MERGE lets go of the interpreter), beside the next batches: they go to the tail,
        and the table has no other writer meanwhile (a batch that needs the table waits
        for it, ``drain``)."""
        if not self._settle(wait=False):
            return
        now = time.monotonic()
        for path in self._known(paths):
            tail = self._tail(path)
            if tail.rows and (tail.rows >= MAX_TAIL_ROWS
                              or now - tail.drained_at >= tail.cost / DRAIN_SHARE):
                key, types = self.shape(path)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="lakecdc-drain")
                self._draining = (path, self._pool.submit(drain_tail, path,
                                                         self.storage_options, key, types,
                                                         self.app))
                return

    def drain_all(self, paths: Iterable[str] = ()) -> None:
        """Drain every tail (of ``paths``' mirrors, and any this writer wrote): each mirror's
        table then holds all its changes (a verify marker passed, ``pipelines.verify.
        mirrors``; the end of a run). A tail an earlier run left, of a table that has not
        changed since, is drained too."""
        for path in self._known(paths):
            self.drain(path)

    def _known(self, paths: Iterable[str]) -> list[str]:
        return list(dict.fromkeys([*paths, *self._tails]))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No drain inside the block (the mirrors' maintenance, in the query's thread, which
        alone starts drains): a running one is waited for."""
        self._settle(wait=True)
        yield

    def _settle(self, wait: bool, path: str | None = None) -> bool:
        """Whether no drain (of ``path``'s tail, if given) runs in the background; one that
        ended (or, ``wait``, once it ends) is collected here, its failure raised. Only the
        thread that writes that tail collects it: its rows are dropped from the tail."""
        if self._draining is None or path not in (None, self._draining[0]):
            return True
        if not wait and not self._draining[1].done():
            return False
        (_, future), self._draining = self._draining, None
        self._drained(future.result())
        return True

    def _drained(self, done: "Drained | None") -> None:
        """After a drain's MERGE: the rows it drained dropped from the tail (which only this
        thread writes); a kill before drains them again, to the same table."""
        if done is None:
            return
        self._handle(done.path).reset()         # the drain committed beside the kept handle
        tail = self._tails[done.path]
        with self._handle(tail_path(done.path)).use() as tail_table:
            metrics = tail_table.delete(f"{VERSION} <= {done.top}", commit_properties=rs_commit(
                commit_metadata("mirror", folded=done.top)))
        tail.rows = max(0, tail.rows - int(metrics.get("num_deleted_rows") or 0))
        tail.cost, tail.drained_at = done.seconds, time.monotonic()
        log.info("mirror at %s: %d rows of its tail merged in %.2f s", done.path, done.rows,
                 done.seconds)

    def drop_tail(self, path: str) -> None:
        """Empty the mirror's tail, unmerged: its table was replaced (new initial rows)."""
        drop_tail(path, self.storage_options, rs_commit(commit_metadata("mirror", folded=None)))
        self._handle(tail_path(path)).reset()
        self._tails.pop(path, None)

    def _append(self, job: MergeJob, tail: Tail) -> None:
        from deltalake import write_deltalake

        with self._handle(job.path).use() as table:
            base = pa.schema(table.schema().to_arrow())
        rows = as_tail(job.source(), tail_schema(base, job.key, mirrored_columns(
            job.key, job.types)), job.version)
        commit = rs_commit(job.meta, job.app, job.version)
        uri = tail_path(job.path)
        if not tail.exists:
            write_deltalake(delta_rs_uri(uri), rows, mode="append", schema_mode="merge",
                            commit_properties=commit, storage_options=self.storage_options,
                            configuration=mirror_properties(self.log_retention_minutes))
            tail.exists = True
        else:
            with self._handle(uri).use() as tail_table:
                write_deltalake(tail_table, rows, mode="append", schema_mode="merge",
                                commit_properties=commit)
        tail.rows += rows.num_rows

    def _tail(self, path: str) -> Tail:
        if path not in self._tails:
            from deltalake import DeltaTable

            uri = delta_rs_uri(tail_path(path))
            exists = DeltaTable.is_deltatable(uri, storage_options=self.storage_options)
            rows = _rows_of(DeltaTable(uri, storage_options=self.storage_options)) \
                if exists else 0
            self._tails[path] = Tail(exists, rows, drained_at=time.monotonic())
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
        with self._handle(tail_path(path)).use() as tail_table:
            return tail_table.transaction_version(app)

    def changed_beside(self, path: str) -> None:
        """Another writer committed to the mirror beside the kept handles: Spark (a column
        added), or a load (``tables add``), which may also have emptied its tail."""
        self._settle(wait=True, path=path)
        self._handle(path).reset()
        self._handle(tail_path(path)).reset()
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
        metadata ``meta`` (what the mirror holds, as ``pipelines.verify.mirror_check`` reads
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
        """The kept handle of a mirror's table, or of its tail (``tail_path``)."""
        if path not in self._handles:
            self._handles[path] = WriterHandle(delta_rs_uri(path), self.storage_options)
        return self._handles[path]


def _rows_of(table) -> int:
    """The rows of a delta-rs table, from its files' statistics."""
    files = pa.table(table.get_add_actions(flatten=True))
    return int(pc.sum(files["num_records"]).as_py() or 0) if files.num_rows else 0
