"""``LAKECDC_WRITER=spark`` for ``setup`` and the shipper, where only Spark reaches storage.

moto's S3 checks keys (``tests.cloud_servers.guarded_s3``), and only Spark holds them (its
``SPARK_CONF_DIR``): the CLI's processes have no AWS keys, so a single delta-rs or boto3
touch of the lakehouse would fail them. The real CLI runs ``setup`` and ``ship --once`` on
real Postgres + wal2json; the test, which holds the keys too, reads what Spark wrote with
delta-rs - an independent reader of the Delta log Spark wrote:

- bronze equals what a second slot witnessed, exactly once, also after a shipper killed
  between its bronze commit and the slot advance (the progress map in the commit's metadata
  decides what is new on restart);
- gold's baseline equals the source's GROUP BY at setup, and the mirrors' baselines hold
  every row;
- negative control: the same kill with the ``version_check`` guard off leaves duplicates
  (in this process, on local disk).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from bronze.records import BRONZE_SCHEMA
from bronze.spark_table import SparkBronzeTable
from bronze.table import Progress, SourceIdentity
from core.spark_writes import SparkWrites
from core.commits import parse_commit_metadata
from tests.cloud_servers import guarded_s3
from tests.integration.workload import mixed
from tests.tests_support import cli_env, error_line, one_sentence, run_cli
from tests.truth import Witness, check_bronze, source_truth

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def governed(tmp_path, source_db, config):
    """(env for the CLI, delta-rs storage options with the keys, lakehouse URI)."""
    with guarded_s3(tmp_path) as s3:
        bucket = f"lakecdc-{uuid.uuid4().hex[:12]}"
        s3.make_bucket(bucket)
        lakehouse = f"s3://{bucket}/lakehouse"
        env = {k: v for k, v in cli_env(config).items() if not k.startswith("AWS_")}
        env.update(s3.env(), LAKECDC_LAKEHOUSE=lakehouse, LAKECDC_WRITER="spark",
                   SPARK_CONF_DIR=str(s3.spark_conf_dir(tmp_path / "spark-conf")))
        options = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ALLOW_HTTP": "true",
                   "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": s3.key_id,
                   "AWS_SECRET_ACCESS_KEY": s3.secret}
        yield env, options, lakehouse


def _read(uri: str, options: dict) -> list[dict]:
    return DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()


def _setup_with_witness(source_db, env) -> Witness:
    done = run_cli(["setup"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    return Witness(source_db.dsn, source_db.slot + "_w")


def _check_bronze(lakehouse: str, options: dict, witness: Witness) -> None:
    check_bronze(f"{lakehouse}/bronze/wal2json_changes", witness.transactions(), options)


def test_setup_and_a_killed_shipper_through_spark_alone_are_exact(source_db, governed):
    env, options, lakehouse = governed
    env = {**env, "LAKECDC_MIRRORS": "all"}
    mixed(source_db.dsn, seed=3)                    # rows before the slot: the baseline
    truth_at_setup = source_truth(source_db.dsn)
    witness = _setup_with_witness(source_db, env)
    try:
        baseline = _read(f"{lakehouse}/gold/_baseline", options)
        counted = Counter({(r["service_id"], r["template_id"], r["notification_type"],
                            r["notification_status"]): r["count"] for r in baseline})
        assert +counted == +truth_at_setup and sum(counted.values()) > 0
        with source_db.connect() as conn:
            rows = conn.execute("SELECT count(*) FROM notifications").fetchone()[0]
        mirror = _read(f"{lakehouse}/silver/_mirror_baselines/public/notifications", options)
        assert len(mirror) == rows > 0

        mixed(source_db.dsn, seed=4)                # traffic for the shipper
        killed = run_cli(["ship", "--once"], {**env, "LAKECDC_FAULT": "after_bronze_commit:1"})
        assert killed.returncode == 137, killed.stderr[-3000:]
        shipped = run_cli(["ship", "--once"], env)
        assert shipped.returncode == 0, shipped.stderr[-3000:]
        _check_bronze(lakehouse, options, witness)

        # Each bronze commit: one app transaction, the whole progress map in its metadata.
        table = DeltaTable(f"{lakehouse}/bronze/wal2json_changes", storage_options=options)
        metas = [parse_commit_metadata(c.get("userMetadata"), "bronze")
                 for c in table.history()]
        newest = next(m for m in metas if m is not None)
        assert table.transaction_version(source_db.slot + ":end_lsn") == newest["end_lsn"]
        assert table.transaction_version(source_db.slot) is None
        assert newest["apps"][source_db.slot] == newest["commit_lsn"] == max(
            witness.transactions())
        assert json.loads(table.metadata().description.split("source=", 1)[1])["slot"] \
            == source_db.slot
    finally:
        witness.drop()


class Crash(Exception):
    """The shipper's process ending at a fault point; here an exception, so the test's own
    JVM goes on (the slot is not advanced: the advance comes after the point)."""


def test_without_the_version_check_a_killed_spark_shipper_duplicates(source_db, config, spark,
                                                                     monkeypatch):
    """In this process, on local disk: the guard's logic is the same on any storage."""
    from bronze.ship import Shipper
    from core.faults import FaultPoints
    from pipelines.setup.prepare import setup

    config = config.with_(writer="spark")
    setup(config, spark_factory=lambda: spark)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        mixed(source_db.dsn, seed=5)
        unsafe = config.with_(disabled_guards=frozenset({"version_check"}))
        original = FaultPoints.hit

        def hit(self, name: str) -> None:
            if name == "after_bronze_commit":
                monkeypatch.setattr(FaultPoints, "hit", original)
                raise Crash(name)
            original(self, name)
        monkeypatch.setattr(FaultPoints, "hit", hit)
        with pytest.raises(Crash):
            Shipper(unsafe, writes=SparkWrites(spark)).run(once=True)
        Shipper(unsafe, writes=SparkWrites(spark)).run(once=True)
        with pytest.raises(AssertionError, match="duplicate"):
            check_bronze(config.bronze_path, witness.transactions())
    finally:
        witness.drop()


