"""wal2json 2.6 and later print numbers as text on request (``numeric-data-types-as-string``),
NaN and ±Infinity included; 2.5 prints those as ``null``. lakecdc asks the slot which it
has and uses the option where it can, so the values reach silver and the mirrors; only a
decimal's NaN stays a known loss (``silver.mirror_type_map.loses_specials``).

The suite's own server has Debian's 2.5. These tests start a second one that loads a
2.6 build (``make test`` builds it: infra/build-wal2json-2.6.sh) ahead of it, through
``dynamic_library_path``; 2.5's side of each rule is tested on the suite's server
(test_mirrors.py, test_tables_add.py, test_backfill_snapshot.py).
"""

from __future__ import annotations

import math
import os
import struct
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

import pytest

from bronze.backfill_source import _reader, read_chunk
from bronze.slot import prints_numbers_as_text
from core.config import Config
from core.layout import mirror_path
from infra.localpg import LocalPostgres
from tests.conftest import fresh_database
from tests.tests_support import cli_env, running_shipper
from tests.truth import Witness

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BUILD = Path(os.environ.get("LAKECDC_TEST_WAL2JSON_26") or Path(sys.prefix) / "wal2json-2.6")


@pytest.fixture(scope="module")
def pg26():
    assert (BUILD / "wal2json.so").exists(), (
        f"no wal2json 2.6 build in {BUILD}: `make test` builds it "
        "(bash infra/build-wal2json-2.6.sh DIR, or set LAKECDC_TEST_WAL2JSON_26 to DIR)")
    cluster = LocalPostgres(Path(tempfile.mkdtemp(prefix="lakecdc-testpg26-")),
                            extra_settings={"dynamic_library_path": f"'{BUILD}:$libdir'"})
    cluster.start()
    yield cluster
    cluster.destroy()


@pytest.fixture
def db26(pg26):
    yield from fresh_database(pg26)


def _slot_answer(db, slot: str) -> bool | None:
    with db.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", [slot])
        try:
            return prints_numbers_as_text(conn, slot)
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def test_the_slot_says_which_wal2json_it_has_and_the_backfill_prints_numbers_as_2_6_does(
        db26, source_db):
    """2.6 takes the option and 2.5 refuses it. With it, the snapshot backfill's rows are
    byte for byte the columns wal2json 2.6 writes for an INSERT of the same rows: numbers
    as JSON strings, NaN and ±Infinity as their text."""
    assert _slot_answer(db26, db26.slot + "_probe") is True
    assert _slot_answer(source_db, source_db.slot + "_probe") is False

    with db26.connect() as conn:
        conn.execute("CREATE TABLE odd (id int8 PRIMARY KEY, f4 real, f8 float8, n numeric, "
                     "d numeric(10,2), s2 smallint, o oid, b bool, v text)")
        w = Witness(db26.dsn, db26.slot + "_odd", tables="public.odd", numbers_as_text=True)
        try:
            conn.execute("""INSERT INTO odd VALUES
              (1, 'NaN', '-Infinity', 'NaN', 'NaN', -3, 12, true, 'a'),
              (2, 1.5e30, 1e-300, 12345678901234567890.123456789012345, -0.01, NULL, NULL,
               NULL, NULL),
              (3, 'Infinity', 0.1, '-Infinity', 99999999.99, 32767, 0, false, '')""")
            inserts = [d for tx in w.transactions().values() for d in tx]
        finally:
            w.drop()
    assert '"value":"NaN"' in inserts[0], inserts[0]        # 2.6's own text, not null
    with _reader(db26.dsn) as reader:
        rows = read_chunk(reader, "public.odd", None, 10, numbers_as_text=True).data
    assert len(rows) == len(inserts) == 3
    for wal2json, ours in zip(inserts, rows, strict=True):
        assert ours[ours.index('"columns":'):] == wal2json[wal2json.index('"columns":'):]


def _float(value, real: bool = False):
    """A float as a comparable value: NaN as the text ``nan``; a real as its float4."""
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    return struct.unpack("f", struct.pack("f", value))[0] if real else value


def _source(db, table: str) -> dict:
    """``table``'s rows as its mirror should hold them, read from the source: floats as
    they are, an unconstrained numeric as its text (a string in the mirror), a
    ``numeric(p,s)`` as a decimal, its NaN as NULL (the decimal's known loss)."""
    with db.connect() as conn:
        rows = conn.execute(f"SELECT id, f, r, n::text, d::text FROM {table}").fetchall()
    return {i: (_float(f), _float(r, real=True), n,
                None if d in (None, "NaN") else Decimal(d)) for i, f, r, n, d in rows}


