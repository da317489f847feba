"""Schema drift and TOAST on the captured tables, mid-stream: the pipeline carries on,
silver keeps what the source now has (``columns`` is a name → text map, so a new column
just appears and a dropped one stops appearing), and the counts stay exact (I1-I5,
``tests/invariants.py``).

- ``ADD COLUMN body text`` filled with ~100 kB of incompressible text (stored out of line,
  TOASTed), then UPDATEs that leave it alone: wal2json omits an unchanged TOASTed column
  from UPDATE rows, which must break nothing;
- ``ALTER COLUMN ... TYPE`` of non-dim columns (``billable_units`` integer → bigint,
  ``rate_multiplier`` numeric → text), each a table rewrite, between changes that land in
  one bronze batch;
- ``DROP COLUMN`` of a nullable column, likewise.

Every DDL is applied to both tables, as a real migration would: the archival move copies
rows with ``INSERT INTO notification_history SELECT * FROM notifications``.
"""

from __future__ import annotations

import os
import random

import psycopg
import pytest
from core.layout import GOLD, SILVER
from deltalake import DeltaTable

from tests.invariants import check_invariants
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.truth import Witness
from tests.integration.workload import archive, hard_delete, insert, transition

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SVC = "33333333-3333-4333-8333-333333333333"
TPL = "44444444-4444-4444-8444-444444444444"


@pytest.fixture
def witnessed(source_db, config, spark):
    setup(config)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    yield Pipeline(config, spark_factory=lambda: spark), witness
    witness.drop()


def both_tables(conn: psycopg.Connection, ddl: str) -> None:
    """One migration step on both captured tables, in one transaction."""
    with conn.transaction():
        for table in ("notifications", "notification_history"):
            conn.execute(ddl.format(table=table))


def silver_rows(config) -> list[dict]:
    rows = DeltaTable(config.table_path(SILVER)).to_pyarrow_table().to_pylist()
    for row in rows:
        row["columns"] = dict(row["columns"]) if row["columns"] is not None else None
    return sorted(rows, key=lambda r: (r["commit_lsn"], r["seq"]))


def test_toasted_column_added_mid_stream_and_left_out_of_updates(source_db, config,
                                                                  witnessed):
    pipeline, witness = witnessed
    rng = random.Random(91)
    with source_db.connect() as conn:
        insert(conn, rng, 20)
    pipeline.run_once()

    bodies = {}
    with source_db.connect() as conn:
        insert(conn, rng, 5)                                     # before the column exists
        both_tables(conn, "ALTER TABLE {table} ADD COLUMN body text")
        for _ in range(6):
            body = os.urandom(50_000).hex()                      # 100 kB, barely compressible
            row_id = conn.execute(
                "INSERT INTO notifications (id, service_id, template_id, notification_type, "
                "notification_status, key_type, created_at, body) VALUES (gen_random_uuid(), "
                "%s, %s, 'letter', 'created', 'normal', now(), %s) RETURNING id::text",
                [SVC, TPL, body]).fetchone()[0]
            bodies[row_id] = body
        toasted = conn.execute("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE "
                               "relname = 'notifications'").fetchone()[0]
        assert toasted >= 6 * 100_000, "the bodies must be stored out of line (TOASTed)"
        # Status changes and a non-key update that leave the TOASTed body unchanged.
        conn.execute("UPDATE notifications SET notification_status = 'sending' "
                     "WHERE body IS NOT NULL")
        conn.execute("UPDATE notifications SET billable_units = 3 WHERE body IS NOT NULL")
        conn.execute("UPDATE notifications SET notification_status = 'delivered' WHERE id = "
                     "ANY(%s::uuid[])", [list(bodies)[:3]])
        archive(conn, 0.5)                   # copies some bodies into history, whole
        hard_delete(conn, 0.1)
        transition(conn, 0.3, "sending")
    pipeline.run_once()
    verdict = check_invariants(config, witness)
    assert verdict.quarantined == 0

    ours = [r for r in silver_rows(config) if r["id"] in bodies]
    inserts = [r for r in ours if r["op"] == "I" and r["table_name"] == "notifications"]
    assert {r["id"]: r["columns"]["body"] for r in inserts} == bodies
    updates = [r for r in ours if r["op"] == "U"]
    assert len(updates) >= 6 * 2 + 3
    assert not [r for r in updates if "body" in r["columns"]], \
        "wal2json sent an unchanged TOASTed column in an UPDATE"
    assert all(r["columns"]["notification_status"] in ("sending", "delivered") for r in updates)
    moved = [r for r in ours if r["op"] == "I" and r["table_name"] == "notification_history"]
    assert all(r["columns"]["body"] == bodies[r["id"]] for r in moved)
    earlier = [r for r in silver_rows(config)
               if r["op"] == "I" and r["service_id"] != SVC and "body" not in r["columns"]]
    assert len(earlier) >= 25                # rows inserted before the column existed


