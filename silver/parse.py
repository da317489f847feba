"""bronze → silver as pure DataFrame transforms: wal2json v2 text to typed change rows.

``parse_changes(bronze, known_tables, counted_tables)`` contract:

- **One row out per row in**, never filtered, keyed by bronze's ``(commit_lsn, seq)`` and
  carrying ``tx_changes``, so a reader can tell when it holds a whole transaction. Row order
  is not meaningful (Spark); order by ``(commit_lsn, seq)``.
- **Deterministic**: the output depends only on the bronze row and ``known_tables``. A
  replayed micro-batch produces the same rows, which is what lets the Delta sink's skip of
  an already-committed batch be exact.
- **Never raises on data**. A row that cannot be trusted gets ``error`` set and ``op`` and
  every parsed column NULL (so ``op IS NULL`` ⇔ ``error IS NOT NULL``); its raw JSON goes to
  quarantine through ``quarantine_rows``, which applies the same rules.
- The JSON is parsed once per row (one ``from_json``; later steps read its struct).

Which rows fail, and which are carried through (messages, truncates, added columns, numeric
``NaN``): docs/silver.md, "Quarantine policy". The ``error`` texts, first match wins, are
``_error`` below. A change of a counted table that gold cannot attribute (no id or dims, an
identity without them) fails here so that gold stops loudly rather than count NULL dims
(docs/gold.md); other captured tables need no such columns. Snapshot
reads (op ``R``) are parsed and checked like inserts; gold counts them 0.

Numbers: wal2json 2.5 writes numerics as bare JSON numbers, and Spark's ``from_json`` reads a
bare number into a string field through a double (``12345678901234567890.123456789012345``
becomes ``"1.2345678901234567E19"``, ``1.50`` becomes ``"1.5"``; measured on Spark 4.1.1).
So bare scalar column values are quoted in the text first and reach silver exactly as
Postgres printed them. (wal2json 2.5 prints numeric NaN/±Infinity as ``null``; a bare
``NaN`` from elsewhere is carried as the text ``NaN``.)
"""

from __future__ import annotations

from typing import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from core.captured import IDENTITY_COLUMNS
from core.spark import built_once
from silver.schema import SILVER_CHANGES, SILVER_QUARANTINE, WAL2JSON_CHANGE

CHANGE_ACTIONS = ("I", "U", "D", "T", "R")    # R: a snapshot backfill read
WRITE_ACTIONS = ("I", "U", "R")                 # carry the new row in ``columns``
MESSAGE_ACTION = "M"
KEY_COLUMNS = IDENTITY_COLUMNS      # id + the four dims, new (I/U/R) and old (identity)

_CORRUPT = "_corrupt_record"
_NEW, _OLD = "_new_", "_old_"          # prefixes of the key columns' new / old values
_PARSE_SCHEMA = StructType([*WAL2JSON_CHANGE.fields, StructField(_CORRUPT, StringType())])
_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}

# A bare JSON scalar (number, NaN, Infinity) as the value of a "value" key. In wal2json v2
# "value" is only ever a key of a column object, and the text `"value":` cannot occur inside
# a JSON string (its quotes would be escaped), so only column values are touched.
# The pattern starts with the literal `"value":` so that Java's regex engine skips through
# the text with Boyer-Moore instead of trying a group at every character: 2.5x faster, and
# parse_changes 1.5x, on 212,871 bronze rows of the benchmark workload (same output).
# Whitespace after the colon is not kept: it means nothing in JSON.
_BARE_VALUE = r'"value":\s*(-?[0-9][0-9.eE+\-]*|NaN|-?Infinity)(?=\s*[,}])'
_QUOTED_VALUE = '"value":"$1"'


def parse_changes(bronze: DataFrame, known_tables: Iterable[str],
                  counted_tables: Iterable[str] | None = None) -> DataFrame:
    """Bronze rows as silver change rows, in ``SILVER_CHANGES`` column order and types.
    ``counted_tables``: the known tables whose changes must carry ``id`` and the dims
    (gold counts them); None: every known table."""
    key = _key("parse_changes", known_tables, counted_tables)
    steps, final = built_once(key, lambda: (_parse_steps(*key[1:]), _change_columns()))
    return _apply(bronze, steps).select(*final)


