"""``silver.mirrors.mirror_types``: the type map and value conversion (the net:
``test_net_changes``)."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from silver.mirrors.mirror_types import BAD_VALUE, spark_type, typed

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("pg_type, expected", [
    ("smallint", IntegerType()), ("integer", IntegerType()), ("bigint", LongType()),
    ("numeric(12,2)", DecimalType(12, 2)), ("numeric(38,0)", DecimalType(38, 0)),
    ("numeric(40,2)", StringType()), ("numeric", StringType()),
    ("real", FloatType()), ("double precision", DoubleType()), ("boolean", BooleanType()),
    ("date", DateType()), ("timestamp without time zone", TimestampNTZType()),
    ("timestamp(3) without time zone", TimestampNTZType()),
    ("timestamp with time zone", TimestampType()),
    ("timestamp(6) with time zone", TimestampType()),
    ("text", StringType()), ("character varying(40)", StringType()), ("uuid", StringType()),
    ("jsonb", StringType()), ("notify_status", StringType()), ("interval", StringType()),
    ("bytea", BinaryType()), ("integer[]", ArrayType(IntegerType())),
    ("text[]", ArrayType(StringType())), ("numeric(5,1)[]", ArrayType(DecimalType(5, 1))),
    ("bytea[]", StringType()),
])
def test_type_map(pg_type, expected):
    assert spark_type(pg_type) == expected


CONVERSIONS = [
    ("integer", "-42", -42), ("bigint", "9007199254740993", 9007199254740993),
    ("numeric(12,2)", "1234567890.12", Decimal("1234567890.12")),
    ("double precision", "0.1", 0.1), ("boolean", "true", True),
    ("date", "2026-02-28", dt.date(2026, 2, 28)),
    ("timestamp with time zone", "2026-01-02 03:04:05.123456+00",
     dt.datetime(2026, 1, 2, 3, 4, 5, 123456)),
    ("timestamp with time zone", "2026-01-02 05:04:05+02",
     dt.datetime(2026, 1, 2, 3, 4, 5)),
    ("timestamp with time zone", "2026-01-02 03:34:05+00:30",
     dt.datetime(2026, 1, 2, 3, 4, 5)),
    ("timestamp without time zone", "2026-01-02 03:04:05.5",
     dt.datetime(2026, 1, 2, 3, 4, 5, 500000)),
    ("bytea", "00ff10", bytes([0, 255, 16])),
    ("integer[]", "{1,-2,NULL}", [1, -2, None]), ("integer[]", "{}", []),
    ("text[]", '{plain,"with space","quote\\"d","comma,inside",NULL,"NULL"}',
     ["plain", "with space", 'quote"d', "comma,inside", None, "NULL"]),
    ("text", "anything", "anything"), ("integer", None, None),
    # Numbers as text (wal2json 2.6+): floats keep ±Infinity (NaN below), an unconstrained
    # numeric is text, and a decimal's NaN is NULL, the known loss (no error).
    ("double precision", "Infinity", float("inf")), ("real", "-Infinity", float("-inf")),
    ("numeric", "NaN", "NaN"), ("numeric(12,2)", "NaN", None),
]


def test_conversions(spark):
    """Each value's text as Postgres (through wal2json) prints it, in its mirror type; the
    session's time zone is UTC (core.spark)."""
    frame = spark.createDataFrame([tuple(t for _, t, _ in CONVERSIONS)],
                                  ", ".join(f"t{i} string" for i in range(len(CONVERSIONS))))
    got = frame.select(*[typed(F.col(f"t{i}"), pg, f"c{i}").alias(f"c{i}")
                         for i, (pg, _, _) in enumerate(CONVERSIONS)]).first()
    for i, (pg, text, expected) in enumerate(CONVERSIONS):
        assert got[i] == expected, (pg, text)
    nan = spark.createDataFrame([("NaN",)], "t string").select(
        typed(F.col("t"), "double precision", "c")).first()[0]
    assert math.isnan(nan)


# Texts of every kind Arrow types (``silver.mirrors.arrow_types``), as Postgres prints them
# through wal2json, with the forms Arrow leaves to Spark (an offset with seconds, a year past
# 9999, BC, infinity, text with spaces).
ARROW_TEXTS = {
    "smallint": ["0", "-32768", "32767"], "integer": ["-42", "2147483647", " 7"],
    "bigint": ["9007199254740993", "-9223372036854775808"],
    "real": ["0.1", "1.17549435e-38", "3.4028235e+38", "-0", "NaN", "Infinity", "-Infinity"],
    "double precision": ["0.1", "1e-320", "1.7976931348623157e+308", "NaN", "-Infinity"],
    "boolean": ["true", "false"], "numeric(12,2)": ["1234567890.12", "-0.01", "0.00", "NaN"],
    "numeric(38,0)": ["99999999999999999999999999999999999999"],
    "date": ["2026-02-28", "0001-01-01", "9999-12-31", "2000-02-29"],
    "timestamp with time zone": [
        "2026-01-02 03:04:05.123456+00", "2026-01-02 05:04:05+02", "2026-01-02 03:34:05+05:30",
        "1900-01-01 00:00:00-03", "1890-01-01 00:00:00+00:01:15", "0001-01-01 00:00:00+00"],
    "timestamp(3) without time zone": ["2026-01-02 03:04:05.5", "2026-01-02 03:04:05",
                                       "0001-01-01 00:00:00", "1999-12-31 23:59:59.999"],
}


