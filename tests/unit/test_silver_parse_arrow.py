"""``silver.parse.parse_table`` on Arrow directly: the whole-chunk JSON read and its
row-by-row retry never let one row's text shift, hide or take another row's values, in any
chunk of a batch parsed in parallel. (The parse rules themselves: test_silver_parse.py.)"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import silver.parse as parse
from bronze.records import BRONZE_SCHEMA
from silver.parse import parse_table, quarantine_table
from tests.unit.test_silver_parse import KEYS, bronze_row, nid, w2j

KNOWN = ("public.notifications",)


def insert(n: int) -> str:
    return w2j("I", columns={**KEYS, "id": nid(n)})


def parsed(rows: list[dict]) -> list[tuple]:
    out = parse_table(pa.Table.from_pylist(rows, schema=BRONZE_SCHEMA), KNOWN)
    assert out.schema == parse.CHANGES_ARROW
    return [(r["commit_lsn"], r["id"], r["error"]) for r in out.to_pylist()]


# Text that is not exactly one JSON object, each next to good rows: a whole-chunk read
# would see one object too many or too few (or crash, on a leading `null`), shifting the rows
# after it.
NOT_ONE_OBJECT = [
    "",
    "null",
    " null",
    "{}{}",
    insert(900) + insert(901),
    insert(902) + "null",
    insert(904)[:-1],
    "[" + insert(905) + "]",
    # An object's text with another first character: never read as if it were `{`.
    "x" + insert(906)[1:],
    "[" + insert(907)[1:],
]


@pytest.mark.parametrize("bad", NOT_ONE_OBJECT)
def test_a_row_that_is_not_one_object_fails_alone(bad):
    rows = [bronze_row(10, 0, 3, insert(1)), bronze_row(10, 1, 3, bad, "I"),
            bronze_row(10, 2, 3, insert(2))]
    assert parsed(rows) == [(10, nid(1), None), (10, None, "malformed JSON"),
                            (10, nid(2), None)]


def test_a_row_whose_object_names_another_rows_place_keeps_its_own():
    """The chunk read wraps each row's object with its index (``_r``); the row's own ``_r``
    member cannot move it."""
    claims = '{"_r":2,' + insert(903)[1:]
    rows = [bronze_row(10, 0, 3, insert(1)), bronze_row(10, 1, 3, claims, "I"),
            bronze_row(10, 2, 3, insert(2))]
    assert parsed(rows) == [(10, nid(1), None), (10, nid(903), None), (10, nid(2), None)]


def test_a_row_with_blanks_around_its_object_or_inside_it_is_still_read():
    spaced = json.dumps(json.loads(insert(7)), indent=1)        # newlines and blanks inside
    numbered = w2j("I", columns=KEYS)[:-2] + ',{"name":"n","type":"numeric","value": 1.50}]}'
    rows = [bronze_row(10, 0, 4, insert(1)), bronze_row(10, 1, 4, "  " + spaced + "\n", "I"),
            bronze_row(10, 2, 4, numbered), bronze_row(10, 3, 4, insert(2))]
    out = parse_table(pa.Table.from_pylist(rows, schema=BRONZE_SCHEMA), KNOWN).to_pylist()
    assert [(r["id"], r["error"]) for r in out] == [
        (nid(1), None), (nid(7), None), (nid(1), None), (nid(2), None)]
    assert dict(out[2]["columns"])["n"] == "1.50"


def test_chunks_parsed_in_parallel_keep_every_row_in_place(monkeypatch):
    monkeypatch.setattr(parse, "CHUNK_ROWS", 7)
    bad = {5, 20, 21, 40}
    rows = [bronze_row(100 + i, 0, 1, "not json" if i in bad else insert(i), "I")
            for i in range(50)]
    assert parsed(rows) == [(100 + i, None if i in bad else nid(i),
                             "malformed JSON" if i in bad else None) for i in range(50)]
    table = pa.Table.from_pylist(rows, schema=BRONZE_SCHEMA)
    failed = quarantine_table(table, parse_table(table, KNOWN))
    assert failed.schema == parse.QUARANTINE_ARROW
    assert [(r["commit_lsn"], r["data"]) for r in failed.to_pylist()] == [
        (100 + i, "not json") for i in sorted(bad)]


def test_an_empty_batch_parses_to_no_rows():
    assert parse_table(BRONZE_SCHEMA.empty_table(), KNOWN).num_rows == 0
