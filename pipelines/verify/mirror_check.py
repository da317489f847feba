"""``lakecdc verify`` over the mirrors: each mirror against its source table at one point
(docs/verify.md, "Mirrors").

For a mirrored table ``t`` and verify's consistent point ``P``:

- **the source at P**: every row of ``t`` read inside P's exported snapshot as the text
  wal2json prints (``pipelines.source.mirror_baseline``), into ``<lakehouse>/_verify``;
- **the mirror, and the point it holds**: its newest lakecdc commit records ``newest``, the
  newest change of ``t`` it holds (or ``seed``, the point of its initial rows). Verify reads
  the mirror at that version only once the mirrors' query has passed verify's marker (it
  records each marker it passes, ``pipelines.run.markers``), so no change of ``t`` older than the
  marker is still on its way: the mirror holds exactly the changes of ``t`` up to ``W =
  max(newest, P - 1)``;
- **the truth at W**: the source at P with silver's changes of ``t`` in ``[P, W]`` applied by
  ``apply_changes``, the documented rules written here a second time, in plain Python on the few
  rows they touch, apart from the mirrors' own netting (``silver.mirrors.mirror_writer``);
- both typed by the same type map (``silver.mirrors.mirror_types``, the specification) and compared
  row for row, every column.

A NaN or ±Infinity reaches the mirror as NULL where ``silver.mirrors.type_map.loses_specials``
says so (every one in a float or numeric column where the slot's wal2json prints numbers as
JSON, as 2.5 does; only a decimal's NaN where it prints them as text), and the truth reads it
as NULL too; the rows of the source that held one at P are counted apart
(``MirrorCheck.lost``): a known loss, reported as such, neither a pass of those values nor
drift. Where the mirror keeps them, they are compared like any value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from bronze.capture_list import CAPTURED, CaptureList
from core.commits import parse_commit_metadata
from core.engine.api import Engine
from core.layout import mirror_path
from core.storage import on_databricks, spark_path

Key = tuple
Row = dict
SAMPLE_KEYS = 5


def scratch_root(lakehouse: str) -> str:
    """Where verify keeps the source rows it read at its point (replaced by each run)."""
    return f"{lakehouse.rstrip('/')}/_verify"


def tables_to_verify(config, storage_options: dict | None, engine: Engine
                     ) -> tuple[str, ...]:
    """The mirrored tables that are captured (not being added, not removed) and have a
    mirror, read and looked for through ``engine``."""
    stored = CaptureList(config.lakehouse, storage_options, engine=engine).read()
    captured = (tuple(t for t, (s, _) in stored.states.items() if s == CAPTURED)
                if stored is not None else config.tables)
    mirrored = captured if config.mirrors is None else \
        tuple(t for t in captured if t in config.mirrors)
    return tuple(t for t in mirrored if engine.exists(mirror_path(config.lakehouse, t)))


# --- the truth: the documented rules, once more ----------------------------------------

def apply_changes(rows: dict[Key, Row], changes: Iterable[dict], key: tuple[str, ...]
                  ) -> dict[Key, Row | None]:
    """``changes`` (silver rows of one table: op, commit_lsn, seq, columns, identity) applied
    in ``(commit_lsn, seq)`` order to ``rows`` (key → column → text); returns every touched
    key → its row, None if it no longer exists. A TRUNCATE empties the table, so the caller
    drops every row it did not return (``truncated``). Pure; docs/silver.md, "Mirrors"."""
    state: dict[Key, Row | None] = {}

    def current(k: Key) -> Row | None:
        return state[k] if k in state else rows.get(k)

    for change in sorted(changes, key=lambda c: (c["commit_lsn"], c["seq"])):
        op = change["op"]
        if op == "T":
            state = {k: None for k in (*rows, *state)}
            rows = {}
            continue
        new, old = dict(change["columns"] or {}), dict(change["identity"] or {})
        if op == "D":
            state[tuple(old[k] for k in key)] = None
            continue
        new_key = tuple(new[k] for k in key)
        base = current(new_key) or {}
        if op == "U" and old:
            old_key = tuple(old[k] for k in key)
            if old_key != new_key:
                base = current(old_key) or {}
                state[old_key] = None
        state[new_key] = {**base, **new}
    return state


def moved_onto(rows: dict[Key, Row], changes: Iterable[dict], key: tuple[str, ...]
               ) -> set[Key]:
    """The keys a change moved a row onto from a key not in ``rows``. Where ``rows`` is a
    sample, ``apply_changes`` cannot give such a key's row whole (the moved row was not read): a
    sampled compare leaves those keys out."""
    return {tuple(dict(c["columns"]).get(k) for k in key) for c in changes
            if c["op"] == "U" and c["identity"]
            and tuple(dict(c["identity"]).get(k) for k in key) not in rows}


def truncated(changes: Iterable[dict]) -> bool:
    return any(c["op"] == "T" for c in changes)


# --- one mirror ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MirrorCheck:
    table: str
    rows: int                       # the truth's rows
    version: int                    # the mirror's version compared
    holds: int                      # W: the mirror holds the changes up to this LSN
    differing: int                  # rows in one side and not the other
    keys: tuple[Key, ...] = ()      # a few differing keys
    lost: int = 0                   # source rows at the point holding a NaN or ±Infinity:
                                    # compared as NULL, the value wal2json gave (known loss)
    sampled: int | None = None      # where sampled: the rows compared column by column (every
                                    # key is compared); None: every row was

    @property
    def exact(self) -> bool:
        return self.differing == 0


def mirror_holds(spark, mirror: str) -> tuple[int, int]:
    """(version, newest change LSN it holds) of the mirror's newest lakecdc commit that
    ends a batch (a batch split by ``silver.mirrors.mirror_writer.chain_cuts`` commits its
    parts apart)."""
    from delta.tables import DeltaTable as SparkTable

    for row in SparkTable.forPath(spark, mirror).history(50).collect():
        meta = parse_commit_metadata(row.userMetadata, "mirror")
        if meta is not None and not meta.get("partial"):
            return row.version, int(meta.get("newest") or meta.get("seed") or 0)
    return 0, 0


def check_mirror(spark, config, table: str, point: int, silver_path: str, lost: int = 0,
                 sampled: bool = False) -> MirrorCheck:
    """Steps of the module docstring for ``table``; the mirrors' query has passed the
    marker and the source rows at ``point`` are in the scratch table (``lost`` of them
    held a NaN or ±Infinity, read as NULL). ``sampled``: the scratch holds every key of the
    table at the point and a sample of its rows (``write_baselines``), not every row."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from pipelines.source.mirror_baseline import keys_path
    from silver.mirrors.merge import q
    from silver.mirrors.mirror_types import typed
    from silver.mirrors.mirror_writer import bad_values_stop
    from silver.mirrors.store_spark import mirror_shape

    on_dbx = on_databricks()
    mirror = spark_path(mirror_path(config.lakehouse, table), on_dbx)
    version, newest = mirror_holds(spark, mirror)
    mirror_df = spark.read.format("delta").option("versionAsOf", version).load(mirror)
    key, types = mirror_shape(spark, mirror)
    changes = _changes_of(spark, silver_path, table, point, max(newest, point - 1))
    scratch = scratch_root(config.lakehouse)
    source = _source_rows(spark, scratch, table, types, on_dbx)
    text = StructType([StructField(c, StringType()) for c in types])
    touched_keys = {tuple(dict(c[side] or {}).get(k) for k in key)
                    for c in changes if c["op"] != "T" for side in ("columns", "identity")}
    touched_keys.discard(tuple(None for _ in key))
    keys_df = _keys_frame(spark, touched_keys, key)
    on = [F.col(q(k)) == F.col(f"__k{i}") for i, k in enumerate(key)]
    before = {} if not touched_keys else {
        tuple(r[k] for k in key): r.asDict()
        for r in source.join(keys_df, on, "left_semi").collect()}
    after = apply_changes(before, changes, key)
    kept = source.limit(0) if truncated(changes) else source.join(keys_df, on, "left_anti")
    moved_in = moved_onto(before, changes, key) if sampled else set()
    if sampled:
        after = {k: row for k, row in after.items() if k in before and k not in moved_in}
    netted = spark.createDataFrame([tuple(row.get(c) for c in types)
                                    for row in after.values() if row is not None], text)
    truth = kept.unionByName(netted)
    theirs = mirror_df.select(*[F.col(q(c)) for c in types])
    with bad_values_stop(table):
        truth = truth.select(*[typed(F.col(q(c)), t, c).alias(c) for c, t in types.items()])
        if not sampled:
            differing, sample = _differing_rows(truth, theirs, key)
            return MirrorCheck(table, truth.count(), version, max(newest, point - 1),
                               differing, sample, lost)
        # Every key: those of the source at the point, with the changes' keys applied
        # (their existence is all that is netted here), against the mirror's.
        every = spark.read.format("delta").load(spark_path(keys_path(scratch, table), on_dbx))
        truth_keys = _keys_at(spark, every, keys_df, on, changes, key, types)
        # Every column of the sample's rows, against the mirror's rows of the same keys.
        sample_keys = source.select(*[F.col(q(k)) for k in key])
        if moved_in:
            sample_keys = sample_keys.join(_keys_frame(spark, moved_in, key), on, "left_anti")
        sample_keys = sample_keys.select(*[typed(F.col(q(k)), types[k], k).alias(k)
                                           for k in key])
        their_rows = theirs.join(sample_keys, list(key), "left_semi")
        differing, sample = _differing_keys(truth_keys, truth, theirs, their_rows, key)
        return MirrorCheck(table, truth_keys.count(), version, max(newest, point - 1),
                           differing, sample, lost, truth.count())


