"""Typed current-state mirrors of the captured tables, kept from ``silver/changes``.

One Delta table per captured table, ``<lakehouse>/silver/tables/<schema>/<table>``: the
source's columns under their own names, typed by ``silver.mirrors.mirror_types``, plus
``_lakecdc_commit_lsn`` / ``_lakecdc_commit_ts`` (the source commit of the row's last change).
docs/silver.md, "Mirrors", is the user's account; the rules, per micro-batch of silver:

- The batch comes to the driver as Arrow (``silver.mirrors.store``: its files read by
  pyarrow where they are local, or collected by Spark) and each table's changes net to
  one row per primary key there (``silver.mirrors.net_changes.net_changes``), in
  ``(commit_lsn, seq)`` order: the last change decides whether the row exists; each column takes
  its value from the last change that carried it, so an UPDATE that leaves a TOASTed value out
  (wal2json omits it) keeps the mirror's value. An UPDATE that changes the key deletes the old key.
- A TRUNCATE empties the mirror: changes before the batch's last TRUNCATE of the table are
  dropped and the MERGE deletes every row its source does not name.
- One MERGE per changed table: the netted rows' columns that are not text are typed into
  the MERGE's source (``silver.mirrors.typed_rows``: ``typed_rows``, by Arrow where its cast
  reads the text as Spark's typing does, ``silver.mirrors.arrow_types``, else one Spark job on
  a local relation; or ``merge_source`` where a row moved key; ``silver.mirrors.mirror_types``
  is the types' rule), and delta-rs runs the MERGE (a Spark MERGE
  cost 1-2 s and a few CPU-seconds per table per batch, whatever its size; docs/gold.md) -
  or Spark does, where only Spark reaches storage (``silver.mirrors.store_spark.SparkMirrors``);
  two tables at a time (``MirrorWriter._tables``). It sets
  final rows, not increments, so re-applying a batch after a kill (before the query's
  checkpoint commit) leaves the same mirror; its Delta app transaction
  ``lakecdc-mirror@<query id>`` (``silver.mirrors.merge.txn_app_id``: batch ids count within
  one checkpoint, so a new one, over a silver made anew, has an app id of its own),
  version = batch id (times ``PARTS``, plus the part), is checked first, so the tables
  already merged are skipped without writing.
- A mirror whose MERGE is slow (a big table, ``LAKECDC_MIRROR_MERGE_S``) takes a plain
  part (no TRUNCATE, no key moved, not the changes held while it loaded) into its tail
  instead, drained into it in the background (``silver.mirrors.tail``); every tail is
  drained before a verify marker is recorded passed, and at the end of a run.
- A column added to the source appears in the mirror (``ALTER TABLE ADD COLUMNS`` before the
  MERGE, repeated harmlessly on a replay); a column whose type changed, a value that does not
  convert, or a change silver could not parse stops the mirrors with one sentence.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import inheritable_thread_target
from pyspark.sql import DataFrame, SparkSession

from core.commits import commit_metadata
from core.errors import UserError
from core.lsn import fmt
from core.switches import NONE, Switches
from silver.mirrors.merge import APP_ID, PARTS, MergeJob, q, txn_app_id
from silver.mirrors.mirror_table import TYPES_PROPERTY, mirrored_columns
from silver.mirrors.mirror_types import BAD_VALUE, spark_type
from silver.mirrors.net_changes import (
    MIRRORED_OPS,
    TableInBatch,
    after,
    column_values,
    complete_through,
    first_failure,
    in_order_range,
    key_moves,
    net_changes,
    tables_in_batch,
)
from silver.mirrors.store_rs import RsMirrors
from silver.mirrors.typed_rows import merge_source, typed_rows

log = logging.getLogger("lakecdc.mirror")

TIME_ZONE = "spark.sql.session.timeZone"     # the typing session keeps the query's
TABLE_THREADS = 2        # tables merged at a time (``MirrorWriter._tables``)
QUERY_ID = "sql.streaming.queryId"      # Spark's local property: the running query's id


def chain_cuts(moves: list[tuple]) -> list[tuple[int, int]]:
    """Where to split a batch's changes of one table so that no part moves a row twice: a
    key moved to (A -> B) and moved on (B -> C) in the same part would lose the columns the
    second UPDATE left out, which only the mirror's row of A holds. Returns the (commit_lsn,
    seq) each later part starts at. Pure."""
    cuts: list[tuple[int, int]] = []
    moved_in: set = set()
    for lsn, seq, old, new in moves:
        if old in moved_in:
            cuts.append((lsn, seq))
            moved_in = set()
        moved_in.add(new)
    return cuts


class MirrorStopped(UserError):
    """The mirrors cannot go on exactly; the sentence says why and what to do."""


@contextmanager
def bad_values_stop(table: str):
    """A value ``silver.mirrors.mirror_types.typed`` could not convert, raised inside a Spark job,
    as ``MirrorStopped``'s one sentence."""
    try:
        yield
    except Exception as exc:
        if BAD_VALUE not in str(exc):
            raise
        detail = str(exc).split(BAD_VALUE + ": ", 1)[1].split("\n", 1)[0]
        detail = detail.split(" SQLSTATE")[0]
        raise MirrorStopped(f"the mirror of {table} cannot hold a value of {detail!r} in its "
                            "type; mirrors stopped (docs/silver.md, \"Mirrors\": types)."
                            ) from None


