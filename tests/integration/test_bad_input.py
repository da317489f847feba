"""Bad input from people: each case ends in one sentence saying what is wrong and what to
do, exit code 2, and nothing written or advanced - no slot, no lakehouse table, no change
to the source's tables or the dashboard, bronze and the slot where they were.

Cases covered elsewhere (docs/reliability.md maps them): a bad or unreachable DSN, a
missing captured table, a nullable identity column, a path under a file
(test_setup_and_refusals.py); a missing S3 bucket (test_s3.py); TRUNCATE
(test_end_to_end.py). Here: wal2json missing and ``wal_level`` not logical (each on its own
cluster, started once per module), no REPLICATION privilege, an unknown table in
``LAKECDC_TABLES``, a read-only lakehouse, ``s3://`` without credentials, and malformed
change rows in bronze.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable
from tests.integration.test_faults import plant, slot_confirmed
from tests.integration.test_faults import lsn_text as lsn

from infra.localpg import LocalPostgres
from tests.invariants import check_i1, check_i2, check_invariants
from core.layout import GOLD, QUARANTINE
from core.config import Config
from pipelines.setup.prepare import setup
from tests.tests_support import cli_env, error_line, one_sentence, run_cli, tmpfs
from tests.truth import Witness, dashboard_counts
from tests.integration.workload import insert, mixed

pytestmark = pytest.mark.integration

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "source_schema.sql"


def what_was_written(dsn: str, config: Config) -> list[str]:
    """Everything ``setup`` or ``ship`` could have left behind, as readable findings."""
    found = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                        [config.slot]).fetchone()[0]:
            found.append(f"slot {config.slot}")
        for table in ("service_stats", "lakecdc_push_progress"):
            if conn.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is not None:
                found.append(f"dashboard table {table}")
        for table, ident in conn.execute(
                "SELECT relname, relreplident FROM pg_class WHERE relname IN "
                "('notifications', 'notification_history') AND relkind = 'r'").fetchall():
            if ident != "d":
                found.append(f"replica identity of {table} set to {ident!r}")
    lakehouse = Path(config.lakehouse)
    if lakehouse.exists():
        found += [f"Delta table {p.parent}" for p in lakehouse.rglob("_delta_log")]
    return found


# --- clusters that are wrong on purpose, one of each per module -----------------------------

def _cluster(prefix: str, **settings: str) -> LocalPostgres:
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)
    (base / "empty-libdir").mkdir()
    settings = {k: v.format(base=base) for k, v in settings.items()}
    return LocalPostgres(base / "pg", extra_settings=settings).start()


@pytest.fixture(scope="module")
def no_wal2json():
    """A cluster whose output plugins are looked up in an empty directory: wal2json is
    installed on the machine but this server cannot load it."""
    pg = _cluster("lakecdc-nowal2json-", dynamic_library_path="'{base}/empty-libdir'")
    yield pg
    pg.destroy()
    shutil.rmtree(pg.base_dir.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def wal_level_replica():
    pg = _cluster("lakecdc-replica-", wal_level="replica")
    yield pg
    pg.destroy()
    shutil.rmtree(pg.base_dir.parent, ignore_errors=True)


def fresh_source(pg: LocalPostgres, tmp_path: Path) -> Config:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(pg.dsn(name), autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text())
    return Config.load(env={}, source_dsn=pg.dsn(name), slot=f"s_{name[2:]}",
                       lakehouse=str(tmp_path / "lakehouse"), mirrors=())


def test_wal2json_missing_is_one_sentence_and_no_slot_or_table_is_made(no_wal2json, tmp_path):
    config = fresh_source(no_wal2json, tmp_path)
    result = run_cli(["setup"], cli_env(config))
    error_line(result, "wal2json output plugin is not installed",
               "apt-get install postgresql-15-wal2json")
    written = what_was_written(config.source_dsn, config)
    assert not [w for w in written if w.startswith(("slot", "Delta table"))], written


def test_wal2json_missing_leaves_the_source_untouched(no_wal2json, tmp_path):
    config = fresh_source(no_wal2json, tmp_path)
    assert run_cli(["setup"], cli_env(config)).returncode == 2
    assert what_was_written(config.source_dsn, config) == []


def test_wal_level_not_logical_is_one_sentence_and_nothing_is_written(wal_level_replica,
                                                                     tmp_path):
    config = fresh_source(wal_level_replica, tmp_path)
    env = cli_env(config)
    error_line(run_cli(["setup"], env), "wal_level = replica",
               "ALTER SYSTEM SET wal_level = logical")
    assert what_was_written(config.source_dsn, config) == []
    error_line(run_cli(["ship", "--once"], env), "lakecdc setup")
    assert what_was_written(config.source_dsn, config) == []


# --- the shared test cluster ---------------------------------------------------------------------

@pytest.fixture
def role_without_replication(source_db):
    role = f"norepl_{source_db.name}"
    source_db.execute(f'CREATE ROLE "{role}" LOGIN')
    yield source_db.cluster.dsn(source_db.name, user=role)
    source_db.execute(f'DROP ROLE "{role}"')


def test_no_replication_privilege_setup_writes_nothing(source_db, config,
                                                      role_without_replication):
    env = {**cli_env(config), "LAKECDC_SOURCE_DSN": role_without_replication}
    error_line(run_cli(["setup"], env), "cannot use replication slots", "REPLICATION")
    assert what_was_written(source_db.dsn, config) == []


def test_no_replication_privilege_ship_is_one_sentence_and_advances_nothing(
        source_db, config, role_without_replication):
    setup(config)                                   # by the owner: a working pipeline
    mixed(source_db.dsn, seed=5)
    version, confirmed = DeltaTable(config.bronze_path).version(), slot_confirmed(config)
    result = run_cli(["ship", "--once"],
                     {**cli_env(config), "LAKECDC_SOURCE_DSN": role_without_replication})
    assert DeltaTable(config.bronze_path).version() == version
    assert slot_confirmed(config) == confirmed
    error_line(result, "REPLICATION")


def test_unknown_table_in_configuration_is_refused_before_and_after_setup(source_db, config):
    unknown = {**cli_env(config),
               "LAKECDC_TABLES": "public.notifications,public.notification_history,public.nope"}
    error_line(run_cli(["setup"], unknown), "captured table public.nope does not exist",
               "LAKECDC_TABLES")
    assert what_was_written(source_db.dsn, config) == []

    setup(config)
    with source_db.connect() as conn:
        insert(conn, random.Random(6), 5)
    version, confirmed = DeltaTable(config.bronze_path).version(), slot_confirmed(config)
    error_line(run_cli(["ship", "--once"], unknown), "public.nope does not exist")
    assert DeltaTable(config.bronze_path).version() == version
    assert slot_confirmed(config) == confirmed

    # A table that exists but is not in the set setup stored: `tables add` captures it (its
    # rows read too); shipping its changes from now on would leave out the rows it holds.
    source_db.execute("CREATE TABLE extra (id int PRIMARY KEY)")
    left_out = {**unknown, "LAKECDC_TABLES": "public.notifications,public.notification_history,"
                "public.extra"}
    error_line(run_cli(["ship", "--once"], left_out), "LAKECDC_TABLES names public.extra",
               "lakecdc tables add public.extra")
    assert DeltaTable(config.bronze_path).version() == version
    assert slot_confirmed(config) == confirmed


@pytest.fixture
def read_only_disk(tmp_path):
    """A tmpfs mounted read-only: unwritable even for root, who ignores permissions."""
    with tmpfs(tmp_path / "ro", "16m", read_only=True) as mount:
        def remount(mode: str) -> None:
            subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)
        yield mount, remount


def test_read_only_lakehouse_is_refused_by_setup_and_stops_ship_before_any_advance(
        source_db, config, read_only_disk):
    mount, remount = read_only_disk
    config = config.with_(lakehouse=str(mount / "lakehouse"))
    env = cli_env(config)
    error_line(run_cli(["setup"], env), "is not writable", "Read-only file system")
    assert what_was_written(source_db.dsn, config) == []

    remount("rw")
    setup(config)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        mixed(source_db.dsn, seed=7)
        remount("ro")
        version, confirmed = DeltaTable(config.bronze_path).version(), slot_confirmed(config)
        result = run_cli(["ship", "--once"], env)
        error_line(result, "cannot be written", "Read-only file system",
                   "slot was not advanced")
        assert DeltaTable(config.bronze_path).version() == version
        assert slot_confirmed(config) == confirmed
        remount("rw")
        assert run_cli(["ship", "--once"], env).returncode == 0
        check_i1(config.bronze_path, witness, config.tables)
    finally:
        witness.drop()


def test_s3_lakehouse_without_credentials_writes_nothing(source_db, config):
    """No credentials anywhere in the AWS chain: refused before any network call."""
    env = {k: v for k, v in cli_env(config).items() if not k.startswith("AWS_")}
    env.update(LAKECDC_LAKEHOUSE="s3://lakecdc-no-such-bucket/lakehouse",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent/credentials",
               AWS_CONFIG_FILE="/nonexistent/config", AWS_EC2_METADATA_DISABLED="true",
               AWS_REGION="eu-west-2")
    error_line(run_cli(["setup"], env), "no AWS credentials", "AWS_ACCESS_KEY_ID",
               "LAKECDC_WRITER=spark")
    assert what_was_written(source_db.dsn, config.with_(lakehouse="/nonexistent")) == []


@pytest.mark.parametrize("root", ["dbfs:/lakecdc",
                                  "wasbs://lake@account.blob.core.windows.net/lakecdc"])
def test_a_lakehouse_on_a_store_lakecdc_cannot_write_is_refused_by_setup(source_db, config,
                                                                        root):
    """DBFS and Azure's legacy WASB: refused at setup with one sentence, before anything is
    made, not at the first write (ADLS Gen2 and GCS are probed: test_azure.py,
    test_gcs.py)."""
    env = {**cli_env(config), "LAKECDC_LAKEHOUSE": root}
    error_line(run_cli(["setup"], env), root, "cannot write", "Which workspace you have")
    assert what_was_written(source_db.dsn, config.with_(lakehouse="/nonexistent")) == []


# --- malformed change rows: quarantined, gold stops, the operator accepts them ---------------

@pytest.mark.spark
def test_malformed_change_rows_stop_gold_with_one_sentence_until_accepted(
        source_db, config, spark, lakecdc):
    """Rows silver cannot parse (broken JSON, a table it does not know) are quarantined with
    their raw text; gold stops at the first with one sentence naming its commit LSN and
    applies nothing of the batch; the dashboard is untouched. ``--accept-errors-upto`` takes
    an LSN; up to the first row only, gold stops at the second; up to the second, it goes
    on and everything ends exact."""
    setup(config)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        purged = mixed(source_db.dsn, seed=81)
        assert lakecdc(config, "run", "--once")[0] == 0
        planted = plant(config, ['{"action":"I","schema":"public",,}',
                                 '{"action":"I","schema":"public","table":"other","columns":'
                                 '[{"name":"id","type":"int","value":"1"}]}'])
        first, second = sorted(planted)
        purged += mixed(source_db.dsn, seed=82)
        gold_version = DeltaTable(config.table_path(GOLD)).version()
        dashboard = dashboard_counts(source_db.dsn)

        code, _, err = lakecdc(config, "run", "--once")
        line = one_sentence(code, err, "silver could not parse", "malformed JSON",
                            "silver/quarantine")
        assert re.search(r"commit LSN ([0-9A-F]+/[0-9A-F]+)", line).group(1) == lsn(first)
        assert DeltaTable(config.table_path(GOLD)).version() == gold_version
        assert dashboard_counts(source_db.dsn) == dashboard
        quarantine = DeltaTable(config.table_path(QUARANTINE)).to_pyarrow_table(
            ).to_pylist()
        assert {(q["commit_lsn"], q["data"]) for q in quarantine} == \
            {(k, v[0]) for k, v in planted.items()}
        bronze = DeltaTable(config.bronze_path).to_pyarrow_table(
            columns=["commit_lsn", "seq", "data"]).to_pylist()
        check_i2(config.lakehouse, bronze)

        one_sentence(*lakecdc(config, "stream", "--once", "--accept-errors-upto",
                              "not-an-lsn")[::2], "--accept-errors-upto", "0/4A3F2C0")
        code, _, err = lakecdc(config, "stream", "--once", "--accept-errors-upto", lsn(first))
        line = one_sentence(code, err, "unknown table public.other")
        assert f"commit LSN {lsn(second)}" in line
        assert dashboard_counts(source_db.dsn) == dashboard
        code, _, err = lakecdc(config, "stream", "--once", "--accept-errors-upto", lsn(second))
        assert code == 0, err[-3000:]
        assert lakecdc(config, "push", "--once")[0] == 0
        verdict = check_invariants(config, witness, purged, planted=planted)
        assert verdict.quarantined == 2
    finally:
        witness.drop()

