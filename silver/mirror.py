"""Typed current-state mirrors of the captured tables, kept from ``silver/changes``.

One Delta table per captured table, ``<lakehouse>/silver/tables/<schema>/<table>``: the
source's columns under their own names, typed by ``silver.mirror_types``, plus
``_lakecdc_commit_lsn`` / ``_lakecdc_commit_ts`` (the source commit of the row's last change).
docs/silver.md, "Mirrors", is the user's account; the rules, per micro-batch of silver:

- A table's changes fold to one row per primary key (``final_rows``), in ``(commit_lsn,
  seq)`` order: the last change decides whether the row exists; each column takes its value
  from the last change that carried it, so an UPDATE that leaves a TOASTed value out (wal2json
  omits it) keeps the mirror's value. An UPDATE that changes the key deletes the old key.
- A TRUNCATE empties the mirror: changes before the batch's last TRUNCATE of the table are
  dropped and the MERGE deletes every row its source does not name.
- One MERGE per changed table: Spark folds and types the changes into the MERGE's source,
  which comes to the driver as Arrow, and delta-rs runs the MERGE (a Spark MERGE cost 1-2
  s and a few CPU-seconds per table per batch, whatever its size; docs/gold.md). It sets
  final rows, not increments, so re-applying a batch after a kill (before the query's
  checkpoint commit) leaves the same mirror; its Delta app transaction ``lakecdc-mirror``,
  version = batch id (times ``PARTS``, plus the part), is checked first, so the tables
  already merged are skipped without writing.
- A column added to the source appears in the mirror (``ALTER TABLE ADD COLUMNS`` before the
  MERGE, repeated harmlessly on a replay); a column whose type changed, a value that does not
  convert, or a change silver could not parse stops the mirrors with one sentence.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from core.captured import MARKER_PREFIX
from core.commits import commit_metadata, merge_recorded, rs_commit
from core.errors import UserError
from core.faults import FaultPoints
from core.handle import CHECKPOINTS, WriterHandle
from core.lsn import fmt
from core.storage import delta_rs_uri
from core.tables import create_table
from silver.mirror_types import BAD_VALUE, spark_type, typed
from silver.parse import MESSAGE_ACTION

log = logging.getLogger("lakecdc.mirror")

APP_ID = "lakecdc-mirror"
SEED_APP_ID = "lakecdc-mirror-seed"     # the initial rows (``pipelines.run.mirrors.seed_mirror``)
COMMIT_LSN, COMMIT_TS = "_lakecdc_commit_lsn", "_lakecdc_commit_ts"
KEY_PROPERTY = "lakecdc.keyColumns"          # JSON list of the primary key's columns
TYPES_PROPERTY = "lakecdc.sourceTypes"       # JSON {column: Postgres type}
# No deletion vectors: delta-rs (deltalake 1.6.6) refuses to read a table with that reader
# feature, and a mirror is read by delta-rs (``lakecdc tables``, the demo, users).
PROPERTIES = {"delta.enableDeletionVectors": "false", **CHECKPOINTS}
MIRRORED_OPS = ("I", "U", "D", "R")

PARTS = 1_000_000       # txn version = batch id * PARTS + the part of the batch (chain_cuts)
_EXISTS, _HAS = "__lakecdc_exists", "__lakecdc_has_"
_TEXT_MAP = MapType(StringType(), StringType())


@dataclass(frozen=True)
class TableSpec:
    """A captured table as its mirror is created: columns (name, Postgres type as wal2json
    names it) in the source's order, and the primary key."""

    schema: str
    table: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def q(name: str) -> str:
    """A column name quoted for a Spark SQL expression."""
    return "`" + name.replace("`", "``") + "`"


def mirror_schema(columns: list[tuple[str, str]]) -> StructType:
    return StructType([*[StructField(n, spark_type(t)) for n, t in columns],
                       StructField(COMMIT_LSN, LongType()),
                       StructField(COMMIT_TS, TimestampType())])


