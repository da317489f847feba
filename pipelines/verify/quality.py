"""``lakecdc quality``: Great Expectations gates on silver and gold.

Two suites, each run on one Spark DataFrame (GX's Spark data source, whole-frame batch, an
ephemeral in-memory context with analytics off: nothing is written or sent anywhere):

- **silver** - ``silver/changes`` rows above gold's floor (the rows gold's counts are built
  from; ``all_silver`` for every row): the key ``(commit_lsn, seq)`` is non-null and unique;
  ``op`` is a known operation (``gold.deltas.OPS``; parse-error rows have none and are
  silver's quarantine's business); the row's own ``lsn`` is not after its transaction's
  ``commit_lsn``, and ``0 <= seq < tx_changes``; inserts, updates and reads carry the id
  and the four new dims; deletes carry the four old dims.
- **gold** - ``gold/service_stats`` at one version, next to the counts silver implies:
  the dims are non-null and unique, ``count >= 0``, and per key ``count`` equals
  *expected* = the baseline gold started from (the seed or rebuild commit that set its
  floor, read by time travel, or ``gold/_baseline``) plus the net signed deltas
  (``gold.deltas``) of the silver rows in ``(floor, watermark]``. That is gold's own
  contract restated from its inputs: a lost, doubled or misattributed change shows as a
  key whose count differs.

Incremental: a passing run records what it checked in ``gold/_quality`` (a small Delta
table: gold's counts at the version it passed, with the watermark, the floor and how far
silver was checked in its commit's metadata). The next run checks only what is new since:
silver rows after that watermark, and gold against those counts plus the net deltas of the
silver rows since. Its cost follows the changes since the last pass and gold's keys, not the
table's history. A rebuild (a new floor) or ``--full`` starts again from gold's baseline; a
failing run records nothing, so the next run checks the same rows again. A row appended to
silver again with a commit LSN the gate has passed is not among the rows it reads again: the
gold suite still sees it, in the count gold made of it.

Failure policy: **stop**. A failing suite makes the command exit 1 (like ``verify`` finding
drift) with the failing expectations and sample values, so the job task fails, the tasks
that depend on it (a rebuild, a verification) do not run, and the job's failure
notifications fire. Nothing is quarantined or corrected automatically: rows that silver
cannot parse are already quarantined by silver itself, and moving parsed-but-wrong rows
aside, or patching counts, would change gold without anyone deciding it (docs/gold.md: no
self-healing that hides drift). The remedies are human: fix the cause, then ``lakecdc
backfill reprocess-silver`` or ``backfill rebuild-gold``. See docs/quality.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from core.captured import DIMS, CountedTables
from core.errors import UserError

log = logging.getLogger("lakecdc.quality")

SUITES = ("silver", "gold")
_SAMPLES = 3


@dataclass(frozen=True)
class Failure:
    expectation: str            # e.g. expect_column_values_to_not_be_null
    columns: str                # the column(s) it is about
    unexpected: int | None      # rows that failed it
    samples: list = field(default_factory=list)
    error: str | None = None    # the expectation itself could not run


@dataclass(frozen=True)
class GateResult:
    suite: str
    rows: int
    evaluated: int              # expectations run
    failures: list[Failure]
    scope: str                  # what was validated, in words

    @property
    def success(self) -> bool:
        return not self.failures


# --- the suites (definitions only) ----------------------------------------------------------

def silver_suite():
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.expectations.row_conditions import Column

    from gold.deltas import OPS

    # GX Core's Condition objects: string row conditions are deprecated (GX 2.0 drops them).
    writes = Column("op").is_in(["I", "U", "R"])
    deletes = Column("op") == "D"
    return gx.ExpectationSuite(name="lakecdc_silver", expectations=[
        *[gxe.ExpectColumnValuesToNotBeNull(column=c)
          for c in ("commit_lsn", "seq", "tx_changes", "lsn")],
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["commit_lsn", "seq"]),
        gxe.ExpectColumnValuesToBeInSet(column="op", value_set=list(OPS)),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="commit_lsn", column_B="lsn",
                                                    or_equal=True),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="tx_changes", column_B="seq"),
        gxe.ExpectColumnValuesToBeBetween(column="seq", min_value=0),
        *[gxe.ExpectColumnValuesToNotBeNull(column=c, row_condition=writes)
          for c in ("id", *DIMS)],
        *[gxe.ExpectColumnValuesToNotBeNull(column=f"old_{c}", row_condition=deletes)
          for c in DIMS],
    ])


def gold_suite():
    import great_expectations as gx
    import great_expectations.expectations as gxe

    return gx.ExpectationSuite(name="lakecdc_gold", expectations=[
        *[gxe.ExpectColumnValuesToNotBeNull(column=c) for c in DIMS],
        gxe.ExpectCompoundColumnsToBeUnique(column_list=list(DIMS)),
        gxe.ExpectColumnValuesToBeBetween(column="count", min_value=0),
        # A key missing on one side has NULL there: compared, so it fails.
        gxe.ExpectColumnPairValuesToBeEqual(column_A="count", column_B="expected",
                                            ignore_row_if="both_values_are_missing"),
    ])


# --- the frames they run on -----------------------------------------------------------------

def silver_frame(spark: SparkSession, silver_path: str, after_lsn: int = 0) -> DataFrame:
    """Silver rows with ``commit_lsn > after_lsn``, the columns the silver suite reads."""
    return (spark.read.format("delta").load(silver_path)
            .where(F.col("commit_lsn") > F.lit(after_lsn))
            .select("commit_lsn", "seq", "tx_changes", "lsn", "op", "id", *DIMS,
                    *[f"old_{c}" for c in DIMS]))


def expected_counts(baseline: DataFrame, silver: DataFrame, tables: CountedTables
                    ) -> DataFrame:
    """Per key: baseline count + net signed deltas of ``silver`` (dims, expected)."""
    from gold.asof import net_deltas

    deltas = net_deltas(silver, tables).select(*DIMS, F.col("delta").alias("n"))
    base = baseline.select(*DIMS, F.col("count").cast("long").alias("n"))
    return (base.unionByName(deltas).groupBy(*DIMS)
            .agg(F.sum("n").cast("long").alias("expected")))


def reconcile(gold: DataFrame, expected: DataFrame) -> DataFrame:
    """Gold's rows beside the expected counts (dims, count, expected); keys absent from
    gold whose expected count is 0 are dropped, as gold drops zero nets."""
    joined = gold.select(*DIMS, "count").join(expected, list(DIMS), "full_outer")
    return (joined.where(F.col("count").isNotNull() | (F.col("expected") != 0))
            .select(*DIMS, "count", F.coalesce("expected", F.lit(0)).alias("expected")))


@dataclass(frozen=True)
class Checked:
    """What the gate's last passing runs checked (``gold/_quality``'s newest commit)."""
    floor: int                       # gold's floor then: another floor is another gold
    silver_upto: int | None = None   # silver rows with commit_lsn <= this passed
    watermark: int | None = None     # gold passed at this watermark: its counts, the table's


def read_checked(spark: SparkSession, state_path: str | None) -> Checked | None:
    from core.commits import newest
    from core.engine.spark_delta import read_commits

    meta = newest(read_commits(spark, state_path, "quality", 100)) if state_path else None
    if not meta:
        return None
    return Checked(int(meta["floor"]), meta.get("silver_upto"), meta.get("watermark"))


def record_checked(spark: SparkSession, state_path: str, checked: Checked,
                   counts: DataFrame | None) -> None:
    """Record a pass: ``counts`` (dims, count: gold as it passed) or, when gold was not
    checked, the counts recorded before (one overwrite: the counts and the metadata that
    says what they are commit together)."""
    from core.commits import commit_metadata
    from core.spark_tables import create_table

    create_table(spark, state_path, spark.createDataFrame([], _COUNTS).schema, {})
    if counts is None:
        counts = (spark.read.format("delta").load(state_path) if checked.watermark is not None
                  else spark.createDataFrame([], _COUNTS))
    (counts.select(*DIMS, "count").write.format("delta").mode("overwrite")
     .option("userMetadata", commit_metadata("quality", **asdict(checked)))
     .save(state_path))


_COUNTS = ", ".join([f"{c} string" for c in DIMS] + ["count long"])


def gold_frame(spark: SparkSession, gold_path: str, silver_path: str, tables: CountedTables,
               baseline_path: str | None = None, storage_options: dict | None = None,
               checked: Checked | None = None, state_path: str | None = None
               ) -> tuple[DataFrame, str, int]:
    """Gold at its latest version reconciled with the counts it started from - the last
    pass's (``checked``, at the same floor) or its baseline - plus the silver rows since;
    a scope; and the watermark checked."""
    from core.lsn import fmt
    from gold.asof import gold_state, silver_range

    state = gold_state(spark, gold_path)
    if state is None:
        raise UserError(f"no gold table at {gold_path}: run the pipeline first.")
    watermark = state.watermark if state.watermark is not None else state.floor
    gold = spark.read.format("delta").option("versionAsOf", state.version).load(gold_path)
    if (checked is not None and checked.floor == state.floor
            and checked.watermark is not None and checked.watermark <= watermark):
        base = spark.read.format("delta").load(state_path)
        silver = silver_range(spark, silver_path, checked.watermark + 1, watermark)
        since = f"the counts passed at {fmt(checked.watermark)}"
    else:
        base = _baseline(spark, gold_path, state.floor, baseline_path, storage_options)
        silver = silver_range(spark, silver_path, state.floor, watermark)
        since = f"baseline at {fmt(state.floor)}"
    frame = reconcile(gold, expected_counts(base, silver, tables))
    return frame, (f"gold version {state.version}: {since} + silver changes up to "
                   f"{fmt(watermark)}"), watermark


def _baseline(spark: SparkSession, gold_path: str, floor: int, baseline_path: str | None,
              storage_options: dict | None) -> DataFrame:
    """The counts gold started from at ``floor``: gold at the commit that set the floor (a
    seed or a rebuild), else setup's ``gold/_baseline`` if it is at ``floor``."""
    from core.commits import floor_of
    from core.engine.spark_delta import read_commits

    empty = spark.createDataFrame([], _COUNTS)
    if floor == 0:
        return empty
    for commit in read_commits(spark, gold_path, mentioning='"operation"'):
        meta = commit.meta or {}
        if meta.get("operation") in ("seed", "rebuild") and floor_of(meta) == floor:
            try:
                base = (spark.read.format("delta").option("versionAsOf", commit.version)
                        .load(gold_path).select(*DIMS, "count"))
                base.limit(1).collect()       # fails here if the version was vacuumed
                return base
            except Exception as exc:          # fall back to gold/_baseline below
                log.warning("gold version %d is no longer readable (%s)", commit.version, exc)
            break
    if baseline_path is not None:
        from pipelines.source.baseline import read_baseline

        found = read_baseline(baseline_path, storage_options)
        if found is not None and found[0] == floor:
            return spark.createDataFrame(found[1].to_pylist(), empty.schema)
    raise UserError(f"the counts gold started from (its baseline at LSN {floor}) are no longer "
                    "readable, so gold cannot be reconciled with silver; take a fresh "
                    "baseline with `lakecdc backfill rebuild-gold`.")