def test_setup_refuses_a_lakehouse_spark_cannot_write(source_db, config, tmp_path):
    """The storage check goes through Spark: without the keys in Spark's settings, setup
    ends with one sentence and exit 2, and leaves no slot."""
    with guarded_s3(tmp_path) as s3:
        bucket = f"lakecdc-{uuid.uuid4().hex[:12]}"
        s3.make_bucket(bucket)
        env = {k: v for k, v in cli_env(config).items() if not k.startswith("AWS_")}
        empty = tmp_path / "no-keys"
        empty.mkdir()
        env.update(s3.env(), LAKECDC_LAKEHOUSE=f"s3://{bucket}/lakehouse",
                   LAKECDC_WRITER="spark", SPARK_CONF_DIR=str(empty))
        done = run_cli(["setup"], env)
    error_line(done, "Spark cannot write the lakehouse")
    with source_db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            [source_db.slot]).fetchone()[0] == 0


def test_the_spark_table_keeps_identity_and_every_app_version_across_commits(spark, tmp_path):
    """Re-baseline and a source change through Spark (``setup --rebaseline``'s calls), read
    back by Spark and by delta-rs; a replayed commit (same ``end_lsn``) is skipped by Spark
    and, with the replay guard off (``skip_replays=False``), is not."""
    path = str(tmp_path / "bronze")
    table = SparkBronzeTable(path, SparkWrites(spark))
    table.create(SourceIdentity("s", "db", "123", 1), 100)
    assert table.progress("s") == Progress(0, 100) and table.rebaselined_at("s") is None
    table.record_progress("s", Progress(0, 200), {"lakecdc.operation": "rebaseline"},
                          {"s:rebaseline": 200})
    table.set_source("456", 2)
    table.record_progress("s", Progress(0, 300), None, {"s:captured": 7})
    assert table.progress("s") == Progress(0, 300)
    assert (table.rebaselined_at("s"), table.app_version("s:captured")) == (200, 7)
    assert table.identity() == SourceIdentity("s", "db", "456", 2)
    rs = DeltaTable(path)
    assert rs.transaction_version("s:end_lsn") == 300
    assert rs.metadata().configuration["delta.appendOnly"] == "true"

    # A replay of rows at a recorded end_lsn: skipped by Spark; without the guard, not.
    row = pa.RecordBatch.from_pylist([{
        "slot": "s", "commit_lsn": 250, "seq": 0, "tx_changes": 1, "xid": 9, "lsn": 250,
        "commit_ts": None, "action": "I", "shipped_at": datetime.now(timezone.utc),
        "data": "{}"}], schema=BRONZE_SCHEMA)
    version = table.version()
    table.append(iter([row]), "s", Progress(250, 300))
    assert table.version() == version and rs.to_pyarrow_table().num_rows == 0
    unguarded = SparkBronzeTable(path, SparkWrites(spark), skip_replays=False)
    unguarded.append(iter([row]), "s", Progress(250, 300))
    assert table.version() == version + 1
    assert DeltaTable(path).to_pyarrow_table().num_rows == 1


@pytest.mark.parametrize("set_up_with,then", [("delta-rs", "spark"), ("spark", "delta-rs")])
def test_a_lakehouse_keeps_the_writer_it_was_set_up_with(source_db, config, lakecdc,
                                                         set_up_with, then):
    """Each path keeps bronze's progress its own way; shipping with the other writer is
    one sentence naming the one it was set up with, and ships nothing."""
    code, _, err = lakecdc(config, "setup", env={"LAKECDC_WRITER": set_up_with})
    assert code == 0, err[-3000:]
    mixed(source_db.dsn, seed=81)
    code, _, err = lakecdc(config, "ship", "--once", env={"LAKECDC_WRITER": then})
    line = one_sentence(code, err, f"set up with LAKECDC_WRITER={set_up_with}")
    assert "a lakehouse keeps the writer" in line
    with source_db.connect() as conn:       # the slot did not move: nothing was shipped
        confirmed = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                 "WHERE slot_name = %s", [config.slot]).fetchone()[0]
        pending = conn.execute("SELECT count(*) FROM pg_logical_slot_peek_changes("
                               "%s, NULL, NULL)", [config.slot]).fetchone()[0]
    assert confirmed is not None and pending > 0