def _changes_of(spark, silver_path: str, table: str, start: int, end: int) -> list[dict]:
    """Silver's changes of ``table`` from ``start`` to ``end`` (LSNs), as ``apply_changes`` takes
    them."""
    from pyspark.sql import functions as F

    from gold.asof import silver_range

    schema_name, table_name = table.split(".", 1)
    return [r.asDict() for r in silver_range(spark, silver_path, start, end)
            .where((F.col("schema_name") == schema_name) & (F.col("table_name") == table_name)
                   & F.col("op").isin("I", "U", "D", "R", "T"))
            .select("op", "commit_lsn", "seq", "columns", "identity").collect()]


def _source_rows(spark, scratch: str, table: str, types: dict, on_dbx: bool):
    """The source's rows at the point, as text, in the mirror's columns (one the scratch
    does not have: NULL)."""
    from pyspark.sql import functions as F

    from core.layout import mirror_baseline_path
    from silver.mirrors.merge import q

    source = spark.read.format("delta").load(spark_path(mirror_baseline_path(scratch, table),
                                                        on_dbx))
    return source.select(*[F.col(q(c)) if c in source.columns
                           else F.lit(None).cast("string").alias(c) for c in types])


def _keys_frame(spark, keys, key: tuple[str, ...]):
    """``keys`` as a DataFrame of text columns ``__k0``, ``__k1``... (one per column of
    ``key``), to join on."""
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField(f"__k{i}", StringType()) for i in range(len(key))])
    return spark.createDataFrame(list(keys), schema)


