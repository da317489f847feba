"""``silver.mirror_types``: the type map and value conversion (the fold:
``test_mirror_fold``)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

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

from silver.mirror_types import BAD_VALUE, spark_type, typed

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
    ("timestamp without time zone", "2026-01-02 03:04:05.5", dt.datetime(2026, 1, 2, 3, 4, 5, 500000)),
    ("bytea", "00ff10", bytes([0, 255, 16])),
    ("integer[]", "{1,-2,NULL}", [1, -2, None]), ("integer[]", "{}", []),
    ("text[]", '{plain,"with space","quote\\"d","comma,inside",NULL,"NULL"}',
     ["plain", "with space", 'quote"d', "comma,inside", None, "NULL"]),
    ("text", "anything", "anything"), ("integer", None, None),
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


@pytest.mark.parametrize("pg_type, text", [
    ("date", "infinity"), ("integer", "12x"), ("integer[]", "{{1,2},{3,4}}"),
    ("integer[]", "{1,x}"), ("timestamp with time zone", "-infinity"), ("bytea", "0g"),
])
def test_a_value_that_does_not_convert_is_an_error_never_null(spark, pg_type, text):
    frame = spark.createDataFrame([(text,)], "t string")
    with pytest.raises(Exception, match=BAD_VALUE):
        frame.select(typed(F.col("t"), pg_type, "c")).collect()
