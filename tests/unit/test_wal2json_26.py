"""wal2json 2.6's ``numeric-data-types-as-string`` output, through the shipper's records,
silver's parse and the mirrors' typing.

``tests/fixtures/wal2json/numbers_as_text_2_6.jsonl`` is a peek written by hand in the
format wal2json 2.6 documents for that option (format v2, include-xids/-timestamp/-lsn, as
the shipper asks): every value of a ``smallint``, ``integer``, ``bigint``, ``oid``,
``real``, ``double precision`` or ``numeric`` column as a JSON string holding Postgres's
own text, ``NaN``, ``Infinity`` and ``-Infinity`` included; booleans, text and NULLs as
without the option. One transaction on ``public.odd (id int8 PRIMARY KEY, f4 real, f8
float8, n numeric, d numeric(10,2), s2 smallint, o oid, b bool, v text)``: three inserts, an
update of row 2 and a delete of row 3.

No registry this project installs from serves wal2json 2.6 for PostgreSQL 15 (Debian 12
packages 2.5), so this path is not run against a live 2.6 server here: these rows stand in
for one. The live server's side (2.5 gets the options it accepts, and the snapshot
backfill renders these same rows as 2.6 writes them) is tests/integration/test_wal2json_26.py.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from bronze.records import BRONZE_SCHEMA
from silver.mirrors.arrow_types import arrow_typed
from silver.mirrors.type_map import loses_specials, mirror_kind
from silver.parse import parse_table
from tests.unit.test_records import assemble

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "wal2json"
           / "numbers_as_text_2_6.jsonl")
PEEK = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
TYPES = {"id": "bigint", "f4": "real", "f8": "double precision", "n": "numeric",
         "d": "numeric(10,2)", "s2": "smallint", "o": "oid", "b": "boolean", "v": "text"}


def _silver() -> list[dict]:
    """The peek as the shipper's records, then as silver's change rows."""
    bronze, _ = assemble(PEEK)
    rows = parse_table(bronze.cast(BRONZE_SCHEMA), ("public.odd",), ()).to_pylist()
    assert [r["error"] for r in rows] == [None] * 5
    return rows


def test_every_value_reaches_silver_as_postgres_text_nan_and_infinity_included():
    rows = _silver()
    assert [(r["table_name"], r["op"]) for r in rows] == [("odd", "I")] * 3 + [
        ("odd", "U"), ("odd", "D")]
    inserted = [dict(r["columns"]) for r in rows[:3]]
    assert inserted[0] == {"id": "1", "f4": "NaN", "f8": "-Infinity", "n": "NaN", "d": "NaN",
                           "s2": "-3", "o": "12", "b": "true", "v": "a"}
    assert inserted[1] == {"id": "2", "f4": "1.5e+30", "f8": "1e-300",
                           "n": "12345678901234567890.123456789012345", "d": "-0.01",
                           "s2": None, "o": None, "b": None, "v": None}
    assert inserted[2] == {"id": "3", "f4": "Infinity", "f8": "0.1", "n": "-Infinity",
                           "d": "99999999.99", "s2": "32767", "o": "0", "b": "false", "v": ""}
    assert dict(rows[0]["column_types"]) == TYPES
    updated = dict(rows[3]["columns"])
    assert (updated["f8"], updated["n"], updated["d"]) == ("Infinity", "NaN", "NaN")
    # The delete's key, a bigint, is text in its identity too.
    assert dict(rows[4]["identity"]) == {"id": "3"} and rows[4]["old_id"] == "3"


def _typed(column: str) -> list:
    """The inserted rows' ``column`` in its mirror type, as the mirrors' writer types it."""
    texts = pa.array([dict(r["columns"])[column] for r in _silver()[:3]], pa.string())
    typed = arrow_typed(texts, TYPES[column])
    assert typed is not None, column
    return typed.to_pylist()


def test_the_mirror_keeps_a_floats_nan_and_infinity_and_a_numerics_text():
    f4, f8 = _typed("f4"), _typed("f8")
    assert math.isnan(f4[0]) and f4[1] == pytest.approx(1.5e30, rel=1e-6) and f4[2] == math.inf
    assert f8 == [-math.inf, 1e-300, 0.1]
    assert mirror_kind("numeric") == ("string",)     # silver's text is the mirror's value
    assert _typed("s2") == [-3, None, 32767] and _typed("o") == [12, None, 0]
    assert _typed("id") == [1, 2, 3] and _typed("b") == [True, None, False]


def test_only_a_decimals_nan_becomes_null_as_the_rule_says():
    assert _typed("d") == [None, Decimal("-0.01"), Decimal("99999999.99")]
    assert [c for c, t in TYPES.items() if loses_specials(t, numbers_as_text=True)] == ["d"]
