"""Captured tables beside the two counted ones: any table whose
replica identity names the changed row - a primary key (composite too), ``USING INDEX`` or
``FULL`` - is captured without being changed by ``setup``, lands in silver without a
quarantined row, and leaves gold exact; a table that cannot name its rows is refused with
one sentence before anything changes, by ``setup`` and by the shipper."""

from __future__ import annotations

import json
import random
import uuid

import pytest

from core.captured import COUNTED
from tests.invariants import check_invariants
from tests.integration.workload import mixed
from tests.tests_support import cli_env, error_line, run_cli
from tests.truth import Witness

pytestmark = [pytest.mark.integration]

OTHERS = ("public.services", "public.service_users", "public.audit_events")
CAPTURED = (*COUNTED.names, *OTHERS)

OTHER_TABLES_SQL = """
CREATE TABLE services (id uuid PRIMARY KEY, name text NOT NULL, active boolean,
                       message_limit bigint, created_at timestamptz DEFAULT now());
CREATE TABLE service_users (service_id uuid, user_id integer, role text,
                            PRIMARY KEY (service_id, user_id));
CREATE TABLE audit_events (at timestamptz DEFAULT now(), what text);
ALTER TABLE audit_events REPLICA IDENTITY FULL;
"""


def env_for(config, tables=CAPTURED) -> dict[str, str]:
    return {**cli_env(config), "LAKECDC_TABLES": ",".join(tables), "LAKECDC_MIRRORS": "all"}


def identities(conn, tables) -> dict[str, str]:
    return dict(conn.execute(
        "SELECT n.nspname || '.' || c.relname, c.relreplident::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname || '.' || c.relname = ANY(%s)", [list(tables)]).fetchall())


def lakecdc_indexes(conn) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT tablename FROM pg_indexes WHERE indexname LIKE '%%\\_lakecdc\\_identity' "
        "ORDER BY 1")]


def other_traffic(conn, rng: random.Random, rounds: int) -> None:
    """Inserts, updates (a key change of a composite key too) and deletes on the three
    other tables, in transactions that also touch the counted ones now and then."""
    services = [r[0] for r in conn.execute("SELECT id FROM services")]
    for i in range(rounds):
        with conn.transaction():
            sid = uuid.UUID(int=rng.getrandbits(128))
            conn.execute("INSERT INTO services (id, name, active, message_limit) "
                         "VALUES (%s, %s, true, %s)", [sid, f"service {i}", rng.randint(1, 10**12)])
            services.append(sid)
            conn.execute("INSERT INTO service_users VALUES (%s, %s, 'admin'), (%s, %s, 'viewer')",
                         [sid, i, sid, i + 100_000])
            conn.execute("INSERT INTO audit_events (what) VALUES (%s)", [f"created {sid}"])
            if i % 3 == 0:
                conn.execute("UPDATE services SET name = name || ' (renamed)', active = %s "
                             "WHERE id = %s", [rng.random() < 0.5, rng.choice(services)])
            if i % 4 == 1:
                conn.execute("UPDATE service_users SET user_id = user_id + 1000000 "
                             "WHERE service_id = %s AND role = 'viewer'", [sid])
            if i % 5 == 2:
                gone = services.pop(rng.randrange(len(services)))
                conn.execute("DELETE FROM service_users WHERE service_id = %s", [gone])
                conn.execute("DELETE FROM services WHERE id = %s", [gone])
                conn.execute("DELETE FROM audit_events WHERE what = %s", [f"created {gone}"])


