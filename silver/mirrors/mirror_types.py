"""Postgres column types, as wal2json reports them, to the mirrors' Spark types; and the
expression that turns a value's text (silver's ``columns``) into that type.

wal2json names a type with ``format_type`` (typmod included: ``numeric(12,2)``,
``character varying(40)``, ``timestamp(3) with time zone``, ``integer[]``) and prints a value
with the type's text output, except numbers and booleans (bare JSON, quoted back to text by
``silver.parse``) and bytea (its hex digits, without ``\\x``). The table of the mapping is
docs/silver.md, "Mirrors"; ``silver.mirrors.type_map`` is its one implementation (without
Spark), and this module gives its kinds as Spark types and types values with them.

A decimal's ``NaN`` (numbers printed as text, wal2json 2.6+) is NULL, a known loss
(``silver.mirrors.type_map.loses_specials``). Any other value whose text does not convert
(a date of ``infinity``, a two-dimensional array) never becomes NULL silently: ``typed`` evaluates
to an error naming the column, which stops the mirror (``silver.mirrors.mirror_writer``).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
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

from silver.mirrors.type_map import mirror_kind

# Raised (``raise_error``) when a value's text does not convert;
# ``silver.mirrors.mirror_writer`` finds it in Spark's error and turns it into one sentence.
BAD_VALUE = "lakecdc-mirror-bad-value"

_SPARK = {"int": IntegerType(), "long": LongType(), "float": FloatType(),
          "double": DoubleType(), "boolean": BooleanType(), "date": DateType(),
          "binary": BinaryType(), "string": StringType(), "timestamp": TimestampType(),
          "timestamp_ntz": TimestampNTZType()}


def spark_type(pg_type: str) -> DataType:
    """The mirror column type of a Postgres type named as wal2json names it
    (``silver.mirrors.type_map``, as a Spark type)."""
    return _kind_spark(mirror_kind(pg_type))


def _kind_spark(kind: tuple) -> DataType:
    if kind[0] == "decimal":
        return DecimalType(kind[1], kind[2])
    if kind[0] == "array":
        return ArrayType(_kind_spark(kind[1]))
    return _SPARK[kind[0]]


def typed(text: Column, pg_type: str, column: str) -> Column:
    """``text`` (a value's text, NULL for SQL NULL) as ``spark_type(pg_type)``; an error
    naming ``column`` where non-NULL text does not convert."""
    target = spark_type(pg_type)
    if isinstance(target, DecimalType):
        # wal2json 2.6's numbers as text carry a numeric's NaN; a decimal has none (and
        # Postgres refuses infinities under a precision): NULL, the known loss of
        # ``silver.mirrors.type_map.loses_specials``.
        text = F.when(text != "NaN", text)
    value = _convert(text, target)
    if isinstance(target, StringType):
        return value
    return F.when(text.isNotNull() & value.isNull(),
                  F.raise_error(F.concat(F.lit(f"{BAD_VALUE}: column {column} ({pg_type}): "),
                                         F.substring(text, 1, 80)))
                  ).otherwise(value)


def _convert(text: Column, target: DataType) -> Column:
    if isinstance(target, StringType):
        return text
    if isinstance(target, BinaryType):
        return F.when(text.rlike("^([0-9a-fA-F]{2})*$"), F.unhex(text))
    if isinstance(target, TimestampType):
        # Postgres prints the zone as +HH, +HH:MM or +HH:MM:SS; Spark wants +HH:MM.
        return F.try_to_timestamp(F.regexp_replace(text, r"([+-]\d\d)$", "$1:00"))
    if isinstance(target, ArrayType):
        return _array(text, target.elementType)
    return text.try_cast(target)


# One element of a one-dimensional array's text: a double-quoted string (with backslash
# escapes) or a run of characters without commas, quotes or braces.
_ELEMENT = r'"(?:[^"\\]|\\.)*"|[^,"{}]+'


def _array(text: Column, element: DataType) -> Column:
    """``{a,b,"c d",NULL}`` as an array; NULL (an error in ``typed``) for any other shape
    (more dimensions, bounds like ``[0:1]={...}``)."""
    one_dim = text.rlike(r'^\{(' + _ELEMENT + r')?(,(' + _ELEMENT + r'))*\}$')
    items = F.regexp_extract_all(text, F.lit(_ELEMENT), 0)

    def one(item: Column) -> Column:
        quoted = item.startswith('"')
        unquoted = F.regexp_replace(F.substring(item, 2, 1 << 30).substr(F.lit(1),
                                    F.length(item) - 2), r"\\(.)", "$1")
        value = F.when(quoted, unquoted).when(item == "NULL", F.lit(None)).otherwise(item)
        return value if isinstance(element, StringType) else value.try_cast(element)

    def lost(item: Column, value: Column) -> Column:
        return value.isNull() & (item != "NULL")

    converted = F.transform(items, one)
    # An element that did not convert makes the whole value NULL, so ``typed`` reports it.
    whole = F.when(~F.exists(F.arrays_zip(items.alias("i"), converted.alias("v")),
                             lambda p: lost(p["i"], p["v"])), converted)
    return F.when(text == "{}", F.array().cast(ArrayType(element))) \
        .when(one_dim, whole)
