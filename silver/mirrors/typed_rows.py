"""The mirrors' Spark typing: a mirror's schema and its creation (``create_mirror``), and a
batch's netted rows typed as the mirror's columns for its MERGE.

``silver.mirrors.net_changes.column_values``'s rows (each column's value as text) become
``merge_source``'s rows: typed by Spark (``merge_source``, a part of a batch where a row moved
key), or by Arrow where its cast reads the text as Spark's typing does and by Spark for the
rest (``typed_rows``, ``typed_texts``). ``silver.mirrors.mirror_types`` is the types' rule;
``silver.mirrors.mirror_writer`` runs the MERGEs.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from core.config import READER_RETENTION_MINUTES
from core.spark_tables import create_table
from silver.mirrors.arrow_types import arrow_typed
from silver.mirrors.merge import q
from silver.mirrors.mirror_table import (
    COMMIT_LSN,
    COMMIT_TS,
    EXISTS,
    HAS_PREFIX,
    KEY_PROPERTY,
    TYPES_PROPERTY,
    TableSpec,
    mirror_properties,
    mirrored_columns,
)
from silver.mirrors.mirror_types import spark_type, typed
from silver.mirrors.net_changes import TEXT_PREFIX

ROW = "__lakecdc_row"    # a row's place in ``typed_texts``'s input


def mirror_schema(columns: list[tuple[str, str]]) -> StructType:
    return StructType([*[StructField(n, spark_type(t)) for n, t in columns],
                       StructField(COMMIT_LSN, LongType()),
                       StructField(COMMIT_TS, TimestampType())])


def create_mirror(spark: SparkSession, path: str, spec: TableSpec,
                  log_retention_minutes: int = READER_RETENTION_MINUTES) -> None:
    """Create the mirror of ``spec`` at ``path`` unless it exists (idempotent), its log kept
    ``log_retention_minutes`` (``mirror_properties``)."""
    create_table(spark, path, mirror_schema(list(spec.columns)),
                 {**mirror_properties(log_retention_minutes),
                  KEY_PROPERTY: json.dumps(list(spec.key)),
                  TYPES_PROPERTY: json.dumps(dict(spec.columns))},
                 comment=f"lakecdc mirror of {spec.name}")


def merge_source(final: DataFrame, key: tuple[str, ...], types: dict[str, str],
                 mirror: DataFrame | None = None) -> DataFrame:
    """``silver.mirrors.net_changes.column_values``'s rows typed as the mirror's columns
    (``types``: column → Postgres type; the i-th non-key column's text and whether it is
    set are its ``__lakecdc_text_<i>`` and ``__lakecdc_has_<i>``), with ``__lakecdc_exists``
    and, per non-key column ``i``, ``__lakecdc_has_<i>`` (unset: the MERGE keeps the
    mirror's value). ``mirror`` (the mirror as the batch starts): a row moved from another
    key takes the columns its UPDATE left out from the mirror's row at that key."""
    cols = [typed(F.col("_key")[k], types[k], k).alias(k) for k in key]
    others = mirrored_columns(key, types)
    if mirror is not None:
        old = mirror.select(*[F.col(q(k)).alias(f"__old_k{i}") for i, k in enumerate(key)],
                            *[F.col(q(n)).alias(f"__old_{i}") for i, n in enumerate(others)],
                            F.lit(True).alias("__old"))
        final = final.join(old, [typed(F.col("_from")[k], types[k], k) == F.col(f"__old_k{i}")
                                 for i, k in enumerate(key)], "left")
    for i, name in enumerate(others):
        carried = F.col(f"{HAS_PREFIX}{i}")
        value = typed(F.col(f"{TEXT_PREFIX}{i}"), types[name], name)
        if mirror is not None:
            value = F.when(carried, value).otherwise(F.col(f"__old_{i}"))
            carried = carried | F.col("__old").isNotNull()
        cols += [value.alias(name), carried.alias(f"{HAS_PREFIX}{i}")]
    return final.select(*cols, F.col("_exists").alias(EXISTS),
                        F.col("_lsn").alias(COMMIT_LSN), F.col("_ts").alias(COMMIT_TS))


def typed_rows(session: SparkSession, values: pa.Table, key: tuple[str, ...],
               types: dict[str, str]) -> pa.Table:
    """``merge_source``'s rows (without ``mirror``: a part that moves no key), in Arrow,
    from ``column_values``'s ``values``. A column whose mirror type is text is taken as it
    is (``typed`` leaves text as it is); numbers, booleans, dates and timestamps are typed
    by Arrow (``silver.mirrors.arrow_types``); only the rest (bytea, arrays, a value Arrow
    refuses) cross into Spark, in ``session``, to be typed. Of a catch-up batch's 82,000
    notifications, 4 of 15 columns are not text: typing them in Spark, beside the 52,514
    history rows, took 0.8 s where every column took 1.5-2.1 s (2 cores)."""
    others = mirrored_columns(key, types)
    keys = values.column("_key").combine_chunks()
    texts = {k: keys.field(k) for k in key}
    texts.update((n, values[f"{TEXT_PREFIX}{i}"]) for i, n in enumerate(others))
    convert = []
    for name in (n for n in (*key, *others) if spark_type(types[n]) != StringType()):
        by_arrow = arrow_typed(texts[name], types[name])
        if by_arrow is None:
            convert.append(name)
        else:
            texts[name] = by_arrow
    texts.update(typed_texts(session, {n: texts[n] for n in convert}, types, values.num_rows))
    columns = {k: texts[k] for k in key}
    for i, name in enumerate(others):
        columns[name], columns[f"{HAS_PREFIX}{i}"] = texts[name], values[f"{HAS_PREFIX}{i}"]
    columns.update({EXISTS: values["_exists"], COMMIT_LSN: values["_lsn"],
                    COMMIT_TS: values["_ts"]})
    return pa.table(columns).combine_chunks()


def typed_texts(session: SparkSession, texts: dict, types: dict[str, str],
                rows: int) -> dict[str, pa.Array]:
    """Each column of ``texts`` (column → its values' text, ``rows`` long) typed in Spark as
    its mirror column (``types``: column → Postgres type), in the same row order; nothing
    crosses into Spark when ``texts`` is empty."""
    if not texts:
        return {}
    names = list(texts)
    inputs = pa.table({ROW: pa.array(np.arange(rows, dtype=np.int64)),
                       **{f"__in{j}": texts[n] for j, n in enumerate(names)}})
    got = session.createDataFrame(inputs).select(
        ROW, *[typed(F.col(f"__in{j}"), types[n], n).alias(n)
               for j, n in enumerate(names)]).toArrow()
    order = got[ROW].to_numpy()
    if not np.array_equal(order, np.arange(len(order))):     # Spark kept no order
        got = got.take(pa.array(np.argsort(order)))
    return {n: got[n] for n in names}