def _change_columns() -> list[Column]:
    """The last projection of ``parse_changes``: ``SILVER_CHANGES`` from the parse steps."""
    ok = F.col("error").isNull()
    action = F.col("_j.action")
    change = action.isin(*CHANGE_ACTIONS)
    message = action == MESSAGE_ACTION
    new = F.col("_new")
    values = {
        "op": action,
        "schema_name": F.when(change, F.col("_j.schema")),
        "table_name": F.when(change, F.col("_j.table")),
        **{c: F.col(_NEW + c) for c in KEY_COLUMNS},
        **{f"old_{c}": F.col(_OLD + c) for c in KEY_COLUMNS},
        "columns": new,
        "identity": F.col("_old"),
        # ``_new``/``_old`` are set exactly when those names are well formed: not checked
        # again (the check hashes every name of every row).
        "column_types": F.when(F.col("_j.columns").isNotNull(),
                               F.when(new.isNotNull(), _types(F.col("_j.columns"))))
                         .otherwise(F.when(F.col("_old").isNotNull(),
                                           _types(F.col("_j.identity")))),
        "message_prefix": F.when(message, F.col("_j.prefix")),
        "message_content": F.when(message, F.col("_j.content")),
    }
    # Everything parsed is NULL on a failed row: consumers filter on one column, not many.
    exprs = {name: F.when(ok, value) for name, value in values.items()}
    return [exprs.get(f.name, F.col(f.name)).cast(f.dataType).alias(f.name)
            for f in SILVER_CHANGES.fields]


def quarantine_rows(bronze: DataFrame, known_tables: Iterable[str],
                    counted_tables: Iterable[str] | None = None) -> DataFrame:
    """The bronze rows ``parse_changes`` marks failed, with their raw JSON and the error.

    Same rules as ``parse_changes`` (same ``_parse_steps``), so for any bronze input the rows
    here are exactly the rows of ``parse_changes`` with ``error`` set.
    """
    key = _key("quarantine_rows", known_tables, counted_tables)
    steps, final = built_once(key, lambda: (_parse_steps(*key[1:]), _quarantine_column()))
    return _apply(bronze, steps).select(final)


def _quarantine_column() -> Column:
    failed = F.struct(*[F.col(f.name).cast(f.dataType).alias(f.name)
                        for f in SILVER_QUARANTINE.fields])
    # A flat-map rather than `where(error IS NOT NULL)`: the optimizer pushes a filter below
    # the projections, substituting the whole error expression - and the from_json inside
    # it - at every reference (over a hundred JSON parses per row, 13x slower, measured).
    # A generator's input is not substituted, so the JSON is parsed once per row here too.
    return F.inline(F.when(F.col("error").isNotNull(), F.array(failed)))


def _key(name: str, known_tables: Iterable[str],
         counted_tables: Iterable[str] | None) -> tuple:
    return (name, tuple(known_tables),
            None if counted_tables is None else tuple(counted_tables))


def _apply(bronze: DataFrame, steps: list[list[Column]]) -> DataFrame:
    for columns in steps:
        bronze = bronze.select("*", *columns)
    return bronze


def _parse_steps(known_tables: tuple[str, ...],
                 counted: tuple[str, ...] | None) -> list[list[Column]]:
    """The columns each projection adds to the bronze columns: the parsed JSON ``_j``,
    column maps ``_new``/``_old``, the key columns' values in them (``_NEW``/``_OLD`` + name)
    and ``error``. Built once per Spark context (``core.spark.built_once``).

    Four projections so the costly expressions are evaluated once per row: the optimizer
    does not inline a non-trivial expression that a later projection uses more than once.
    Maps built without lambdas, each key looked up once, and the error texts built only for
    failing rows: ``parse_changes`` 6.6-6.8 s -> 5.6-5.7 s on the 342,000-row benchmark
    backlog (warm JVM, noop sink, two runs each, measured 2026-11-25), ``quarantine_rows``
    5.8 -> 4.1 s.
    """
    text = F.regexp_replace(F.col("data"), _BARE_VALUE, _QUOTED_VALUE)
    return [
        [F.from_json(text, _PARSE_SCHEMA, _JSON_OPTIONS).alias("_j")],
        [_name_map(F.col("_j.columns")).alias("_new"),
         _name_map(F.col("_j.identity")).alias("_old")],
        [*[F.try_element_at(F.col("_new"), F.lit(c)).alias(_NEW + c) for c in KEY_COLUMNS],
         *[F.try_element_at(F.col("_old"), F.lit(c)).alias(_OLD + c) for c in KEY_COLUMNS]],
        [_error(known_tables, counted).alias("error")],
    ]