# --- running them ---------------------------------------------------------------------------

def _context():
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    return gx.get_context(project_config=DataContextConfig(
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        store_backend_defaults=InMemoryStoreBackendDefaults()))


def validate(frame: DataFrame, suite, scope: str = "") -> GateResult:
    """Run ``suite`` on ``frame`` (cached for the run); the failures with samples."""
    context = _context()
    batch_definition = (context.data_sources.add_spark("lakecdc")
                        .add_dataframe_asset(suite.name)
                        .add_batch_definition_whole_dataframe("all rows"))
    suite = context.suites.add(suite)
    frame = frame.persist()
    try:
        rows = frame.count()
        batch = batch_definition.get_batch(batch_parameters={"dataframe": frame})
        outcome = batch.validate(suite, result_format={"result_format": "SUMMARY",
                                                        "partial_unexpected_count": _SAMPLES})
    finally:
        frame.unpersist()
    failures = []
    for result in outcome.results:
        if result.success:
            continue
        config = result.expectation_config
        kwargs = config.kwargs
        columns = kwargs.get("column") or ", ".join(
            kwargs.get("column_list") or [kwargs.get("column_A", ""), kwargs.get("column_B", "")])
        if kwargs.get("row_condition"):
            columns += f" where {_condition_text(kwargs['row_condition'])}"
        error = (result.exception_info or {}).get("exception_message") \
            if (result.exception_info or {}).get("raised_exception") else None
        failures.append(Failure(config.type, columns, result.result.get("unexpected_count"),
                                _plain(result.result.get("partial_unexpected_list") or []),
                                error))
    return GateResult(suite.name.removeprefix("lakecdc_"), rows, len(outcome.results),
                      failures, scope)