def test_type_change_and_drop_of_non_dim_columns_mid_stream(source_db, config, witnessed):
    pipeline, witness = witnessed
    rng = random.Random(92)
    insert_full = ("INSERT INTO notifications (id, service_id, template_id, notification_type,"
                   " notification_status, key_type, created_at, \"to\", billable_units, "
                   "rate_multiplier) VALUES (gen_random_uuid(), %s, %s, 'sms', 'created', "
                   "'normal', now(), %s, %s, %s)")
    with source_db.connect() as conn:
        conn.execute(insert_full, [SVC, TPL, "+447700900001", 1, "1.50"])
        insert(conn, rng, 10)
    pipeline.run_once()

    with source_db.connect() as conn:            # all of this reaches bronze in one batch
        conn.execute(insert_full, [SVC, TPL, "+447700900002", 2, "2.25"])
        transition(conn, 0.5, "sending")
        both_tables(conn, "ALTER TABLE {table} ALTER COLUMN billable_units TYPE bigint")
        conn.execute(insert_full, [SVC, TPL, "+447700900003", 3_000_000_000, "3.125"])
        both_tables(conn, "ALTER TABLE {table} ALTER COLUMN rate_multiplier TYPE text "
                          "USING rate_multiplier::text")
        conn.execute(insert_full, [SVC, TPL, "+447700900004", 4, "four and a quarter"])
        archive(conn, 0.3)
        both_tables(conn, 'ALTER TABLE {table} DROP COLUMN "to"')
        conn.execute("INSERT INTO notifications (id, service_id, template_id, "
                     "notification_type, notification_status, key_type, created_at, "
                     "billable_units) VALUES (gen_random_uuid(), %s, %s, 'email', 'created', "
                     "'normal', now(), 5)", [SVC, TPL])
        transition(conn, 0.5, "delivered")
        archive(conn, 0.3)
        hard_delete(conn, 0.1)
    pipeline.run_once()
    verdict = check_invariants(config, witness)
    assert verdict.quarantined == 0

    ours = [r for r in silver_rows(config) if r["op"] == "I" and r["service_id"] == SVC
            and r["table_name"] == "notifications"]
    seen = [(r["columns"].get("to"), r["columns"]["billable_units"],
             r["columns"].get("rate_multiplier")) for r in ours]
    assert seen == [("+447700900001", "1", "1.50"), ("+447700900002", "2", "2.25"),
                    ("+447700900003", "3000000000", "3.125"),
                    ("+447700900004", "4", "four and a quarter"), (None, "5", None)]
    assert "to" not in ours[-1]["columns"], "a dropped column must not appear any more"


def test_replica_identity_dropped_and_restored_while_shipping_stops_gold_loudly(
        source_db, config, witnessed):
    """F21 mid-stream: the shipper checks the replica identity when it starts, so a
    migration that sets ``REPLICA IDENTITY DEFAULT`` and back between two of its runs goes
    unseen by it. The UPDATEs and DELETEs in between reach bronze with the primary key as
    their only old value; silver marks them failed (quarantined), and gold stops with one
    sentence before applying anything of the batch - the changes are never counted as
    nothing (docs/gold.md)."""
    from gold.deltas import GoldStopped
    from tests.invariants import check_i1, check_i2

    pipeline, witness = witnessed
    rng = random.Random(93)
    with source_db.connect() as conn:
        insert(conn, rng, 20)
    pipeline.run_once()
    gold = DeltaTable(config.table_path(GOLD))
    before = gold.version()
    with source_db.connect() as conn:
        conn.execute("ALTER TABLE notifications REPLICA IDENTITY DEFAULT")
        transition(conn, 0.5, "sending")
        hard_delete(conn, 0.2)
        conn.execute("ALTER TABLE notifications REPLICA IDENTITY USING INDEX "
                     "notifications_lakecdc_identity")
    with pytest.raises(GoldStopped, match=r"U identity lacks service_id.*replica identity"):
        pipeline.run_once()
    check_i1(config.bronze_path, witness, config.tables)
    bronze = DeltaTable(config.bronze_path).to_pyarrow_table(
        columns=["commit_lsn", "seq", "data"]).to_pylist()
    clean, quarantined = check_i2(config.lakehouse, bronze)
    assert quarantined >= 1
    assert DeltaTable(config.table_path(GOLD)).version() == before
