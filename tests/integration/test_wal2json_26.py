"""wal2json 2.6 and later print numbers as text on request (``numeric-data-types-as-string``),
NaN and ±Infinity included; 2.5 prints those as ``null`` and refuses the option. lakecdc
asks the slot which it has and uses the option only where the server takes it.

No registry this project installs from serves wal2json 2.6 for PostgreSQL 15 (Debian 12
packages 2.5), so the 2.6 side runs on rows written in its documented format
(tests/unit/test_wal2json_26.py). Here, on the suite's live 2.5 server: the shipper finds
that its wal2json lacks the option, records so, and ships with the options 2.5 accepts; and
the snapshot backfill, asked for 2.6's rendering, writes the very columns of those
documented rows, so a loaded row and a changed row agree there too.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from bronze.backfill_source import _reader, read_chunk
from bronze.slot import plugin_options, prints_numbers_as_text
from bronze.table import numbers_as_text
from core.layout import BRONZE, path
from tests.tests_support import cli_env, run_cli

pytestmark = pytest.mark.integration

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "wal2json"
           / "numbers_as_text_2_6.jsonl")
ODD = ("CREATE TABLE odd (id int8 PRIMARY KEY, f4 real, f8 float8, n numeric, "
       "d numeric(10,2), s2 smallint, o oid, b bool, v text)")
ROWS = """INSERT INTO odd VALUES
  (1, 'NaN', '-Infinity', 'NaN', 'NaN', -3, 12, true, 'a'),
  (2, 1.5e30, 1e-300, 12345678901234567890.123456789012345, -0.01, NULL, NULL, NULL, NULL),
  (3, 'Infinity', 0.1, '-Infinity', 99999999.99, 32767, 0, false, '')"""


def _inserts_26() -> list[str]:
    """The documented 2.6 rows of the fixture's three inserts."""
    data = [json.loads(line)[2] for line in FIXTURE.read_text().splitlines()]
    return [d for d in data if json.loads(d)["action"] == "I"]


def _peek(conn: psycopg.Connection, slot: str, numbers_as_text: bool) -> int:
    """The rows of a peek of ``slot`` with the shipper's options."""
    options = plugin_options(("public.odd",), numbers_as_text)
    return conn.execute(sql.SQL(
        "SELECT count(*) FROM pg_logical_slot_peek_changes({}, NULL, NULL, {})").format(
        sql.Literal(slot), sql.SQL(", ").join(map(sql.Literal, options)))).fetchone()[0]


def test_on_2_5_the_option_is_refused_and_the_shippers_options_are_taken(source_db):
    """What ``prints_numbers_as_text`` answers is what the server does: 2.5 decodes with
    the options the shipper then asks for, and refuses 2.6's."""
    slot = source_db.slot + "_probe"
    with source_db.connect() as conn:
        conn.execute(ODD)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", [slot])
        try:
            conn.execute(ROWS)
            assert prints_numbers_as_text(conn, slot) is False
            assert _peek(conn, slot, numbers_as_text=False) == 5        # B, 3 inserts, C
            with pytest.raises(psycopg.Error, match="numeric-data-types-as-string"):
                _peek(conn, slot, numbers_as_text=True)
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def test_the_shipper_records_2_5_and_ships_its_rows_nan_as_null(source_db, config):
    """``setup`` and ``ship --once`` on the 2.5 server: bronze records that numbers are not
    text, and holds wal2json 2.5's rows (NaN and ±Infinity as ``null``, numbers bare)."""
    with source_db.connect() as conn:
        conn.execute(ODD)
    env = cli_env(config)
    env["LAKECDC_TABLES"] = "public.notifications,public.notification_history,public.odd"
    set_up = run_cli(["setup"], env)
    assert set_up.returncode == 0, set_up.stderr[-3000:]
    with source_db.connect() as conn:
        conn.execute(ROWS)
    shipped = run_cli(["ship", "--once"], env)
    assert shipped.returncode == 0, shipped.stderr[-3000:]

    from deltalake import DeltaTable

    from bronze.table import BronzeTable

    bronze = path(config.lakehouse, BRONZE)
    assert numbers_as_text(BronzeTable(bronze), config.slot) is False
    rows = sorted(DeltaTable(bronze).to_pyarrow_table(columns=["seq", "data"]).to_pylist(),
                  key=lambda r: r["seq"])
    columns = [{c["name"]: c["value"] for c in json.loads(r["data"])["columns"]} for r in rows]
    assert [c["id"] for c in columns] == [1, 2, 3]
    assert (columns[0]["f4"], columns[0]["f8"], columns[0]["n"], columns[0]["s2"]) == \
        (None, None, None, -3)


def test_the_backfill_renders_numbers_as_2_6_writes_them(source_db):
    """Asked for 2.6's rendering (``numbers_as_text``), the snapshot backfill's rows of the
    fixture's table are, column for column and byte for byte, 2.6's documented rows."""
    with source_db.connect() as conn:
        conn.execute(ODD)
        conn.execute(ROWS)
    with _reader(source_db.dsn) as reader:
        ours = read_chunk(reader, "public.odd", None, 10, numbers_as_text=True).data
    documented = _inserts_26()
    assert len(ours) == len(documented) == 3
    for theirs, mine in zip(documented, ours, strict=True):
        assert mine[mine.index('"columns":'):] == theirs[theirs.index('"columns":'):]