class MirrorWriter:
    """The ``foreachBatch`` function of the mirrors' query (see the module docstring).

    ``paths``: schema.table → mirror path, for every mirrored table (created before the
    query starts). ``floors``: schema.table → the LSN of its initial rows; its changes
    below it are in them and are passed over. ``accept_errors_upto``: silver rows that
    failed to parse with a commit LSN at or below it are passed over (the operator checked
    them in quarantine)."""

    def __init__(self, paths: dict[str, str], accept_errors_upto: int = 0,
                 floors: dict[str, int] | None = None,
                 discover: Callable[[str], str | None] | None = None,
                 on_marker: Callable[[int, int], None] | None = None,
                 switches: Switches = NONE,
                 storage_options: dict | None = None,
                 after_batch: Callable[[], object] | None = None,
                 on_complete: Callable[[int, object], None] | None = None,
                 on_finish: Callable[[], None] | None = None,
                 store: RsMirrors | None = None,
                 loading: Callable[[], frozenset[str]] | None = None,
                 held: Callable[[str, int, tuple[int, int]], pa.Table] | None = None) -> None:
        self.paths = dict(paths)
        # The tables being loaded now (``lakecdc tables add``), asked at every batch: their
        # changes are held back, and applied from the load's floor once it is done, read
        # back from silver by ``held(table, floor, before)`` (the table's silver rows from
        # ``floor`` up to the batch's first ``(commit_lsn, seq)``, ``MIRROR_COLUMNS``).
        self.loading = loading
        self.held = held
        self._replays: dict[str, int] = {}      # table → floor: held changes to apply
        self._looked: set[str] = set()          # tables whose mirror was asked for a replay
        self._seen_loading: set[str] = set()
        self._replaying: dict[str, int] = {}    # this batch's replays (``_due_replays``)
        self.now_loading: frozenset[str] = frozenset()    # as the last batch found them
        # How the batch is read and each MERGE committed: delta-rs, or Spark where only it
        # reaches storage (``silver.mirrors.store``; the entry point chooses).
        self.store = store or RsMirrors(storage_options)
        self.on_finish = on_finish
        # Called with (commit LSN, commit time) after every batch that ends a transaction:
        # every mirror holds every source transaction up to it (``complete_through``).
        self.on_complete = on_complete
        # Called at the end of every batch, in the query's thread: the mirrors' maintenance
        # (``pipelines.maintain``), between two batches of their only writer.
        self.after_batch = after_batch
        self.storage_options = storage_options       # delta-rs's, for a lakehouse on S3
        self.switches = switches
        # Called with (LSN, batch id) of the newest verify marker of a batch once every
        # mirror holds that batch (``pipelines.verify.mirror_check``).
        self.on_marker = on_marker
        # A table without a mirror yet (captured while the query runs): its mirror's path
        # once created, or None (not mirrored; asked once per query).
        self.discover = discover
        self._unmirrored: set[str] = set()
        # path → (key, column → Postgres type): read from the mirror once, then kept here
        # as ``_evolve`` changes it (this query is the mirrors' only writer).
        self._shapes: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}
        self.floors = dict(floors or {})
        self.accept_errors_upto = accept_errors_upto
        self.failure: BaseException | None = None
        self.merged: dict[str, int] = {}        # table -> batches merged by this writer
        self.run = self.merged                  # what ``pipelines.run.stream.await_stream`` returns
        self._typing_session: SparkSession | None = None
        self._busy = threading.Lock()           # held through each batch (``idle``)
        self._app = APP_ID                      # the batch's app id (``batch_app_id``)

    def __getstate__(self) -> dict:
        """Without its lock (Spark Connect pickles a ``foreachBatch`` function)."""
        return {k: v for k, v in self.__dict__.items() if k != "_busy"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._busy = threading.Lock()

    def idle(self) -> None:
        """Between batches (``pipelines.run.stream.await_stream`` and ``run`` ask each
        writer, from their own thread): each batch commits its MERGEs; a tail's drain that is
        due (``silver.mirrors.store_rs.RsMirrors.drain_due``) starts or is collected here too
        when no batch comes, so a big mirror's table catches up once the traffic stops.
        Never beside a batch: a running one holds ``_busy``."""
        if self._busy.acquire(blocking=False):
            try:
                self.store.drain_due(self._mirrors())
            finally:
                self._busy.release()

    def finish(self) -> None:
        """After the last batch: each batch committed its MERGEs (see ``idle``), and each
        mirror's tail is drained into its table (a run that ends leaves every mirror's table
        whole); what records the mirrors' progress lets its connection go."""
        if self.failure is None:
            self.store.drain_all(self._mirrors())
        if self.on_finish is not None:
            self.on_finish()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            with self._busy:
                self._batch(batch, batch_id)
        except BaseException as exc:
            self.failure = exc
            raise

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        self._app = batch_app_id(batch)
        rows = self.store.rows(batch)
        failed = first_failure(rows, self.accept_errors_upto)
        if failed:
            raise MirrorStopped(
                f"a change at commit LSN {fmt(failed[0])} failed to parse ({failed[1]}), so "
                "no mirror can say it holds it; mirrors stopped. Check silver/quarantine, "
                "then pass over it with `lakecdc mirrors --accept-errors-upto` "
                "(docs/silver.md, \"Mirrors\").")
        spark = batch.sparkSession
        loading = self.loading() if self.loading is not None else frozenset()
        self.now_loading = loading
        replays = self._due_replays(loading)
        keys = {name: self._shape(spark, path)[0] for name, path in self.paths.items()}
        found_tables, marker = tables_in_batch(rows, keys)
        if replays:
            # The held changes of each table whose load is done go before the batch's own.
            before = _first_position(rows)
            held = [self.held(name, floor, before) for name, floor in replays.items()]
            found_tables, _ = tables_in_batch(
                pa.concat_tables([h.cast(rows.schema) for h in held] + [rows]), keys)
            # A table with nothing held nor new still gets its MERGE, which records that
            # its held changes are applied (``replayed``).
            named = {f.name for f in found_tables}
            empty = found_tables[0].rows.slice(0, 0) if found_tables else None
            found_tables += [TableInBatch(*n.split(".", 1), None, {}, rows=(
                empty if empty is not None else _no_rows(rows))) for n in replays
                if n not in named]
            self.floors.update(replays)
        self._replaying = replays
        work = []
        for found in found_tables:
            if found.name in loading:
                continue                       # held back until its load is done
            path = self.paths.get(found.name)
            if path is None and self.discover is not None \
                    and found.name not in self._unmirrored:
                path = self.discover(found.name)
                if path is None:
                    self._unmirrored.add(found.name)
                else:
                    self.paths[found.name] = path
            if path is None:
                continue                       # captured without a mirror (docs/silver.md)
            work.append((found, path))
        self._tables(spark, rows, batch_id, work)
        for name in replays:
            del self._replays[name]
            log.info("mirror of %s: the changes held while it loaded are applied (from %s)",
                     name, fmt(replays[name]))
        complete = complete_through(rows)
        if complete is not None and self.on_complete is not None:
            self.on_complete(*complete)
        if marker is not None and self.on_marker is not None:
            self.store.drain_all(self._mirrors())    # each mirror's table holds its changes
            self.on_marker(marker, batch_id)     # every mirror holds the batch now
        self.store.drain_due(self._mirrors())
        if self.after_batch is not None:
            self.after_batch()

    def _mirrors(self) -> list[str]:
        """The paths of the mirrors kept now (not those being loaded: the load writes
        them), whose tails are drained, one an earlier run left included."""
        return [p for n, p in self.paths.items() if n not in self.now_loading]

    def _due_replays(self, loading: frozenset[str]) -> dict[str, int]:
        """table → floor, of the mirrors whose load is done and whose held changes are not
        applied yet (``silver.mirrors.merge.due_replay``): each mirror is asked once, and
        again after its table was seen loading."""
        for name in self._seen_loading - loading:          # its load is done (or stopped)
            self._seen_loading.discard(name)
            self._looked.discard(name)
            if name in self.paths:
                self._shapes.pop(self.paths[name], None)     # a load may change its shape
                self.store.changed_beside(self.paths[name])  # ... and empty its tail
        self._seen_loading |= loading
        if self.held is None:
            return {}
        for name, path in self.paths.items():
            if name in loading or name in self._looked:
                continue
            self._looked.add(name)
            floor = self.store.replay_due(path)
            if floor is not None:
                self._replays[name] = floor
        return {n: f for n, f in self._replays.items() if n not in loading}

    def _tables(self, spark: SparkSession, rows: pa.Table, batch_id: int,
                work: list[tuple[TableInBatch, str]]) -> None:
        """Each table's MERGEs; ``TABLE_THREADS`` tables at a time. A table's Spark job
        and MERGE are mostly the driver's waiting (planning, scheduling, a commit), so two
        tables overlap well on two cores. Every table is done (or failed) before the batch
        ends; the first failure is raised."""
        self._typing(spark)                     # made once, before the threads share it
        if len(work) <= 1:
            for found, path in work:
                self._table(spark, rows, batch_id, found, path)
            return
        run = inheritable_thread_target(
            lambda item: self._table(spark, rows, batch_id, *item))
        with ThreadPoolExecutor(TABLE_THREADS, thread_name_prefix="lakecdc-mirror") as pool:
            futures = [pool.submit(run, item) for item in work]
        for future in futures:
            future.result()

    def _table(self, spark: SparkSession, rows: pa.Table, batch_id: int, found: TableInBatch,
               path: str) -> None:
        key, types = self._evolve(spark, path, found)
        changes = found.rows.filter(pc.field("op").isin(MIRRORED_OPS)
                                    & (pc.field("commit_lsn") >= self.floors.get(found.name, 0)))
        if found.truncated is not None:
            changes = after(changes, found.truncated)
        # An UPDATE carrying its old row's identity may still keep its key (a replica
        # identity of more columns than the key, like the counted tables'): only a batch
        # whose key really changed pays for reading the mirror's old rows.
        moves = key_moves(changes, key) if found.moved else []
        bounds = [None, *chain_cuts(moves), None]
        for part, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            self._merge(spark, path, in_order_range(changes, lo, hi), key, types, found,
                        batch_id, part, truncate=part == 0 and found.truncated is not None,
                        last=hi is None, moved=bool(moves))
        self.merged[found.name] = self.merged.get(found.name, 0) + 1

    def _merge(self, spark: SparkSession, path: str, changes: pa.Table, key: tuple[str, ...],
               types: dict[str, str], found: TableInBatch, batch_id: int, part: int,
               truncate: bool, last: bool, moved: bool) -> None:
        """One MERGE of ``changes`` (part ``part`` of the batch's changes of the table;
        ``moved``: some of the batch's changes move a row to another key)."""
        from delta.tables import DeltaTable

        def source():
            typing = self._typing(spark)
            values = column_values(net_changes(changes, key, key_moves=moved),
                                   mirrored_columns(key, types))
            with bad_values_stop(found.name):
                if not moved:
                    return typed_rows(typing, values, key, types)
                mirror = DeltaTable.forPath(typing, path).toDF()
                # One chunk: delta-rs's MERGE panicked on the chunks this plan's toArrow
                # gave in batches that move keys (an out-of-range offset in arrow-rs's
                # concatenation; tests/integration/test_mirrors.py).
                return merge_source(typing.createDataFrame(values), key, types,
                                    mirror).toArrow().combine_chunks()

        # ``newest``: the mirror now holds every change of its table up to this LSN
        # (``pipelines.verify.mirror_check``); not after a batch's part but the last, which may
        # end inside a transaction. A batch's parts are told apart by the version.
        held = {"newest": found.newest} if last else {"partial": True}
        if last and found.name in self._replaying:   # the changes held while it loaded:
            held["replayed"] = self._replaying[found.name]    # all applied with this part
        meta = commit_metadata("mirror", batch_id=batch_id, part=part, truncated=truncate,
                               **held)
        plain = not truncate and not moved and "replayed" not in held
        merged = self.store.merge(MergeJob(path, batch_id * PARTS + part, meta, source, key,
                                           types, truncate, plain, self._app))
        if merged:
            self.switches.hit("after_mirror_merge")
        if "replayed" in held:
            # After the MERGE (or its replay, skipped): a kill between the two replays the
            # batch, whose MERGE is then skipped and this recorded.
            self.store.mark_replayed(path, held["replayed"], meta)

    def _typing(self, spark: SparkSession) -> SparkSession:
        """The session the MERGE sources are typed in: one of its own (``newSession``:
        the context's settings, not the low-latency ones a continuous run gives its
        queries, ``core.spark.low_latency``), so Spark compiles the typing expressions.
        Their plan is the same batch after batch, so the code is compiled once; interpreted,
        a batch of ~3,000 of the benchmark's notifications took 0.4-1.0 s to type, compiled
        0.23-0.35 s (2 cores, under 2,000 changes/s)."""
        if self._typing_session is None:
            session = spark.newSession()
            session.conf.set(TIME_ZONE, spark.conf.get(TIME_ZONE))
            self._typing_session = session
        return self._typing_session

    def _evolve(self, spark: SparkSession, path: str,
                found: TableInBatch) -> tuple[tuple[str, ...], dict[str, str]]:
        """The mirror's key and (column → type), after adding the columns the batch's
        changes carry and the mirror lacks; a retyped column stops the mirrors."""
        from delta.tables import DeltaTable

        key, types = self._shape(spark, path)
        retyped = {n: t for n, t in found.types.items() if n in types and types[n] != t}
        if retyped:
            name, new = next(iter(retyped.items()))
            raise MirrorStopped(
                f"column {name} of {found.name} changed type from {types[name]} to {new}; "
                "its mirror cannot hold both, so mirrors stopped (docs/silver.md, "
                "\"Mirrors\": schema changes).")
        added = {n: t for n, t in found.types.items() if n not in types}
        if added:
            self.store.drain(path)               # the tail in the table's columns, first
            have = set(DeltaTable.forPath(spark, path).toDF().columns)   # a replay's
            columns = ", ".join(f"{q(n)} {spark_type(t).simpleString()}"
                                for n, t in added.items() if n not in have)
            types = {**types, **added}
            if columns:
                spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                      f"('{TYPES_PROPERTY}' = {_sql_string(json.dumps(types))})")
            self._shapes[path] = (key, types)
            self.store.changed_beside(path)     # Spark committed beside the MERGEs' handle
            log.info("mirror of %s: added column(s) %s", found.name, ", ".join(added))
        return key, types

    def _shape(self, spark: SparkSession, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
        if path not in self._shapes:
            self._shapes[path] = self.store.shape(path)
        return self._shapes[path]


def batch_app_id(batch: DataFrame) -> str:
    """The app id of the mirrors' writes for ``batch`` (``txn_app_id``): of the query running
    it, a ``foreachBatch`` call in the query's thread, whose id its checkpoint keeps - the
    same across restarts from that checkpoint, another with a new one."""
    return txn_app_id(batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID))


def _no_rows(rows: pa.Table) -> pa.Table:
    """No row, in the columns a table's changes keep (``ROW_COLUMNS``)."""
    from silver.mirrors.net_changes import ROW_COLUMNS

    return rows.select(list(ROW_COLUMNS)).slice(0, 0)


def _first_position(rows: pa.Table) -> tuple[int, int]:
    """The smallest ``(commit_lsn, seq)`` of a batch's rows (past every row: none)."""
    if rows.num_rows == 0:
        return (1 << 63) - 1, 0
    lsn = rows["commit_lsn"].to_numpy(zero_copy_only=False)
    seq = rows["seq"].to_numpy(zero_copy_only=False)
    first = int(lsn.min())
    return first, int(seq[lsn == first].min())


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