def _name_map(entries: Column) -> Column:
    """``[{name, value}, ...]`` as a name → value map; NULL if names are missing or
    repeat.

    ``map_from_arrays`` raises on a NULL or duplicate key under Spark's default
    ``mapKeyDedupPolicy``; the guard keeps poison input from failing the whole stream. No
    lambdas: Spark evaluates higher-order functions interpreted, row by row.
    """
    names = entries["name"]
    well_named = F.size(F.array_distinct(F.array_compact(names))) == F.size(entries)
    return F.when(well_named, F.map_from_arrays(names, entries["value"]))


def _types(entries: Column) -> Column:
    """``[{name, type}, ...]`` as a name → type map, for entries whose names ``_name_map``
    found well formed."""
    return F.map_from_arrays(entries["name"], entries["type"])


def _missing(prefix: str) -> Column:
    """Comma-separated key columns whose ``prefix`` column is NULL ('' if none)."""
    return F.concat_ws(", ", *[F.when(F.col(prefix + c).isNull(), F.lit(c))
                               for c in KEY_COLUMNS])


def _all_set(prefix: str) -> Column:
    """Every key column's ``prefix`` column is set (the cheap test before ``_missing``)."""
    cond = F.col(prefix + KEY_COLUMNS[0]).isNotNull()
    for c in KEY_COLUMNS[1:]:
        cond = cond & F.col(prefix + c).isNotNull()
    return cond


def _error(known_tables: tuple[str, ...], counted: tuple[str, ...] | None) -> Column:
    j = F.col("_j")
    action = j["action"]
    columns, identity = j["columns"], j["identity"]
    change = action.isin(*CHANGE_ACTIONS)
    writes = action.isin(*WRITE_ACTIONS)
    qualified = F.concat_ws(".", j["schema"], j["table"])
    # The lists of missing columns are built only for the rows that fail on them.
    missing_new, missing_old = _missing(_NEW), _missing(_OLD)
    # Only a counted table's change must carry id and the dims (every known one if None).
    keyed = F.lit(True) if counted is None else qualified.isin(*counted)
    # Every condition is NULL-safe or guarded by the ones before it: `when` treats NULL as
    # false, which must never let a bad row through as a good one.
    return (
        F.when(j.isNull() | j[_CORRUPT].isNotNull(), F.lit("malformed JSON"))
        .when(action.isNull(), F.lit("no action in JSON"))
        .when(action != F.col("action"),
              F.concat(F.lit("JSON action "), action, F.lit(" differs from bronze action "),
                       F.col("action")))
        .when(~change & (action != MESSAGE_ACTION), F.concat(F.lit("unknown action "), action))
        .when(change & (j["schema"].isNull() | j["table"].isNull()),
              F.lit("change without schema or table"))
        .when(change & ~qualified.isin(*known_tables),
              F.concat(F.lit("unknown table "), qualified))
        .when(writes & (F.coalesce(F.size(columns), F.lit(0)) <= 0),
              F.concat(action, F.lit(" without columns")))
        .when((action == "D") & (F.coalesce(F.size(identity), F.lit(0)) <= 0),
              F.lit("D without identity"))
        .when(writes & F.col("_new").isNull(), F.lit("duplicate or unnamed column in columns"))
        .when(identity.isNotNull() & F.col("_old").isNull(),
              F.lit("duplicate or unnamed column in identity"))
        .when(writes & keyed & ~_all_set(_NEW),
              F.concat(action, F.lit(" without "), missing_new, F.lit(" in columns")))
        .when(action.isin("U", "D") & keyed & identity.isNotNull() & ~_all_set(_OLD),
              F.concat(action, F.lit(" identity lacks "), missing_old,
                       F.lit(": the replica identity must cover id and the dims")))
    )