def _condition_text(condition) -> str:
    """A row condition as a reader writes it (GX keeps ``Column("op") == "D"`` as a dict)."""
    if isinstance(condition, dict) and {"column", "operator", "parameter"} <= set(condition):
        return (f"{condition['column'].get('name')} {condition['operator']} "
                f"{condition['parameter']!r}")
    return str(condition)


def _plain(values: list) -> list:
    return json.loads(json.dumps(values[:_SAMPLES], default=str))


def run_gates(spark: SparkSession, silver_path: str, gold_path: str, tables: CountedTables,
              suites: tuple[str, ...] = SUITES, baseline_path: str | None = None,
              storage_options: dict | None = None, all_silver: bool = False,
              state_path: str | None = None, full: bool = False) -> list[GateResult]:
    """Run the named suites; each result says whether it passed. ``state_path``: where
    passes are recorded, and the next run starts from (none: every run checks all since
    gold's baseline); ``full``: start from the baseline, and record the pass."""
    from core.lsn import fmt
    from gold.asof import gold_state

    state = gold_state(spark, gold_path)
    floor = state.floor if state is not None else 0
    checked = None if full else read_checked(spark, state_path)
    if checked is not None and checked.floor != floor:
        checked = None                      # gold was rebuilt since: another baseline
    passed = checked or Checked(floor)
    results = []
    if "silver" in suites:
        after = 0 if all_silver or state is None else max(
            floor, (checked.silver_upto if checked and checked.silver_upto else 0))
        scope = "every silver row" if after == 0 else f"silver rows after {fmt(after)}"
        result = validate(silver_frame(spark, silver_path, after), silver_suite(), scope)
        results.append(result)
        # Rows past gold's watermark may belong to a transaction silver holds only part
        # of: checked again next time, with the rest of it.
        if result.success and state is not None and state.watermark is not None:
            passed = replace(passed, silver_upto=max(after, state.watermark))
    counts = None
    if "gold" in suites:
        frame, scope, watermark = gold_frame(spark, gold_path, silver_path, tables,
                                             baseline_path, storage_options, checked,
                                             state_path)
        result = validate(frame, gold_suite(), scope)
        results.append(result)
        if result.success:
            passed = replace(passed, watermark=watermark)
            counts = frame.where(F.col("count").isNotNull())
    if state_path and state is not None and passed != (checked or Checked(floor)):
        record_checked(spark, state_path, passed, counts)
    return results


def render(results: list[GateResult]) -> str:
    lines = []
    for r in results:
        verdict = "PASS" if r.success else f"FAIL ({len(r.failures)} of {r.evaluated})"
        lines.append(f"{r.suite:<7} {verdict:<14} {r.rows:,} rows; {r.scope}")
        for f in r.failures:
            what = f"error: {f.error}" if f.error else \
                f"{f.unexpected} unexpected, e.g. {f.samples}"
            lines.append(f"  - {f.expectation} [{f.columns}]: {what}")
    return "\n".join(lines)


def to_json(results: list[GateResult]) -> str:
    return json.dumps([{**asdict(r), "success": r.success} for r in results], indent=2,
                      default=str)


def summary(results: list[GateResult]) -> str:
    """One sentence for a failed gate (the exit-1 message)."""
    failed = [f"{r.suite} ({', '.join(sorted({f.expectation for f in r.failures}))})"
              for r in results if not r.success]
    return (f"quality gate failed: {'; '.join(failed)}; see the report above and "
            "docs/quality.md for what to do.")