def _mirror(config, table: str) -> dict:
    from deltalake import DeltaTable

    rows = DeltaTable(mirror_path(config.lakehouse, table)).to_pyarrow_table(
        columns=["id", "f", "r", "n", "d"]).to_pylist()
    return {r["id"]: (_float(r["f"]), _float(r["r"]), r["n"], r["d"]) for r in rows}


READINGS = ("CREATE TABLE {t} (id integer PRIMARY KEY, f double precision, r real, "
            "n numeric, d numeric(10,2), note text)")


@pytest.mark.long
def test_nan_and_infinity_reach_silver_and_the_mirrors_and_verify_counts_only_a_decimals(
        db26, tmp_path, cli_here):
    """On the 2.6 server: ``setup`` loads a table holding NaN and ±Infinity in every float
    and numeric column, ``tables add`` loads another while a shipper runs, and changes write
    more of them. Each mirror then equals its source read by psycopg: the floats' NaN and
    ±Infinity kept, an unconstrained numeric's as text, and only a ``numeric(10,2)``'s NaN
    NULL. ``setup`` and ``tables add`` name just that column; silver holds the values'
    text; ``verify`` is exact but for the rows holding a decimal's NaN, counted as a known
    loss. (With the option not used, the floats' values would be NULL: the comparisons
    fail.)"""
    from deltalake import DeltaTable

    from pipelines.setup import tables

    config = Config.load(env={}, source_dsn=db26.dsn, lakehouse=str(tmp_path / "lakehouse"),
                         slot=db26.slot, poll_interval_s=0.05, mirrors=None,
                         mirror_interval_s=5.0,
                         tables=("public.notifications", "public.notification_history",
                                 "public.readings"))
    env = cli_env(config)
    env["LAKECDC_TABLES"] = ",".join(config.tables)
    with db26.connect() as conn:
        conn.execute(READINGS.format(t="readings"))
        conn.execute(READINGS.format(t="more"))
        for table in ("readings", "more"):
            conn.execute(f"""INSERT INTO {table} VALUES
              (1, 'NaN', 'Infinity', 'NaN', 'NaN', 'a'), (2, 1.5, -2.25, '-Infinity', 3.25, 'b'),
              (3, '-Infinity', 'NaN', 12.5, NULL, 'c'), (4, NULL, NULL, NULL, 1.00, 'd')""")
    set_up = cli_here(["setup"], env)
    assert set_up.returncode == 0, set_up.stderr[-3000:]
    assert "\npublic.readings: a NaN in d reaches its mirror as NULL" in set_up.stdout, \
        set_up.stdout
    assert "NaN and ±Infinity in" not in set_up.stdout, set_up.stdout

    with running_shipper(config):
        said = tables.add_table(config, "public.more", chunk_rows=3)
    assert "its 4 current rows loaded" in said and \
        "\npublic.more: a NaN in d reaches its mirror as NULL" in said, said

    with db26.connect() as conn:
        for table in ("readings", "more"):
            conn.execute(f"UPDATE {table} SET f = 'Infinity', r = '-Infinity', n = 'NaN', "
                         f"d = 'NaN' WHERE id = 2")
            conn.execute(f"UPDATE {table} SET f = 2.5, n = 7 WHERE id = 1")
            conn.execute(f"INSERT INTO {table} VALUES (5, '-Infinity', 'NaN', 'Infinity', "
                         f"-1.5, 'e'), (6, 'NaN', 0.5, 'NaN', 'NaN', 'f')")
            conn.execute(f"DELETE FROM {table} WHERE id = 4")
    drained = cli_here(["run", "--once"], env)
    assert drained.returncode == 0, drained.stderr[-3000:]

    for table in ("public.readings", "public.more"):
        expected = _source(db26, table)
        assert _mirror(config, table) == expected, table
        assert sum(1 for row in expected.values() if row[0] == "nan") == 1      # kept
    silver = DeltaTable(f"{config.lakehouse}/silver/changes").to_pyarrow_table(
        columns=["table_name", "op", "columns"]).to_pylist()
    updated = [dict(r["columns"]) for r in silver if r["table_name"] == "readings"
               and r["op"] == "U" and dict(r["columns"])["id"] == "2"]
    assert updated and (updated[0]["f"], updated[0]["r"], updated[0]["n"], updated[0]["d"]) \
        == ("Infinity", "-Infinity", "NaN", "NaN"), updated

    verified = cli_here(["verify"], env)
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    with db26.connect() as conn:
        for table in ("readings", "more"):
            lost = conn.execute(f"SELECT count(*) FROM {table} WHERE d = 'NaN'").fetchone()[0]
            line = next(ln for ln in verified.stdout.splitlines()
                        if ln.startswith(f"mirror public.{table}:"))
            assert line.startswith(f"mirror public.{table}: equal to the source, 5 rows") \
                and f"known loss: {lost} rows of the source held NaN" in line, line
