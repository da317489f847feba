"""``LAKECDC_WRITER=spark`` for ``setup`` and the shipper (the whole path on S3 whose keys
only Spark holds, with a shipper killed after its commit: ``test_spark_only``):

- negative control: the shipper killed between its bronze commit and the slot advance with
  the ``version_check`` guard off leaves duplicates (in this process, on local disk);
- ``setup`` refuses a lakehouse Spark cannot write, leaving no slot;
- the Spark bronze table keeps its identity and every app version across commits, and
  skips a replay;
- a lakehouse keeps the writer it was set up with.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from bronze.records import BRONZE_SCHEMA
from bronze.spark_table import SparkBronzeTable
from bronze.table import Progress, SourceIdentity
from core.engine.spark_delta import SparkDelta
from tests.cloud_servers import guarded_s3
from tests.integration.workload import mixed
from tests.tests_support import Crash, cli_env, crash_once_at, error_line, one_sentence, run_cli
from tests.truth import Witness, check_bronze

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_without_the_version_check_a_killed_spark_shipper_duplicates(source_db, config, spark,
                                                                     monkeypatch):
    """In this process, on local disk: the guard's logic is the same on any storage."""
    from bronze.ship import Shipper
    from pipelines.setup.prepare import setup

    config = config.with_(writer="spark")
    setup(config, spark_factory=lambda: spark)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        mixed(source_db.dsn, seed=5)
        unsafe = config.with_(disabled_guards=frozenset({"version_check"}))
        crash_once_at(monkeypatch, "after_bronze_commit")
        with pytest.raises(Crash):
            Shipper(unsafe, engine=SparkDelta(spark)).run(once=True)
        Shipper(unsafe, engine=SparkDelta(spark)).run(once=True)
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
        # No settings of Spark's own: a conf directory that does not exist (an existing one,
        # even empty, would come first on the JVM's classpath, where the suite's class
        # archive no longer maps: tests_support.spark_properties).
        env.update(s3.env(), LAKECDC_LAKEHOUSE=f"s3://{bucket}/lakehouse",
                   LAKECDC_WRITER="spark", SPARK_CONF_DIR=str(tmp_path / "no-conf"))
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
    table = SparkBronzeTable(path, SparkDelta(spark))
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
    unguarded = SparkBronzeTable(path, SparkDelta(spark), skip_replays=False)
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
