"""``lakecdc setup`` and every refusal of setup/ship: one sentence, exit 2, nothing changed."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from deltalake import DeltaTable

from pipelines.setup.prepare import setup
from tests.tests_support import cli_env, error_line, run_cli, wait_for
from tests.truth import Witness, check_bronze
from tests.integration.workload import insert

pytestmark = pytest.mark.integration


def identity(source_db, table="notifications"):
    with source_db.connect() as conn:
        return conn.execute("SELECT relreplident FROM pg_class WHERE relname = %s",
                            [table]).fetchone()[0]


def slot_exists(source_db) -> bool:
    with source_db.connect() as conn:
        return conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            [source_db.slot]).fetchone()[0] == 1


def assert_one_sentence_exit_2(result, fragment):
    """``error_line``, and nothing else on stderr: not even a warning."""
    line = error_line(result, fragment)
    assert [ln for ln in result.stderr.splitlines() if ln.strip()] == [line], result.stderr


def test_setup_is_idempotent(source_db, config):
    first = run_cli(["setup"], cli_env(config))
    assert first.returncode == 0, first.stderr
    assert "created slot" in first.stdout and "REPLICA IDENTITY" in first.stdout
    assert identity(source_db) == "i" and identity(source_db, "notification_history") == "i"
    version = DeltaTable(config.bronze_path).version()
    second = run_cli(["setup"], cli_env(config))
    assert second.returncode == 0 and "nothing changed" in second.stdout
    assert DeltaTable(config.bronze_path).version() == version and slot_exists(source_db)


def test_setup_refuses_a_nullable_identity_column_and_offers_full(source_db, config):
    source_db.execute("ALTER TABLE notifications ALTER notification_status DROP NOT NULL")
    result = run_cli(["setup"], cli_env(config))
    assert_one_sentence_exit_2(result, "REPLICA IDENTITY FULL")
    assert not slot_exists(source_db) and not DeltaTable.is_deltatable(config.bronze_path)
    source_db.execute("ALTER TABLE notifications REPLICA IDENTITY FULL")
    assert run_cli(["setup"], cli_env(config)).returncode == 0
    assert identity(source_db) == "f"


def test_setup_refuses_a_missing_captured_table(source_db, config):
    source_db.execute("DROP TABLE notification_history")
    assert_one_sentence_exit_2(run_cli(["setup"], cli_env(config)), "does not exist")
    assert not slot_exists(source_db)


def test_setup_refuses_a_role_without_replication(source_db, config):
    role = f"noreplication_{source_db.name}"
    source_db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        env = {**cli_env(config),
               "LAKECDC_SOURCE_DSN": source_db.cluster.dsn(source_db.name, user=role)}
        assert_one_sentence_exit_2(run_cli(["setup"], env), "REPLICATION")
    finally:
        source_db.execute(f'DROP ROLE "{role}"')


@pytest.mark.parametrize("dsn,fragment", [
    ("postgresql://postgres:s3cret@127.0.0.1:1/nowhere", "cannot connect"),
    ("host=127.0.0.1 port=notaport password=s3cret", "cannot connect"),
    ("not a dsn at all", "not a valid connection string"),
])
def test_bad_dsn_is_one_sentence_without_the_password(config, dsn, fragment):
    env = {**cli_env(config), "LAKECDC_SOURCE_DSN": dsn}
    for command in (["setup"], ["ship", "--once"], ["status"]):
        result = run_cli(command, env)
        assert_one_sentence_exit_2(result, fragment)
        assert "s3cret" not in result.stderr


def test_unwritable_lakehouse_is_refused_before_anything_is_created(source_db, config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = {**cli_env(config), "LAKECDC_LAKEHOUSE": str(blocker / "lakehouse")}
    assert_one_sentence_exit_2(run_cli(["setup"], env), "not writable")
    assert not slot_exists(source_db)


def test_ship_before_setup_says_run_setup(config):
    assert_one_sentence_exit_2(run_cli(["ship", "--once"], cli_env(config)), "lakecdc setup")


def test_missing_slot_stops_with_the_rebaseline_command_which_then_works(source_db, config):
    setup(config)
    source_db.execute("SELECT pg_drop_replication_slot(%s)", [source_db.slot])
    env = cli_env(config)
    assert_one_sentence_exit_2(run_cli(["ship", "--once"], env), "setup --rebaseline")
    assert_one_sentence_exit_2(run_cli(["setup"], env), "--rebaseline")
    rebaselined = run_cli(["setup", "--rebaseline"], env)
    assert rebaselined.returncode == 0, rebaselined.stderr
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        with source_db.connect() as conn:
            insert(conn, random.Random(4), 7)
        assert run_cli(["ship", "--once"], env).returncode == 0
        check_bronze(config.bronze_path, witness.transactions())
    finally:
        witness.drop()


def test_slot_moved_ahead_of_bronze_is_refused(source_db, config):
    setup(config)
    with source_db.connect() as conn:
        insert(conn, random.Random(4), 3)
        conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
                     [source_db.slot])
    assert_one_sentence_exit_2(run_cli(["ship", "--once"], cli_env(config)), "past bronze")
    assert DeltaTable(config.bronze_path).version() == 0


def test_replica_identity_without_the_dims_is_refused_by_the_shipper(source_db, config):
    setup(config)
    source_db.execute("ALTER TABLE notification_history REPLICA IDENTITY DEFAULT")
    with source_db.connect() as conn:
        insert(conn, random.Random(4), 3)
    result = run_cli(["ship", "--once"], cli_env(config))
    assert_one_sentence_exit_2(result, "replica identity of public.notification_history lacks")
    assert DeltaTable(config.bronze_path).version() == 0


def test_a_second_shipper_on_the_same_slot_exits_clearly(source_db, config):
    setup(config)
    env = cli_env(config)
    first = subprocess.Popen([sys.executable, "-m", "pipelines", "ship"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def first_holds_lock():
            with source_db.connect() as conn:
                return conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = "
                                    "'advisory' AND granted AND database = (SELECT oid FROM "
                                    "pg_database WHERE datname = current_database())"
                                    ).fetchone()[0] == 1
        wait_for(first_holds_lock, timeout=60)
        assert_one_sentence_exit_2(run_cli(["ship", "--once"], env), "already running")
    finally:
        first.terminate()
        first.wait(timeout=30)