def create_mirror(spark: SparkSession, path: str, spec: TableSpec) -> None:
    """Create the mirror of ``spec`` at ``path`` unless it exists (idempotent)."""
    create_table(spark, path, mirror_schema(list(spec.columns)),
                 {**PROPERTIES, KEY_PROPERTY: json.dumps(list(spec.key)),
                  TYPES_PROPERTY: json.dumps(dict(spec.columns))},
                 comment=f"lakecdc mirror of {spec.name}")


def final_rows(changes: DataFrame, key: tuple[str, ...], key_moves: bool = True) -> DataFrame:
    """One table's silver changes (ops I, U, D, R) folded to one row per key: ``_key``
    (the key's text values), ``_exists`` (False: delete it), ``_values`` (column → text of
    every column some change after the last delete carried; later changes win), ``_from``
    (the old key when the row's state begins with an UPDATE that moved it there: the columns
    that UPDATE left out are the old row's), ``_lsn`` / ``_ts`` (the newest change). Pure;
    the rules are the module docstring's. ``key_moves=False``: no change moves a row to
    another key (``_moves`` found none), so the plan leaves out looking for the old rows."""
    new_key = F.struct(*[F.col("columns")[k].alias(k) for k in key])
    old_key = F.struct(*[F.col("identity")[k].alias(k) for k in key])
    empty = F.create_map().cast(_TEXT_MAP)

    def event(k: Column, sub: int, upsert: bool, values: Column, src: Column) -> Column:
        return F.struct(k.alias("k"), F.lit(sub).alias("sub"), F.lit(upsert).alias("upsert"),
                        values.alias("vals"), src.alias("src"))

    op = F.col("op")
    moved = (op == "U") & F.col("identity").isNotNull() & (old_key != new_key)
    no_key = F.lit(None).cast(StructType([StructField(k, StringType()) for k in key]))
    delete_old = event(old_key, 0, False, empty, no_key)
    upsert_new = event(new_key, 1, True, F.col("columns"),
                       F.when(moved, old_key))
    events = (F.when(op == "D", F.array(delete_old))
              .when(moved, F.array(delete_old, upsert_new))
              .otherwise(F.array(upsert_new)))
    flat = changes.select("commit_lsn", "seq", "commit_ts", F.inline(events))
    order = F.struct("commit_lsn", "seq", "sub")
    grouped = flat.groupBy("k").agg(
        F.collect_list(F.struct(order.alias("o"), "upsert", "vals", "src")).alias("evs"),
        F.max_by("commit_ts", order).alias("_ts"),
        F.max("commit_lsn").alias("_lsn"))
    order_type = StructType([StructField("commit_lsn", LongType()),
                             StructField("seq", IntegerType()), StructField("sub", IntegerType())])

    def ordered(evs: Column) -> Column:
        return F.array_sort(evs, lambda l, r: F.when(l["o"] < r["o"], -1)
                            .when(l["o"] > r["o"], 1).otherwise(0))
    start = F.struct(F.lit(False).alias("exists"), empty.alias("vals"), no_key.alias("src"),
                     F.lit(None).cast(order_type).alias("at"))

    def step(acc: Column, e: Column) -> Column:
        kept = F.map_filter(acc["vals"], lambda k, _: ~F.map_contains_key(e["vals"], k))
        moved_in = e["src"].isNotNull()
        return (F.when(e["upsert"] & moved_in,      # the row arrives from another key
                       F.struct(F.lit(True).alias("exists"), e["vals"].alias("vals"),
                                e["src"].alias("src"), e["o"].alias("at")))
                .when(e["upsert"], F.struct(F.lit(True).alias("exists"),
                                            F.map_concat(kept, e["vals"]).alias("vals"),
                                            acc["src"].alias("src"), acc["at"].alias("at")))
                .otherwise(start))

    state = grouped.select("k", F.aggregate(ordered(F.col("evs")), start, step).alias("s"),
                           "_lsn", "_ts")
    if not key_moves:
        return state.select(F.col("k").alias("_key"), F.col("s.exists").alias("_exists"),
                            F.col("s.vals").alias("_values"), F.col("s.src").alias("_from"),
                            "_lsn", "_ts")
    # A moved row takes the columns its UPDATE left out from the old key's values in this
    # batch before the move (and, in ``merge_source``, from the mirror's old row).
    moves = state.where(F.col("s.src").isNotNull()).select(
        F.col("k").alias("_to"), F.col("s.src").alias("_src"), F.col("s.at").alias("_at"))
    # (Columns by name, not ``frame[...]``: both sides descend from ``flat``.)
    before = (flat.join(moves, (F.col("k") == F.col("_src"))
                        & (F.struct("commit_lsn", "seq") < F.struct(F.col("_at.commit_lsn"),
                                                                    F.col("_at.seq"))))
              .groupBy("_to").agg(F.collect_list(F.struct(order.alias("o"), "upsert", "vals",
                                                           "src")).alias("evs"))
              .select(F.col("_to"), F.aggregate(ordered(F.col("evs")), start, step)["vals"]
                      .alias("_before")))
    joined = state.join(before, F.col("k") == F.col("_to"), "left")
    vals = F.col("s.vals")
    inherited = F.map_filter(F.coalesce(F.col("_before"), empty),
                             lambda k, _: ~F.map_contains_key(vals, k))
    return joined.select(F.col("k").alias("_key"), F.col("s.exists").alias("_exists"),
                         F.when(F.col("s.src").isNotNull(), F.map_concat(inherited, vals))
                         .otherwise(vals).alias("_values"),
                         F.col("s.src").alias("_from"), "_lsn", "_ts")


