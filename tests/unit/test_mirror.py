"""``silver.mirror_types`` and ``silver.mirror.final_rows``: the type map, value conversion
and the fold of a table's changes to one row per key (TOAST, deletes, key changes)."""

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

from silver.mirror import final_rows
from silver.mirror_types import BAD_VALUE, spark_type, typed
from silver.schema import SILVER_CHANGES

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


def change(lsn, seq, op, columns=None, identity=None):
    row = {f.name: None for f in SILVER_CHANGES.fields}
    row.update(commit_lsn=lsn, seq=seq, tx_changes=1, lsn=lsn, op=op, schema_name="public",
               table_name="t", columns=columns, identity=identity,
               commit_ts=dt.datetime(2026, 1, 1) + dt.timedelta(seconds=lsn))
    return row


def fold(spark, rows, key=("a", "b"), moves=True):
    frame = spark.createDataFrame(rows, SILVER_CHANGES)
    out = final_rows(frame, key, moves).collect()
    return {tuple(r["_key"]): (r["_exists"], dict(r["_values"]), r["_lsn"])
            + ((tuple(r["_from"]),) if r["_from"] else ()) for r in out}


def test_fold_orders_by_commit_and_keeps_what_an_update_leaves_out(spark):
    """Rows arrive in any order; the last change wins per column; an UPDATE without the
    TOASTed column ``big`` leaves it out of the values (the MERGE keeps the mirror's)."""
    rows = [
        change(30, 0, "U", {"a": "1", "b": "x", "n": "3"}),               # big omitted
        change(10, 0, "I", {"a": "1", "b": "x", "n": "1", "big": "B1"}),
        change(20, 1, "U", {"a": "1", "b": "x", "n": "2", "big": "B2"}),
        change(20, 0, "U", {"a": "2", "b": "y", "n": "9"}),               # only an update
    ]
    got = fold(spark, rows)
    assert got[("1", "x")] == (True, {"a": "1", "b": "x", "n": "3", "big": "B2"}, 30)
    assert got[("2", "y")] == (True, {"a": "2", "b": "y", "n": "9"}, 20)
    # No key moves in the batch: the plan without the old rows' lookup folds the same.
    assert fold(spark, rows, moves=False) == got


def test_fold_delete_then_insert_and_key_change(spark):
    rows = [
        change(10, 0, "I", {"a": "1", "b": "x", "n": "1", "big": "B1"}),
        change(11, 0, "D", identity={"a": "1", "b": "x"}),
        change(12, 0, "I", {"a": "1", "b": "x", "n": "5", "big": None}),   # NULL is a value
        # The key moves from (3, z) to (4, z): the old key goes, the new one is upserted.
        change(13, 0, "U", {"a": "4", "b": "z", "n": "7"}, identity={"a": "3", "b": "z"}),
        # (7, v) is inserted, then moved to (8, v) by an UPDATE that leaves out big: the
        # moved row keeps big from the insert earlier in the batch; (7, v)'s changes after
        # the move are another row's.
        change(16, 0, "I", {"a": "7", "b": "v", "n": "1", "big": "B7"}),
        change(17, 0, "U", {"a": "8", "b": "v", "n": "2"}, identity={"a": "7", "b": "v"}),
        change(18, 0, "I", {"a": "7", "b": "v", "n": "3", "big": "other"}),
        change(14, 0, "D", identity={"a": "5", "b": "q"}),
        # FULL identity: every old value, key unchanged - an ordinary update.
        change(15, 0, "U", {"a": "6", "b": "w", "n": "8"},
               identity={"a": "6", "b": "w", "n": "7"}),
    ]
    got = fold(spark, rows)
    assert got[("1", "x")] == (True, {"a": "1", "b": "x", "n": "5", "big": None}, 12)
    assert got[("3", "z")] == (False, {}, 13)
    # The moved row's columns the UPDATE left out come from the mirror's row at (3, z).
    assert got[("4", "z")] == (True, {"a": "4", "b": "z", "n": "7"}, 13, ("3", "z"))
    assert got[("5", "q")] == (False, {}, 14)
    assert got[("6", "w")] == (True, {"a": "6", "b": "w", "n": "8"}, 15)
    assert got[("8", "v")] == (True, {"a": "8", "b": "v", "n": "2", "big": "B7"}, 17,
                               ("7", "v"))
    assert got[("7", "v")] == (True, {"a": "7", "b": "v", "n": "3", "big": "other"}, 18)
    assert len(got) == 7


def test_a_batch_says_per_table_whether_an_update_moved_a_row_to_another_key(spark):
    """With the mirror's key known, an UPDATE whose identity is wider than the key (the
    counted tables' dims index, FULL) moves nothing unless the key itself changed; without
    it, any identity counts as a possible move."""
    from silver.mirror import tables_in_batch

    def table(name, *changes):
        return [{**c, "table_name": name} for c in changes]

    rows = (table("wide", change(10, 0, "U", {"a": "1", "b": "x", "n": "2"},
                                 identity={"a": "1", "b": "x", "n": "1"}))
            + table("moving", change(11, 0, "U", {"a": "2", "b": "x"},
                                     identity={"a": "1", "b": "x"}),
                    change(12, 0, "U", {"a": "5", "b": "x"}))
            + table("unknown", change(13, 0, "U", {"a": "1", "b": "x"},
                                      identity={"a": "1", "b": "x"})))
    found, _ = tables_in_batch(spark.createDataFrame(rows, SILVER_CHANGES),
                               {"public.wide": ("a", "b"), "public.moving": ("a", "b")})
    assert {t.table: t.moved for t in found} == {"wide": False, "moving": True,
                                                 "unknown": True}


def test_a_batch_that_moves_a_row_twice_is_cut_before_the_second_move():
    from silver.mirror import chain_cuts

    a, b, c, d = ("1", "x"), ("2", "x"), ("3", "x"), ("9", "y")
    assert chain_cuts([(10, 1, a, b), (20, 1, d, c)]) == []            # two separate moves
    assert chain_cuts([(10, 1, a, b), (20, 1, b, c)]) == [(20, 1)]     # A -> B -> C
    assert chain_cuts([(10, 1, a, b), (10, 2, b, c), (11, 1, c, a)]) == [(10, 2), (11, 1)]
    assert chain_cuts([]) == []
