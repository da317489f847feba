"""The mirrors' type map, without Spark: a Postgres type as wal2json names it (``format_type``,
typmod included) to the kind of column its mirror holds, and that kind in Arrow. The one
place of the rule: ``silver.mirrors.mirror_types`` gives the same kinds as Spark types (and types
values with them), the load (``silver.mirrors.chunk_load``) reads Arrow ones, and commands that
run no JVM (``setup``, ``tables add``) use it without importing Spark.

A kind is a tuple: ``("int",)``, ``("long",)``, ``("float",)``, ``("double",)``,
``("boolean",)``, ``("date",)``, ``("binary",)``, ``("string",)``, ``("timestamp",)`` (with
time zone: an instant), ``("timestamp_ntz",)``, ``("decimal", precision, scale)``, or
``("array", element kind)``.
"""

from __future__ import annotations

import re

import pyarrow as pa

_SCALARS = {"smallint": "int", "integer": "int", "bigint": "long", "oid": "long",
            "real": "float", "double precision": "double", "boolean": "boolean",
            "date": "date", "bytea": "binary"}
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")
_TIMESTAMP = re.compile(r"timestamp(?:\(\d\))? (with|without) time zone")
MAX_PRECISION = 38          # Spark's decimal
# Element kinds whose array text the typing parses (one dimension, no quoting needed for
# numbers and booleans; quoted text elements are unquoted).
_ARRAY_ELEMENTS = ("int", "long", "float", "double", "boolean", "decimal", "string")
_ARROW = {"int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
          "double": pa.float64(), "boolean": pa.bool_(), "date": pa.date32(),
          "binary": pa.binary(), "string": pa.string(),
          "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us")}


def mirror_kind(pg_type: str) -> tuple:
    """The kind of mirror column a Postgres type named as wal2json names it gets."""
    if pg_type.endswith("[]"):
        element = mirror_kind(pg_type[:-2])
        return ("array", element) if element[0] in _ARRAY_ELEMENTS else ("string",)
    if pg_type in _SCALARS:
        return (_SCALARS[pg_type],)
    numeric = _NUMERIC.fullmatch(pg_type)
    if numeric and int(numeric.group(1)) <= MAX_PRECISION:
        return ("decimal", int(numeric.group(1)), int(numeric.group(2)))
    timestamp = _TIMESTAMP.fullmatch(pg_type)
    if timestamp:
        return ("timestamp",) if timestamp.group(1) == "with" else ("timestamp_ntz",)
    # text, varchar, char, uuid, enums, json/jsonb, unconstrained numeric, time, interval...
    return ("string",)


def holds_specials(pg_type: str) -> bool:
    """Whether a column of ``pg_type`` can hold NaN or ±Infinity (Postgres's floats and
    numerics)."""
    return pg_type in ("real", "double precision") or pg_type.split("(")[0] == "numeric"


def loses_specials(pg_type: str, numbers_as_text: bool) -> bool:
    """Whether a NaN or ±Infinity of a ``pg_type`` column reaches its mirror as NULL: every
    one where wal2json prints numbers as JSON numbers (2.5: those values as ``null``); with
    numbers as text (2.6+), only a decimal's NaN (a numeric with a precision Spark's decimal
    holds, which has no NaN; Postgres refuses infinities there)."""
    return holds_specials(pg_type) and (not numbers_as_text
                                        or mirror_kind(pg_type)[0] == "decimal")


def kind_arrow(kind: tuple) -> pa.DataType:
    """A kind as the Arrow type a mirror's Parquet holds it in (as Spark writes it)."""
    if kind[0] == "decimal":
        return pa.decimal128(kind[1], kind[2])
    if kind[0] == "array":
        return pa.list_(kind_arrow(kind[1]))
    return _ARROW[kind[0]]


def arrow_type(pg_type: str) -> pa.DataType:
    return kind_arrow(mirror_kind(pg_type))