def merge_source(final: DataFrame, key: tuple[str, ...], types: dict[str, str],
                 mirror: DataFrame | None = None) -> DataFrame:
    """``final_rows`` typed as the mirror's columns (``types``: column → Postgres type),
    with ``__lakecdc_exists`` and, per non-key column ``i``, ``__lakecdc_has_<i>``: whether
    it is set (else the MERGE keeps the mirror's value). ``mirror`` (the mirror as the batch
    starts): a row moved from another key takes the columns its UPDATE left out from the
    mirror's row at that key."""
    values = F.col("_values")
    cols = [typed(F.col("_key")[k], types[k], k).alias(k) for k in key]
    others = [(n, t) for n, t in types.items() if n not in key]
    if mirror is not None:
        old = mirror.select(*[F.col(q(k)).alias(f"__old_k{i}") for i, k in enumerate(key)],
                            *[F.col(q(n)).alias(f"__old_{i}") for i, (n, _) in
                              enumerate(others)], F.lit(True).alias("__old"))
        final = final.join(old, [typed(F.col("_from")[k], types[k], k) == F.col(f"__old_k{i}")
                                 for i, k in enumerate(key)], "left")
    for i, (name, pg_type) in enumerate(others):
        carried = F.map_contains_key(values, name)
        value = typed(F.try_element_at(values, F.lit(name)), pg_type, name)
        if mirror is not None:
            value = F.when(carried, value).otherwise(F.col(f"__old_{i}"))
            carried = carried | F.col("__old").isNotNull()
        cols += [value.alias(name), carried.alias(f"{_HAS}{i}")]
    return final.select(*cols, F.col("_exists").alias(_EXISTS),
                        F.col("_lsn").alias(COMMIT_LSN), F.col("_ts").alias(COMMIT_TS))


