"""silver → signed count deltas: pure transforms, no I/O (docs/gold.md). The rules are
evaluated in Arrow (``line_table``, ``problem_rows``); the Spark functions run them in each
task (``mapInArrow``) for whole-table jobs (``gold.asof``).

Per silver row, with dims = (service_id, template_id, notification_type, notification_status):

| silver row                                          | contribution               |
|-----------------------------------------------------|----------------------------|
| I on notifications or notification_history          | +1 new dims                |
| U with identity (old dims present), either table    | -1 old dims, +1 new dims   |
| U without identity (no key column changed)          | 0                          |
| D on notifications                                  | -1 old dims                |
| D on notification_history (retention purge)         | 0                          |
| T on notification_history (a purge of every row)    | 0                          |
| T on notifications                                  | stop: ``GoldStopped``      |
| R (snapshot backfill read), either table            | 0 (the baseline counts it) |
| M (logical message), other tables                   | 0                          |
| error set (silver could not parse the row)          | stop: ``GoldStopped``      |

No clamps: counts may go negative, which shows drift instead of hiding it.

Why error rows stop gold rather than count 0: silver nulls every parsed column of a failed
row, table included, so gold cannot tell a harmless failure from a change of a counted
table - and silver deliberately turns changes it cannot attribute (an identity without the
old dims, an I/U without its dims) into error rows so that gold stops on them (docs/gold.md:
never skip such a change silently). The operator inspects ``silver/quarantine`` and either
accepts the rows as count-neutral up to a commit LSN (``accept_errors_upto``) or rebuilds.

Every silver row also yields one *row-count* contribution (dims NULL, delta 0, rows 1):
gold applies a source transaction only when it holds ``tx_changes`` rows of it, including
rows whose delta is 0 - read rows (``R``) too, which the shipper adds to the transaction
of the backfill's HIGH watermark message. Contributions are additive, so a partial
transaction carried between micro-batches is just its aggregated contributions (see
``gold.apply``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from core.captured import COUNTED, DIMS, CountedTables
from core.errors import UserError
from core.lsn import fmt

REBUILD = "rebuild gold from the source with `lakecdc backfill rebuild-gold`"

# Aggregated contributions per (commit_lsn, tx_changes, dims); the layout of gold/_pending.
# Dims are NULL on a transaction's row-count line. tx_changes is part of the key so that
# rows disagreeing about their transaction's size stay visible (``transactions``).
CONTRIBUTIONS = StructType([
    StructField("commit_lsn", LongType(), False),
    StructField("tx_changes", IntegerType(), False),
    *[StructField(c, StringType(), True) for c in DIMS],
    StructField("commit_ts", TimestampType(), True),
    StructField("delta", LongType(), False),
    StructField("rows", LongType(), False),
])

# What contribution lines are summed per.
LINE_KEY = ("commit_lsn", "tx_changes", *DIMS)
# The lines of ``line_table``: CONTRIBUTIONS and each line's most important problem.
_LINES_SPARK = StructType([*CONTRIBUTIONS.fields,
                           StructField("problem_rank", IntegerType(), True)])
_LINES = to_arrow_schema(_LINES_SPARK)
_PROBLEM_ROWS = StructType([
    StructField("problem", StringType(), False),
    StructField("commit_lsn", LongType(), False),
    StructField("seq", IntegerType(), False),
    *[StructField(c, StringType(), True) for c in ("schema_name", "table_name", "op",
                                                   "error")],
])
# The silver columns the rules read (not the column maps).
GOLD_READS = ("commit_lsn", "seq", "tx_changes", "commit_ts", "op", "schema_name",
               "table_name", *DIMS, "old_id", *[f"old_{c}" for c in DIMS], "error")

KEY_DELTAS = StructType([
    *[StructField(c, StringType(), False) for c in DIMS],
    StructField("delta", LongType(), False),
    StructField("last_commit_lsn", LongType(), False),
])

# Problems that stop gold, most important first (the first one found is reported).
TRUNCATE = "truncate"
ERROR_ROW = "error_row"
NO_OLD_DIMS = "no_old_dims"
NO_NEW_DIMS = "no_new_dims"
BAD_OP = "bad_op"
PROBLEMS = (TRUNCATE, ERROR_ROW, NO_OLD_DIMS, NO_NEW_DIMS, BAD_OP)
OPS = ("I", "U", "D", "T", "M", "R")


class GoldStopped(UserError):
    """Gold cannot go on until someone acts (rebuild, fix the replica identity). Exit 2."""


class GoldInputError(RuntimeError):
    """Silver broke its contract (more rows for a transaction than it has, ...): a bug."""


class _Rules:
    """The row predicates of the table above, over an Arrow table of silver rows, as numpy
    masks (NULL never matches: a NULL op or table is no I, U, D or counted table)."""

    def __init__(self, silver: pa.Table, tables: CountedTables, accept_errors_upto: int):
        op = silver.column("op")

        def is_op(*ops: str) -> np.ndarray:
            return _np(pc.is_in(op, value_set=pa.array(ops)))

        def is_table(table: tuple[str, str]) -> np.ndarray:
            return _np(pc.and_(pc.equal(silver.column("schema_name"), table[0]),
                               pc.equal(silver.column("table_name"), table[1])))

        def all_set(cols: list[str]) -> np.ndarray:
            found = np.ones(silver.num_rows, bool)
            for c in cols:
                found &= np.asarray(pc.is_valid(silver.column(c)))
            return found

        live = is_table(tables.live)
        counted = live | is_table(tables.history)
        self.error = np.asarray(pc.is_valid(silver.column("error")))
        error_stops = self.error & (silver.column("commit_lsn").to_numpy()
                                    > accept_errors_upto)
        clean = ~self.error
        has_identity = np.zeros(silver.num_rows, bool)
        for c in ("id", *DIMS):
            has_identity |= np.asarray(pc.is_valid(silver.column(f"old_{c}")))
        self.plus_new = clean & counted & (is_op("I") | (is_op("U") & has_identity))
        self.minus_old = clean & counted & ((is_op("U") & has_identity)
                                            | (is_op("D") & live))
        # The most important problem of each row, as its 1-based rank in PROBLEMS (0: none).
        found = [clean & live & is_op("T"),
                 error_stops,
                 self.minus_old & ~all_set([f"old_{c}" for c in DIMS]),
                 self.plus_new & ~all_set(list(DIMS)),
                 clean & ~is_op(*OPS)]
        self.rank = np.zeros(silver.num_rows, np.int32)
        for rank, matches in reversed(list(enumerate(found, 1))):
            self.rank[matches] = rank


def _np(mask) -> np.ndarray:
    """A boolean Arrow array as numpy, NULL as False."""
    return np.asarray(pc.fill_null(mask, False))


def problem_rows(silver: pa.Table, tables: CountedTables = COUNTED,
                 accept_errors_upto: int = 0) -> pa.Table:
    """Silver rows gold refuses to count, most important problem first, then by key.

    Columns: problem, commit_lsn, seq, schema_name, table_name, op, error.
    """
    rank = _Rules(silver, tables, accept_errors_upto).rank
    rows = silver.filter(pa.array(rank > 0)).select(
        ["commit_lsn", "seq", "schema_name", "table_name", "op", "error"])
    rank = rank[rank > 0]
    rows = rows.append_column("_rank", pa.array(rank)).sort_by(
        [("_rank", "ascending"), ("commit_lsn", "ascending"), ("seq", "ascending")])
    problem = pa.array(PROBLEMS).take(pc.subtract(rows.column("_rank"), 1))
    return rows.drop_columns(["_rank"]).add_column(0, "problem", problem).cast(
        to_arrow_schema(_PROBLEM_ROWS))


def problems(silver: DataFrame, tables: CountedTables = COUNTED,
             accept_errors_upto: int = 0) -> DataFrame:
    """``problem_rows`` over a Spark DataFrame of silver rows."""
    def found(batches):
        for batch in batches:
            yield from problem_rows(pa.Table.from_batches([batch]), tables,
                                    accept_errors_upto).to_batches()

    rank = F.array_position(F.array(*[F.lit(p) for p in PROBLEMS]), F.col("problem"))
    return (silver.select(*GOLD_READS).mapInArrow(found, _PROBLEM_ROWS)
            .orderBy(rank, "commit_lsn", "seq"))


def stop_error(problem: dict, tables: CountedTables = COUNTED) -> Exception:
    """The exception to stop gold with, for one row of ``problems`` (as a dict)."""
    where = f"commit LSN {fmt(problem['commit_lsn'])} (seq {problem['seq']})"
    table = ".".join(t for t in (problem.get("schema_name"), problem.get("table_name")) if t)
    kind = problem["problem"]
    if kind == TRUNCATE:
        return GoldStopped(
            f"TRUNCATE of {table} at {where}: the removed rows cannot be attributed to "
            f"services, so gold stopped before applying it; {REBUILD}.")
    if kind == ERROR_ROW:
        return GoldStopped(
            f"silver could not parse the change at {where} ({problem.get('error')}); gold "
            "stopped because it cannot tell whether the change alters service_stats. "
            "Inspect silver/quarantine: if the change cannot affect the counts, accept it "
            "(accept quarantined rows up to that commit LSN); otherwise fix the cause and "
            f"{REBUILD}.")
    if kind in (NO_OLD_DIMS, NO_NEW_DIMS):
        which = "old dims (replica identity)" if kind == NO_OLD_DIMS else "new dims"
        return GoldStopped(
            f"the {problem.get('op')} on {table} at {where} lacks its {which}, so gold cannot "
            "attribute it; run `lakecdc setup` so the replica identity covers id and the dims "
            f"(or use REPLICA IDENTITY FULL), then {REBUILD}.")
    return GoldInputError(f"silver row at {where} has op {problem.get('op')!r} and no error: "
                          "silver broke its contract (op in I/U/D/T/M/R, or error set).")


def line_table(silver: pa.Table, tables: CountedTables = COUNTED,
               accept_errors_upto: int = 0) -> pa.Table:
    """Signed contribution lines of silver rows (an Arrow table), summed per
    (commit_lsn, tx_changes, dims): ``CONTRIBUTIONS`` plus ``problem_rank``, per line the
    most important problem among the rows it sums (its 1-based rank in ``PROBLEMS``), NULL
    if none. Everything a gold batch decides on (``gold.plan``); when a line has a problem,
    ``problem_rows`` names the row to stop on.

    Each row gives one row-count line (dims NULL, rows 1, the row's problem) plus its +1 /
    -1 dims lines. Lines whose delta sums to 0 are kept: the row counts are what
    completeness is judged on, and a zero key line is dropped later, in ``key_deltas``.
    In Arrow, not Spark: the Spark aggregate took 1.7-2.1 s of a 308,289-row catch-up batch,
    this about a tenth of it (docs/gold.md)."""
    silver = silver.select(list(GOLD_READS))
    rules = _Rules(silver, tables, accept_errors_upto)
    n = silver.num_rows
    take_new, take_old = np.flatnonzero(rules.plus_new), np.flatnonzero(rules.minus_old)
    parts = [pa.table({
        "commit_lsn": silver.column("commit_lsn"), "tx_changes": silver.column("tx_changes"),
        **{c: pa.nulls(n, pa.string()) for c in DIMS},
        "commit_ts": silver.column("commit_ts"),
        "delta": pa.array(np.zeros(n, np.int64)), "rows": pa.array(np.ones(n, np.int64)),
        "problem_rank": pa.array(rules.rank, mask=rules.rank == 0)})]
    for at, prefix, delta in ((take_new, "", 1), (take_old, "old_", -1)):
        rows = silver.take(at)
        parts.append(pa.table({
            "commit_lsn": rows.column("commit_lsn"), "tx_changes": rows.column("tx_changes"),
            **{c: rows.column(prefix + c) for c in DIMS},
            "commit_ts": rows.column("commit_ts"),
            "delta": pa.array(np.full(len(at), delta, np.int64)),
            "rows": pa.array(np.zeros(len(at), np.int64)),
            "problem_rank": pa.nulls(len(at), pa.int32())}))
    lines = pa.concat_tables([p.cast(_LINES) for p in parts])
    summed = lines.group_by(list(LINE_KEY), use_threads=False).aggregate(
        [("commit_ts", "max"), ("delta", "sum"), ("rows", "sum"), ("problem_rank", "min")])
    return summed.rename_columns(
        {f"{c}_{f}": c for c, f in (("commit_ts", "max"), ("delta", "sum"), ("rows", "sum"),
                                    ("problem_rank", "min"))}).select(_LINES.names).cast(_LINES)


def contributions(silver: DataFrame, tables: CountedTables = COUNTED) -> DataFrame:
    """``line_table`` over a Spark DataFrame of silver rows, without ``problem_rank``
    (stop-worthy rows are not excluded: check ``problems`` first)."""
    return aggregate(lines(silver, tables).drop("problem_rank"))


def lines(silver: DataFrame, tables: CountedTables = COUNTED,
          accept_errors_upto: int = 0) -> DataFrame:
    """``line_table`` over a Spark DataFrame of silver rows: each task's rows summed in
    Arrow, then summed again across tasks (the sums are associative)."""
    def summed(batches):
        for batch in batches:
            yield from line_table(pa.Table.from_batches([batch]), tables,
                                  accept_errors_upto).to_batches()

    return (silver.select(*GOLD_READS).mapInArrow(summed, _LINES_SPARK)
            .groupBy(*LINE_KEY).agg(*_sums(), F.min("problem_rank").alias("problem_rank"))
            .select(*[F.col(f.name).cast(f.dataType) for f in _LINES_SPARK.fields]))


def _sums() -> list[Column]:
    return [F.max("commit_ts").alias("commit_ts"),
            F.sum("delta").cast("long").alias("delta"),
            F.sum("rows").cast("long").alias("rows")]


def _history_change(tables: CountedTables, op: str) -> Column:
    """A clean (parsed) ``op`` on the history table."""
    return (F.col("error").isNull() & (F.col("op") == op)
            & F.coalesce((F.col("schema_name") == tables.history[0])
                         & (F.col("table_name") == tables.history[1]), F.lit(False)))


def history_purges(silver: DataFrame, tables: CountedTables = COUNTED) -> DataFrame:
    """Rows deleted from ``notification_history`` (retention purges), counted per old dims
    (dims, ``purged``). Gold keeps counting them (delta 0), the source no longer has them:
    ``verify`` adds them back to the source's ``GROUP BY`` to get the truth."""
    purge = _history_change(tables, "D")
    return (silver.where(purge)
            .groupBy(*[F.col(f"old_{c}").alias(c) for c in DIMS])
            .agg(F.count(F.lit(1)).cast("long").alias("purged")))


def history_truncates(silver: DataFrame, tables: CountedTables = COUNTED) -> DataFrame:
    """TRUNCATEs of ``notification_history`` (commit_lsn): rows gone without their dims."""
    return silver.where(_history_change(tables, "T")).select("commit_lsn")


def aggregate(lines: DataFrame) -> DataFrame:
    """Sum contribution lines per (commit_lsn, tx_changes, dims); ``CONTRIBUTIONS`` layout.

    Associative, so ``aggregate(a ∪ b) == aggregate(aggregate(a) ∪ aggregate(b))``: the
    pending state of earlier batches combines with a new batch by union + aggregate.
    """
    return (lines.groupBy(*LINE_KEY).agg(*_sums())
            .select(*[F.col(f.name).cast(f.dataType) for f in CONTRIBUTIONS.fields]))


def key_deltas(applied: DataFrame) -> DataFrame:
    """Net delta per dims key over applied contributions; zero nets dropped (``KEY_DELTAS``).

    ``last_commit_lsn`` is the newest applied transaction that touched the key.
    """
    keyed = applied.where(F.col("service_id").isNotNull())
    return (keyed.groupBy(*DIMS)
            .agg(F.sum("delta").cast("long").alias("delta"),
                 F.max("commit_lsn").alias("last_commit_lsn"))
            .where(F.col("delta") != 0))