@pytest.mark.parametrize("pg_type", sorted(ARROW_TEXTS))
def test_arrow_types_a_column_as_spark_does_or_leaves_it_to_spark(spark, pg_type):
    """Each text alone, and every one in one column: where Arrow types a column, each value
    equals Spark's typing of it (NaN as NaN); the usual forms are Arrow's (not left to Spark)."""
    from silver.mirrors.arrow_types import arrow_typed

    texts = [*ARROW_TEXTS[pg_type], None]
    frame = spark.createDataFrame([(t,) for t in texts], "t string")
    by_spark = frame.select(typed(F.col("t"), pg_type, "c")).toArrow().column(0).to_pylist()

    def same(a, b):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
            return math.isnan(b)
        return a == b and type(a) is type(b)

    typed_alone = 0
    for text, expected in zip(texts, by_spark):
        got = arrow_typed(pa.array([text], pa.string()), pg_type)
        if got is not None:
            typed_alone += 1
            assert same(got.to_pylist()[0], expected), (pg_type, text, got, expected)
    assert typed_alone >= len(texts) - 2, (pg_type, typed_alone)
    whole = arrow_typed(pa.array(texts, pa.string()), pg_type)
    if whole is not None:
        assert all(same(a, b) for a, b in zip(whole.to_pylist(), by_spark)), pg_type


@pytest.mark.parametrize("pg_type", ["bytea", "integer[]", "text", "uuid", "numeric",
                                     "numeric(40,2)", "interval"])
def test_arrow_leaves_the_other_kinds_to_spark(pg_type):
    from silver.mirrors.arrow_types import arrow_typed

    assert arrow_typed(pa.array(["00ff"], pa.string()), pg_type) is None


@pytest.mark.parametrize("pg_type, text", [
    ("date", "infinity"), ("integer", "12x"), ("integer[]", "{{1,2},{3,4}}"),
    ("integer[]", "{1,x}"), ("timestamp with time zone", "-infinity"), ("bytea", "0g"),
])
def test_a_value_that_does_not_convert_is_an_error_never_null(spark, pg_type, text):
    frame = spark.createDataFrame([(text,)], "t string")
    with pytest.raises(Exception, match=BAD_VALUE):
        frame.select(typed(F.col("t"), pg_type, "c")).collect()


def _netted(values: list[dict], keys: list[str]) -> pa.Table:
    """``net_changes``'s shape for rows keyed by ``keys`` (text), each with the columns it
    sets (``values``); every third row a delete."""
    import pyarrow as pa

    n = len(keys)
    return pa.table({
        "_key": pa.StructArray.from_arrays([pa.array(keys)], names=["id"]),
        "_exists": pa.array([i % 3 != 2 for i in range(n)]),
        "_values": pa.array([list(v.items()) for v in values], pa.map_(pa.string(), pa.string())),
        "_from": pa.array([None] * n, pa.struct([("id", pa.string())])),
        "_lsn": pa.array(range(100, 100 + n), pa.int64()),
        "_ts": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)] * n,
                        pa.timestamp("us", tz="UTC")),
    })


def test_typed_rows_equal_the_whole_spark_typing_and_stop_on_a_bad_value(spark):
    """``typed_rows`` (Arrow's types where it reads the text as Spark does, Spark's for
    the rest: ``old``, whose offsets with seconds Arrow refuses, goes to Spark whole) gives
    what ``merge_source`` (every column through Spark) gives: same columns, values and
    order; columns a row does not set stay unset. A value that does not convert is the same
    error."""
    import random

    from silver.mirrors.typed_rows import merge_source, typed_rows
    from silver.mirrors.net_changes import column_values
    from silver.mirrors.mirror_table import mirrored_columns

    types = {"id": "integer", "name": "text", "at": "timestamp with time zone",
             "amount": "numeric(12,2)", "tags": "text[]", "blob": "bytea", "ref": "uuid",
             "n": "bigint", "day": "date", "ok": "boolean", "ratio": "double precision",
             "local": "timestamp without time zone", "old": "timestamp with time zone"}
    samples = {"name": ["a", "", "x y"],
               "at": ["2026-01-02 03:04:05+00", "2026-01-02 03:04:05.5+05:30"],
               "amount": ["1.50", "-0.01"], "tags": ['{a,"b c"}', "{}"], "blob": ["00ff", ""],
               "ref": ["6f1c2a3e-0000-4000-8000-000000000001"], "n": ["9007199254740993", "-1"],
               "day": ["2026-02-28", "0001-01-01"], "ok": ["true", "false"],
               "ratio": ["0.1", "-Infinity", "1e-320"],
               "local": ["2026-01-02 03:04:05.5", "1999-12-31 23:59:59"],
               "old": ["1890-01-01 00:00:00+00:01:15", "2026-01-02 03:04:05+00"]}
    rng = random.Random(38)
    rows = [{c: rng.choice([*texts, None]) for c, texts in samples.items() if rng.random() < 0.8}
            for _ in range(200)]
    keys = [str(i) for i in rng.sample(range(10_000), len(rows))]
    values = column_values(_netted(rows, keys), mirrored_columns(("id",), types))
    whole = merge_source(spark.createDataFrame(values), ("id",), types).toArrow()
    split = typed_rows(spark, values, ("id",), types)
    assert split.column_names == whole.column_names
    assert split.to_pylist() == whole.to_pylist()

    bad = column_values(_netted([{"n": "12x"}], ["1"]), mirrored_columns(("id",), types))
    with pytest.raises(Exception, match=BAD_VALUE):
        typed_rows(spark, bad, ("id",), types)