@pytest.mark.spark
@pytest.mark.long
def test_other_captured_tables_land_in_silver_unchanged_and_gold_stays_exact(source_db,
                                                                              config,
                                                                              cli_here):
    with source_db.connect() as conn:
        conn.execute(OTHER_TABLES_SQL)
        other_traffic(conn, random.Random(71), 10)        # rows before setup
        before = identities(conn, OTHERS)
    env = env_for(config)
    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    with source_db.connect() as conn:
        # Only the counted tables get the dims identity index; the others are not touched.
        assert lakecdc_indexes(conn) == ["notification_history", "notifications"]
        assert identities(conn, OTHERS) == before == {
            "public.services": "d", "public.service_users": "d", "public.audit_events": "f"}
    witness = Witness(source_db.dsn, source_db.slot + "_w", ",".join(CAPTURED))
    try:
        with source_db.connect() as conn:
            other_traffic(conn, random.Random(72), 40)
        purged = mixed(source_db.dsn, seed=73)
        with source_db.connect() as conn:
            other_traffic(conn, random.Random(74), 20)
        done = cli_here(["run", "--once"], env)
        assert done.returncode == 0, done.stderr[-3000:]
        verdict = check_invariants(config.with_(tables=CAPTURED), witness, purged)
        assert verdict.quarantined == 0

        # Silver holds every witnessed change of the other tables, parsed: op, table and
        # each column value as Postgres printed it (the witness's JSON, not lakecdc's).
        from deltalake import DeltaTable

        silver = DeltaTable(f"{config.lakehouse}/silver/changes").to_pyarrow_table(
            columns=["commit_lsn", "seq", "op", "schema_name", "table_name", "columns",
                     "error"]).to_pylist()
        by_key = {(r["commit_lsn"], r["seq"]): r for r in silver}
        seen = {t: 0 for t in OTHERS}
        for commit_lsn, changes in witness.transactions().items():
            for seq, text in enumerate(changes):
                change = json.loads(text)
                table = f"{change.get('schema')}.{change.get('table')}"
                if table not in OTHERS:
                    continue
                row = by_key[(commit_lsn, seq)]
                assert (row["op"], f"{row['schema_name']}.{row['table_name']}",
                        row["error"]) == (change["action"], table, None)
                expected = {c["name"]: None if c["value"] is None else
                            (json.dumps(c["value"]) if isinstance(c["value"], bool)
                             else str(c["value"]))
                            for c in change.get("columns", [])}
                assert dict(row["columns"] or []) == expected, (table, change)
                seen[table] += 1
        assert all(n > 20 for n in seen.values()), seen

        # The mirrors of the two tables with a primary key equal the source row for row:
        # their initial rows (written before setup) and every change since, a composite
        # key's key changes included; FULL without a primary key gets none.
        from core.layout import mirror_path

        with source_db.connect() as conn:
            for table, key in (("public.services", ("id",)),
                               ("public.service_users", ("service_id", "user_id"))):
                cursor = conn.execute(f"SELECT * FROM {table}")      # test's own names
                names = [c.name for c in cursor.description]
                expected = {tuple(str(r[names.index(k)]) if k != "user_id"
                                  else r[names.index(k)] for k in key):
                            {n: str(v) if isinstance(v, uuid.UUID) else v
                             for n, v in zip(names, r)} for r in cursor}
                rows = DeltaTable(mirror_path(config.lakehouse, table)).to_pyarrow_table(
                    columns=names).to_pylist()
                got = {tuple(r[k] for k in key): r for r in rows}
                assert len(expected) > 20 and got == expected, table
        assert not DeltaTable.is_deltatable(mirror_path(config.lakehouse,
                                                        "public.audit_events"))
    finally:
        witness.drop()


def test_a_captured_table_that_cannot_name_its_rows_is_refused_before_anything_changes(
        source_db, config):
    with source_db.connect() as conn:
        conn.execute("CREATE TABLE readings (at timestamptz, value integer)")
        conn.execute("CREATE TABLE counters (id int PRIMARY KEY, n int)")
        conn.execute("ALTER TABLE counters REPLICA IDENTITY NOTHING")
    for table, phrase in (("public.readings", "has no primary key"),
                          ("public.counters", "REPLICA IDENTITY NOTHING")):
        result = run_cli(["setup"], env_for(config, (*COUNTED.names, table)))
        error_line(result, table, phrase, f"ALTER TABLE {table} REPLICA IDENTITY FULL",
                   "nothing was changed")
        with source_db.connect() as conn:
            slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE "
                                 "slot_name = %s", [config.slot]).fetchone()[0]
            assert (slots, lakecdc_indexes(conn)) == (0, [])


def test_the_shipper_refuses_a_captured_table_whose_identity_no_longer_names_its_rows(
        source_db, config):
    with source_db.connect() as conn:
        conn.execute(OTHER_TABLES_SQL)
    env = env_for(config)
    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    with source_db.connect() as conn:
        conn.execute("ALTER TABLE services REPLICA IDENTITY NOTHING")
        conn.execute("INSERT INTO services (id, name) VALUES (gen_random_uuid(), 'x')")
        slot_before = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                   "WHERE slot_name = %s", [config.slot]).fetchone()[0]
    error_line(run_cli(["ship", "--once"], env), "public.services",
               "REPLICA IDENTITY NOTHING", "REPLICA IDENTITY FULL")
    with source_db.connect() as conn:
        assert conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                            "WHERE slot_name = %s", [config.slot]).fetchone()[0] == slot_before