def _differing_rows(truth, theirs, key: tuple[str, ...]) -> tuple[int, tuple[Key, ...]]:
    """(how many rows are in one of the DataFrames and not the other, a few of their
    keys)."""
    from pyspark.sql import functions as F

    from silver.mirrors.merge import q

    missing, extra = truth.exceptAll(theirs), theirs.exceptAll(truth)
    differing = missing.count() + extra.count()
    sample = [] if not differing else missing.unionByName(extra).select(
        *[F.col(q(k)) for k in key]).distinct().limit(SAMPLE_KEYS).collect()
    return differing, tuple(tuple(r) for r in sample)


def _keys_at(spark, every, keys_df, on: list, changes: list[dict], key: tuple[str, ...],
             types: dict):
    """The truth's keys, typed: ``every`` key of the source at the point, with those the
    changes touched (``keys_df``, joined ``on``) applied."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from silver.mirrors.merge import q
    from silver.mirrors.mirror_types import typed

    existed = {tuple(r) for r in every.join(keys_df, on, "left_semi").collect()}
    now = apply_changes({k: dict(zip(key, k)) for k in existed}, changes, key)
    kept_keys = every.limit(0) if truncated(changes) else every.join(keys_df, on, "left_anti")
    key_text = StructType([StructField(k, StringType()) for k in key])
    truth_keys = kept_keys.select(*[F.col(q(k)) for k in key]).unionByName(
        spark.createDataFrame([k for k, row in now.items() if row is not None], key_text))
    return truth_keys.select(*[typed(F.col(q(k)), types[k], k).alias(k) for k in key])


def _differing_keys(truth_keys, truth, theirs, their_rows, key: tuple[str, ...]
                    ) -> tuple[int, tuple[Key, ...]]:
    """(how many keys differ, a few of them): keys only in the truth's (``truth_keys``) or
    only in the mirror's (``theirs``), and keys of rows only in ``truth`` or only in
    ``their_rows`` (the mirror's rows of the sample's keys)."""
    from pyspark.sql import functions as F

    from silver.mirrors.merge import q

    their_keys = theirs.select(*[F.col(q(k)) for k in key])
    wrong = truth_keys.exceptAll(their_keys).unionByName(their_keys.exceptAll(truth_keys)) \
        .unionByName(truth.exceptAll(their_rows).select(*[F.col(q(k)) for k in key])) \
        .unionByName(their_rows.exceptAll(truth).select(*[F.col(q(k)) for k in key])) \
        .distinct()
    differing = wrong.count()
    sample = [] if not differing else wrong.limit(SAMPLE_KEYS).collect()
    return differing, tuple(tuple(r) for r in sample)
