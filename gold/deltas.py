"""silver → signed count deltas: pure DataFrame transforms, no I/O (docs/gold.md).

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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from core.captured import COUNTED, DIMS, CountedTables  # noqa: F401 (re-exported)
from core.errors import UserError
from core.lsn import fmt
from core.spark import built_once

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


def _is(table: tuple[str, str]) -> Column:
    return (F.col("schema_name") == table[0]) & (F.col("table_name") == table[1])


def _all_set(cols: list[str]) -> Column:
    cond = F.lit(True)
    for c in cols:
        cond = cond & F.col(c).isNotNull()
    return cond


class _Rules:
    """The row predicates of the table above, as Spark columns (NULL-safe via coalesce)."""

    def __init__(self, tables: CountedTables, accept_errors_upto: int) -> None:
        op = F.col("op")
        live = F.coalesce(_is(tables.live), F.lit(False))
        counted = live | F.coalesce(_is(tables.history), F.lit(False))
        self.error = F.col("error").isNotNull()
        self.error_stops = self.error & (F.col("commit_lsn") > F.lit(accept_errors_upto))
        clean = ~self.error
        has_identity = F.col("old_id").isNotNull()
        for c in DIMS:
            has_identity = has_identity | F.col(f"old_{c}").isNotNull()
        self.plus_new = clean & counted & ((op == "I") | ((op == "U") & has_identity))
        self.minus_old = clean & counted & (((op == "U") & has_identity)
                                            | ((op == "D") & live))
        self.problem = (
            F.when(clean & live & (op == "T"), F.lit(TRUNCATE))
            .when(self.error_stops, F.lit(ERROR_ROW))
            .when(self.minus_old & ~_all_set([f"old_{c}" for c in DIMS]), F.lit(NO_OLD_DIMS))
            .when(self.plus_new & ~_all_set(list(DIMS)), F.lit(NO_NEW_DIMS))
            .when(clean & (op.isNull() | ~op.isin(*OPS)), F.lit(BAD_OP)))


def problems(silver: DataFrame, tables: CountedTables = COUNTED,
             accept_errors_upto: int = 0) -> DataFrame:
    """Silver rows gold refuses to count, most important problem first, then by key.

    Columns: problem, commit_lsn, seq, schema_name, table_name, op, error.
    """
    rules = _Rules(tables, accept_errors_upto)
    rank = F.array_position(F.array(*[F.lit(p) for p in PROBLEMS]), F.col("problem"))
    return (silver.select(rules.problem.alias("problem"), "commit_lsn", "seq", "schema_name",
                          "table_name", "op", "error")
            .where(F.col("problem").isNotNull())
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


def contributions(silver: DataFrame, tables: CountedTables = COUNTED) -> DataFrame:
    """Signed contributions of silver rows, aggregated per (commit_lsn, tx_changes, dims).

    Each row gives one row-count line (dims NULL, rows 1) plus its +1 / -1 dims lines;
    stop-worthy rows (see ``problems``) are not excluded here - check them first. Lines
    whose delta sums to 0 are kept: the row counts are what completeness is judged on, and
    a zero key line is dropped later, in ``key_deltas``.
    """
    return aggregate(silver.select(*_exploded(tables, 0, with_problem=False)))


def lines(silver: DataFrame, tables: CountedTables = COUNTED,
          accept_errors_upto: int = 0) -> DataFrame:
    """``contributions`` plus ``problem_rank``: per line, the most important problem among
    the rows it aggregates (its 1-based rank in ``PROBLEMS``), NULL if none. Everything a
    gold batch decides on (``gold.plan``), from one pass over the batch; when a line has a
    problem, ``problems`` names the row to stop on. Its columns are built once per Spark
    context (``core.spark.built_once``): the stream calls it every batch.

    The rank is an integer so that Spark sums the lines in a hash aggregate: a struct
    aggregate (the whole problem row) made it sort them (on 308,289 persisted rows, warm:
    2.0 s, against 1.1 s for the same lines without it; docs/gold.md)."""
    exploded, sums, out = built_once(("gold.lines", tables, accept_errors_upto), lambda: (
        _exploded(tables, accept_errors_upto, with_problem=True),
        [*_sums(), F.min("problem_rank").alias("problem_rank")],
        [*[F.col(f.name).cast(f.dataType) for f in CONTRIBUTIONS.fields],
         F.col("problem_rank")]))
    return (silver.select(*exploded).groupBy("commit_lsn", "tx_changes", *DIMS)
            .agg(*sums).select(*out))


def _exploded(tables: CountedTables, accept_errors_upto: int,
              with_problem: bool) -> list[Column]:
    """The columns of a silver batch's contribution lines, one row per line."""
    rules = _Rules(tables, accept_errors_upto)
    null_dims = [F.lit(None).cast("string").alias(c) for c in DIMS]
    rank = F.array_position(F.array(*[F.lit(p) for p in PROBLEMS]), rules.problem)
    no_rank = F.lit(None).cast("int")

    def line(dims: list[Column], delta: int, rows: int, flagged: bool = False) -> Column:
        extra = [(rank.cast("int") if flagged else no_rank).alias("problem_rank")] \
            if with_problem else []
        return F.struct(*dims, F.lit(delta).cast("long").alias("delta"),
                        F.lit(rows).cast("long").alias("rows"), *extra)

    lines_ = F.array(
        line(null_dims, 0, 1, flagged=True),
        F.when(rules.plus_new, line([F.col(c).alias(c) for c in DIMS], +1, 0)),
        F.when(rules.minus_old, line([F.col(f"old_{c}").alias(c) for c in DIMS], -1, 0)))
    # array_compact, not a filter lambda: Spark runs higher-order functions interpreted.
    return [F.col("commit_lsn"), F.col("tx_changes"), F.col("commit_ts"),
            F.inline(F.array_compact(lines_))]


def _sums() -> list[Column]:
    return [F.max("commit_ts").alias("commit_ts"),
            F.sum("delta").cast("long").alias("delta"),
            F.sum("rows").cast("long").alias("rows")]


def history_purges(silver: DataFrame, tables: CountedTables = COUNTED) -> DataFrame:
    """Rows deleted from ``notification_history`` (retention purges), counted per old dims
    (dims, ``purged``). Gold keeps counting them (delta 0), the source no longer has them:
    ``verify`` adds them back to the source's ``GROUP BY`` to get the truth."""
    rules = _Rules(tables, accept_errors_upto=0)
    purge = ~rules.error & F.coalesce(_is(tables.history), F.lit(False)) & (F.col("op") == "D")
    return (silver.where(purge)
            .groupBy(*[F.col(f"old_{c}").alias(c) for c in DIMS])
            .agg(F.count(F.lit(1)).cast("long").alias("purged")))


def history_truncates(silver: DataFrame, tables: CountedTables = COUNTED) -> DataFrame:
    """TRUNCATEs of ``notification_history`` (commit_lsn): rows gone without their dims."""
    rules = _Rules(tables, accept_errors_upto=0)
    return silver.where(~rules.error & F.coalesce(_is(tables.history), F.lit(False))
                        & (F.col("op") == "T")).select("commit_lsn")


def aggregate(lines: DataFrame) -> DataFrame:
    """Sum contribution lines per (commit_lsn, tx_changes, dims); ``CONTRIBUTIONS`` layout.

    Associative, so ``aggregate(a ∪ b) == aggregate(aggregate(a) ∪ aggregate(b))``: the
    pending state of earlier batches combines with a new batch by union + aggregate.
    """
    return (lines.groupBy("commit_lsn", "tx_changes", *DIMS).agg(*_sums())
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