def merge_changes(table, source, key: tuple[str, ...], types: dict[str, str], commit,
                  truncate: bool = False) -> dict:
    """The mirror's MERGE (delta-rs) of ``source`` (``merge_source``'s rows, in Arrow) into
    ``table``, committed with ``commit``; its metrics."""
    on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key)
    others = [n for n in types if n not in key]
    update = {q(n): f"CASE WHEN s.{q(f'{_HAS}{i}')} THEN s.{q(n)} ELSE t.{q(n)} END"
              for i, n in enumerate(others)}
    meta = {COMMIT_LSN: f"s.{COMMIT_LSN}", COMMIT_TS: f"s.{COMMIT_TS}"}
    merge = (table.merge(source, on, source_alias="s", target_alias="t",
                         commit_properties=commit)
             .when_matched_delete(predicate=f"NOT s.{_EXISTS}")
             .when_matched_update(updates={**update, **meta}, predicate=f"s.{_EXISTS}")
             .when_not_matched_insert(updates={**{q(n): f"s.{q(n)}" for n in types}, **meta},
                                      predicate=f"s.{_EXISTS}"))
    if truncate:
        merge = merge.when_not_matched_by_source_delete()
    return merge_recorded(table, merge, commit)


@dataclass(frozen=True)
class TableInBatch:
    """What one Spark job learns of a batch, per table: the newest TRUNCATE (order) and the
    (column, type) pairs its changes carried."""

    schema: str
    table: str
    truncated: tuple[int, int] | None
    types: dict[str, str]
    moved: bool = False             # an UPDATE moved a row to another key (may have)
    newest: int = 0                 # the newest commit LSN among its changes

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def _moves(changes: DataFrame, key: tuple[str, ...]) -> list[tuple]:
    """The key-changing UPDATEs among one table's changes, in order: (commit_lsn, seq, old
    key, new key), key values as text. One Spark job; only for a batch that has some."""
    new_key = F.struct(*[F.col("columns")[k].alias(k) for k in key])
    old_key = F.struct(*[F.col("identity")[k].alias(k) for k in key])
    rows = (changes.where((F.col("op") == "U") & F.col("identity").isNotNull()
                          & (old_key != new_key))
            .select("commit_lsn", "seq", old_key.alias("old"), new_key.alias("new"))
            .orderBy("commit_lsn", "seq").collect())
    return [(r.commit_lsn, r.seq, tuple(r.old), tuple(r.new)) for r in rows]


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


def _before(at: tuple[int, int], inclusive: bool = False) -> Column:
    """Changes ordered before ``at`` (commit_lsn, seq), or at it when ``inclusive``."""
    lsn, seq = F.col("commit_lsn"), F.col("seq")
    same = (seq <= F.lit(at[1])) if inclusive else (seq < F.lit(at[1]))
    return (lsn < F.lit(at[0]).cast("long")) | ((lsn == F.lit(at[0]).cast("long")) & same)


def _between(lo: tuple[int, int] | None, hi: tuple[int, int] | None) -> Column:
    """Changes from ``lo`` (inclusive) to ``hi`` (exclusive); None: open."""
    cond = F.lit(True)
    if lo is not None:
        cond = cond & ~_before(lo)
    if hi is not None:
        cond = cond & _before(hi)
    return cond


def tables_in_batch(batch: DataFrame, keys: dict[str, tuple[str, ...]] | None = None
                    ) -> tuple[list[TableInBatch], int | None]:
    """The batch's tables, and the newest verify marker in it (None: none), in one job.
    ``keys`` (schema.table → its mirror's key): an UPDATE of such a table counts as moving
    its row only if its identity's key differs from its new row's; of any other table, if
    it carries an identity at all."""
    marker = (F.col("op") == MESSAGE_ACTION) & (F.col("message_prefix") == MARKER_PREFIX)
    changes = batch.where(F.col("op").isin(*MIRRORED_OPS, "T") | marker)
    moves = F.col("identity").isNotNull()
    for name, key in (keys or {}).items():
        schema, table = name.split(".", 1)
        differs = F.lit(False)
        for k in key:
            differs = differs | ~F.col("identity")[k].eqNullSafe(F.col("columns")[k])
        moves = F.when((F.col("schema_name") == schema) & (F.col("table_name") == table),
                       F.col("identity").isNotNull() & differs).otherwise(moves)
    flat = changes.select("schema_name", "table_name", "op", "commit_lsn", "seq",
                          ((F.col("op") == "U") & moves).alias("moves"),
                          F.explode_outer("column_types").alias("name", "type"))
    rows = flat.groupBy("schema_name", "table_name").agg(
        F.max(F.when(F.col("op") == "T", F.struct("commit_lsn", "seq"))).alias("truncated"),
        F.collect_set(F.when(F.col("name").isNotNull(), F.struct("name", "type")))
        .alias("types"),
        F.max("moves").alias("moved"),
        F.max("commit_lsn").alias("newest")).collect()
    markers = [r.newest for r in rows if r.table_name is None]
    return [TableInBatch(r.schema_name, r.table_name,
                         (r.truncated.commit_lsn, r.truncated.seq) if r.truncated else None,
                         {t.name: t.type for t in r.types}, bool(r.moved), r.newest)
            for r in rows if r.table_name is not None], max(markers, default=None)


class MirrorStopped(UserError):
    """The mirrors cannot go on exactly; the sentence says why and what to do."""


@contextmanager
def bad_values_stop(table: str):
    """A value ``silver.mirror_types.typed`` could not convert, raised inside a Spark job,
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
    below it are in them and are passed over. ``accept_errors_upto``: silver rows that failed to parse with a commit LSN
    at or below it are passed over (the operator checked them in quarantine)."""

    def __init__(self, paths: dict[str, str], accept_errors_upto: int = 0,
                 floors: dict[str, int] | None = None,
                 discover: Callable[[str], str | None] | None = None,
                 on_marker: Callable[[int, int], None] | None = None,
                 faults: FaultPoints | None = None,
                 storage_options: dict | None = None,
                 after_batch: Callable[[], object] | None = None) -> None:
        self.paths = dict(paths)
        # Called at the end of every batch, in the query's thread: the mirrors' maintenance
        # (``pipelines.maintain``), between two batches of their only writer.
        self.after_batch = after_batch
        self.storage_options = storage_options       # delta-rs's, for a lakehouse on S3
        self.faults = faults or FaultPoints()
        # Called with (LSN, batch id) of the newest verify marker of a batch once every
        # mirror holds that batch (``pipelines.verify.mirrors``).
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
        self._handles: dict[str, WriterHandle] = {}     # path → the MERGEs' handle

    def idle(self) -> None:
        """Between batches (``pipelines.run.stream.await_stream`` asks each writer): the
        mirrors have nothing waiting; each batch commits its MERGEs."""

    def finish(self) -> None:
        """After the last batch: nothing to finish (see ``idle``)."""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._batch(batch, batch_id)
        except BaseException as exc:
            self.failure = exc
            raise

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        failed = batch.where(F.col("error").isNotNull()
                             & (F.col("commit_lsn") > F.lit(self.accept_errors_upto))) \
            .select("commit_lsn", "error").limit(1).collect()
        if failed:
            raise MirrorStopped(
                f"a change at commit LSN {fmt(failed[0].commit_lsn)} failed to parse "
                f"({failed[0].error}), so no mirror can say it holds it; mirrors stopped. "
                "Check silver/quarantine, then pass over it with `lakecdc mirrors "
                "--accept-errors-upto` (docs/silver.md, \"Mirrors\").")
        spark = batch.sparkSession
        found_tables, marker = tables_in_batch(batch, {
            name: self._shape(spark, path)[0] for name, path in self.paths.items()})
        for found in found_tables:
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
            self._table(batch, batch_id, found, path)
        if marker is not None and self.on_marker is not None:
            self.on_marker(marker, batch_id)     # every mirror holds the batch now
        if self.after_batch is not None:
            self.after_batch()

    def _table(self, batch: DataFrame, batch_id: int, found: TableInBatch, path: str) -> None:
        spark = batch.sparkSession
        key, types = self._evolve(spark, path, found)
        mine = (F.col("schema_name") == found.schema) & (F.col("table_name") == found.table) \
            & F.col("op").isin(*MIRRORED_OPS) \
            & (F.col("commit_lsn") >= F.lit(self.floors.get(found.name, 0)))
        if found.truncated is not None:
            mine = mine & ~_before(found.truncated, inclusive=True)
        changes = batch.where(mine)
        # An UPDATE carrying its old row's identity may still keep its key (a replica
        # identity of more columns than the key, like the counted tables'): only a batch
        # whose key really changed pays for reading the mirror's old rows.
        moves = _moves(changes, key) if found.moved else []
        bounds = [None, *chain_cuts(moves), None]
        for part, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            self._merge(spark, path, changes.where(_between(lo, hi)), key, types, found,
                        batch_id, part, truncate=part == 0 and found.truncated is not None,
                        last=hi is None, moved=bool(moves))
        self.merged[found.name] = self.merged.get(found.name, 0) + 1

    def _merge(self, spark: SparkSession, path: str, changes: DataFrame, key: tuple[str, ...],
               types: dict[str, str], found: TableInBatch, batch_id: int, part: int,
               truncate: bool, last: bool, moved: bool) -> None:
        """One MERGE of ``changes`` (part ``part`` of the batch's changes of the table;
        ``moved``: some of the batch's changes move a row to another key)."""
        from delta.tables import DeltaTable

        version = batch_id * PARTS + part
        with self._handle(path).use() as table:
            recorded = table.transaction_version(APP_ID)
            if recorded is not None and recorded >= version:
                return                                  # merged before a kill: a replay
            final = final_rows(changes, key, key_moves=moved)
            mirror = DeltaTable.forPath(spark, path).toDF() if moved else None
            with bad_values_stop(found.name):
                source = merge_source(final, key, types, mirror).toArrow()
            # ``newest``: the mirror now holds every change of its table up to this LSN
            # (``pipelines.verify.mirrors``); not after a batch's part but the last, which may
            # end inside a transaction. A batch's parts are told apart by the version.
            held = {"newest": found.newest} if last else {"partial": True}
            commit = rs_commit(commit_metadata("mirror", batch_id=batch_id, part=part,
                                               truncated=truncate, **held), APP_ID, version)
            merge_changes(table, source, key, types, commit, truncate)
        self.faults.hit("after_mirror_merge")

    def _handle(self, path: str) -> WriterHandle:
        if path not in self._handles:
            self._handles[path] = WriterHandle(delta_rs_uri(path), self.storage_options)
        return self._handles[path]

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
            have = set(DeltaTable.forPath(spark, path).toDF().columns)   # a replay's
            columns = ", ".join(f"{q(n)} {spark_type(t).simpleString()}"
                                for n, t in added.items() if n not in have)
            types = {**types, **added}
            if columns:
                spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                      f"('{TYPES_PROPERTY}' = {_sql_string(json.dumps(types))})")
            self._shapes[path] = (key, types)
            self._handle(path).reset()          # Spark committed beside the MERGEs' handle
            log.info("mirror of %s: added column(s) %s", found.name, ", ".join(added))
        return key, types

    def _shape(self, spark: SparkSession, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
        if path not in self._shapes:
            self._shapes[path] = mirror_shape(spark, path)
        return self._shapes[path]


def mirror_shape(spark: SparkSession, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """A mirror's key and (column → Postgres type), as its table properties record them."""
    from delta.tables import DeltaTable

    properties = DeltaTable.forPath(spark, path).detail().first().properties
    return tuple(json.loads(properties[KEY_PROPERTY])), dict(json.loads(properties[TYPES_PROPERTY]))


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
