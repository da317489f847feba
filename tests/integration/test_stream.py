"""``pipelines.run.stream``: bronze → silver (and gold) in one Structured Streaming query, on
real Delta tables; the silver half and what one pass means for replays and poison.

Bronze comes either from the real shipper (Postgres 15 + wal2json) or, for inputs wal2json
never produces, is written with ``bronze.table.BronzeTable`` exactly as the shipper writes
it. Every run is ``availableNow`` or ``processAllAvailable``: no sleeps.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from bronze.records import BRONZE_SCHEMA
from bronze.table import BronzeTable, Progress, SourceIdentity
from core.errors import UserError
from core.switches import Switches
from gold.deltas import GoldStopped
from pipelines.run.stream import StreamPaths
from tests.tests_support import run_bare_stream, start_bare_stream, stream_paths

KNOWN = ("public.notifications", "public.notification_history")
SVC = "11111111-1111-4111-8111-111111111111"
TPL = "22222222-2222-4222-8222-222222222222"
NOW = dt.datetime(2026, 11, 21, 6, 0, tzinfo=dt.timezone.utc)
KEY = ["commit_lsn", "seq", "tx_changes"]


def nid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def insert_json(n: int, table: str = "notifications", extra: str = "") -> str:
    """A wal2json v2 insert of notification ``n`` (``extra``: raw column objects to add)."""
    cols = [("id", "uuid", nid(n)), ("service_id", "uuid", SVC), ("template_id", "uuid", TPL),
            ("notification_type", "notification_type", "email"),
            ("notification_status", "text", "created")]
    text = json.dumps({"action": "I", "xid": n, "timestamp": "2026-11-21 06:00:00+00",
                       "lsn": "0/1", "schema": "public", "table": table,
                       "columns": [{"name": a, "type": t, "value": v} for a, t, v in cols]},
                      separators=(",", ":"))
    return text[:-2] + extra + "]}"


def delete_json(n: int) -> str:
    ident = [("id", nid(n)), ("service_id", SVC), ("template_id", TPL),
             ("notification_type", "email"), ("notification_status", "created")]
    return json.dumps({"action": "D", "xid": n, "timestamp": "2026-11-21 06:00:00+00",
                       "lsn": "0/1", "schema": "public", "table": "notifications",
                       "identity": [{"name": a, "type": "text", "value": v} for a, v in ident]},
                      separators=(",", ":"))


def row(commit_lsn: int, data: str, seq: int = 0, tx_changes: int = 1,
        action: str = "I") -> dict:
    return dict(slot="s", commit_lsn=commit_lsn, seq=seq, tx_changes=tx_changes, xid=7,
                lsn=commit_lsn, commit_ts=NOW, action=action, shipped_at=NOW, data=data)


def append_bronze(path: str, rows: list[dict]) -> None:
    """One bronze commit, written the way the shipper writes it (with its progress)."""
    table = BronzeTable(path)
    if not table.exists():
        table.create(SourceIdentity("s", "db", "1"), 0)
    top = max(r["commit_lsn"] for r in rows)
    table.append(iter([pa.RecordBatch.from_pylist(rows, schema=BRONZE_SCHEMA)]), "s",
                 Progress(top, top))


POISON = {
    110: ("not json", "malformed JSON"),
    120: (insert_json(1, table="other"), "unknown table public.other"),
}
FIRST = [row(100, insert_json(1)),
         row(110, POISON[110][0]),
         row(120, POISON[120][0]),
         # Bare NaN (invalid JSON) and a column added mid-stream: carried, not quarantined.
         row(130, insert_json(3, extra=',{"name":"rate_multiplier","type":"numeric",'
                                        '"value":NaN},{"name":"postage","type":"text",'
                                        '"value":"second"}'))]
SECOND = [row(200, insert_json(2), 0, 2), row(200, delete_json(1), 1, 2, action="D")]


@pytest.fixture
def paths(tmp_path: Path) -> StreamPaths:
    return stream_paths(tmp_path / "lakehouse")


def read(spark, path: str):
    return spark.read.format("delta").load(path)


def version(spark, path: str) -> int:
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"]


def versions(spark, paths: StreamPaths) -> tuple[int, ...]:
    return tuple(version(spark, p) for p in (paths.silver, paths.quarantine, paths.gold.gold))


def run_once(spark, paths: StreamPaths, known=KNOWN, **kw):
    return run_bare_stream(spark, paths, known, **kw)


def assert_one_silver_row_per_bronze_row(spark, paths: StreamPaths) -> None:
    assertDataFrameEqual(read(spark, paths.silver).select(KEY),
                         read(spark, paths.bronze).select(KEY))


def quarantined(spark, paths: StreamPaths):
    return read(spark, paths.quarantine).select("commit_lsn", "error", "data")


def expected_quarantine(spark):
    return spark.createDataFrame([(k, err, data) for k, (data, err) in POISON.items()],
                                 "commit_lsn bigint, error string, data string")


ACCEPT_POISON = max(POISON)           # the operator checked quarantine: count them 0


@pytest.mark.spark
@pytest.mark.integration
def test_shipped_changes_reach_silver_once(spark, source_db, config):
    from bronze.ship import Shipper
    from pipelines.run.pipeline import Locations
    from pipelines.setup.prepare import setup

    setup(config)
    insert = ("INSERT INTO notifications (id, service_id, template_id, notification_type, "
              "notification_status, key_type, created_at, rate_multiplier) "
              "VALUES (%s, %s, %s, %s, 'created', 'normal', now(), %s)")
    source_db.execute(insert, [nid(1), SVC, TPL, "email", "1.50"])
    source_db.execute(insert, [nid(2), SVC, TPL, "sms", "NaN"])
    source_db.execute("UPDATE notifications SET notification_status = 'sending' WHERE id = %s",
                      [nid(1)])
    source_db.execute("UPDATE notifications SET billable_units = 2 WHERE id = %s", [nid(2)])
    # Before a commit: a non-transactional message is decodable only once WAL is flushed
    # past it, and the message alone does not flush (Postgres < 17 has no flush option).
    # (Under a prefix lakecdc reads: wal2json delivers no others, bronze.slot.)
    source_db.execute("SELECT pg_logical_emit_message(false, 'lakecdc.marker', 'hello')")
    with source_db.connect() as conn, conn.transaction():      # archival move
        conn.execute("INSERT INTO notification_history SELECT * FROM notifications "
                     "WHERE id = %s", [nid(1)])
        conn.execute("DELETE FROM notifications WHERE id = %s", [nid(1)])
    Shipper(config).run(once=True)

    paths = Locations.from_config(config).stream
    first = run_once(spark, paths, config.tables)

    bronze_rows = read(spark, paths.bronze).count()
    assert (first.silver_rows, first.quarantined) == (bronze_rows, 0)
    assert_one_silver_row_per_bronze_row(spark, paths)
    silver = (read(spark, paths.silver)
              .where((F.col("op") != "M") | (F.col("message_content") == "hello"))
              .select("op", "table_name", "id", "notification_type", "notification_status",
                      "old_id", "old_notification_status", F.col("columns")["rate_multiplier"],
                      "message_content", "error"))
    assertDataFrameEqual(silver, spark.createDataFrame([
        ("I", "notifications", nid(1), "email", "created", None, None, "1.50", None, None),
        # wal2json 2.5 prints numeric NaN as null: carried, not quarantined.
        ("I", "notifications", nid(2), "sms", "created", None, None, None, None, None),
        ("U", "notifications", nid(1), "email", "sending", nid(1), "created", "1.50", None, None),
        # No key column changed, yet wal2json 2.5 (format v2) sends the identity anyway:
        # the old dims equal the new ones.
        ("U", "notifications", nid(2), "sms", "created", nid(2), "created", None, None, None),
        ("I", "notification_history", nid(1), "email", "sending", None, None, "1.50", None,
         None),
        ("D", "notifications", None, None, None, nid(1), "sending", None, None, None),
        ("M", None, None, None, None, None, None, None, "hello", None),
    ], silver.schema))
    assert read(spark, paths.quarantine).count() == 0

    before = versions(spark, paths)
    again = run_once(spark, paths, config.tables)
    assert (again.batches, again.silver_rows, again.quarantined) == (0, 0, 0)
    assert versions(spark, paths) == before
    assert_one_silver_row_per_bronze_row(spark, paths)


@pytest.mark.spark
def test_poison_is_quarantined_and_stops_the_pass_until_accepted_then_each_row_lands_once(
        spark, paths):
    """Silver never raises on data; gold stops on a row it cannot count. In one pass the
    batch's silver appends are already committed when gold stops: the restart with the rows
    accepted skips them (their txn) and completes gold."""
    append_bronze(paths.bronze, FIRST)
    with pytest.raises(GoldStopped, match="could not be parsed|unparseable|quarantine"):
        run_once(spark, paths)
    assertDataFrameEqual(quarantined(spark, paths), expected_quarantine(spark))
    assert_one_silver_row_per_bronze_row(spark, paths)
    stopped = versions(spark, paths)

    query, writer = start_bare_stream(spark, paths, KNOWN, once=False,
                                      accept_errors_upto=ACCEPT_POISON,
                                      trigger_interval="200 milliseconds")
    try:
        query.processAllAvailable()
        assert versions(spark, paths)[:2] == stopped[:2]        # silver: skipped, not again
        append_bronze(paths.bronze, SECOND)                     # after the poison
        query.processAllAvailable()
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
        writer.finish()                 # as a stream stops: gold's waiting steps folded

    assert_one_silver_row_per_bronze_row(spark, paths)
    assertDataFrameEqual(
        read(spark, paths.silver).select("commit_lsn", "seq", "op", "id", "old_id",
                                         F.col("columns")["rate_multiplier"].alias("rate"),
                                         F.col("columns")["postage"].alias("postage"),
                                         "error"),
        spark.createDataFrame([
            (100, 0, "I", nid(1), None, None, None, None),
            (110, 0, None, None, None, None, None, "malformed JSON"),
            (120, 0, None, None, None, None, None, "unknown table public.other"),
            (130, 0, "I", nid(3), None, "NaN", "second", None),
            (200, 0, "I", nid(2), None, None, None, None),
            (200, 1, "D", None, nid(1), None, None, None),
        ], "commit_lsn bigint, seq int, op string, id string, old_id string, "
           "rate string, postage string, error string"))
    assertDataFrameEqual(quarantined(spark, paths), expected_quarantine(spark))
    # Gold: nid(1) and nid(3) inserted, nid(2) inserted and nid(1) deleted: 2 created.
    assert [tuple(r) for r in read(spark, paths.gold.gold).select("count").collect()] == [(2,)]


def _drop_last_commit(checkpoint: Path) -> Path:
    last = max((p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()),
               key=lambda p: int(p.name))
    last.unlink()
    # Its checksum too: a crash before the commit file is written leaves neither.
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    return last


@pytest.mark.spark
def test_a_replayed_batch_is_skipped_by_every_sink(spark, paths):
    """F11: killed after the batch's Delta commits, before the checkpoint's commit file."""
    append_bronze(paths.bronze, FIRST)
    append_bronze(paths.bronze, SECOND)
    run_once(spark, paths, accept_errors_upto=ACCEPT_POISON)
    before = versions(spark, paths)
    gold = read(spark, paths.gold.gold).collect()

    dropped = _drop_last_commit(Path(paths.checkpoint))
    replay = run_once(spark, paths, accept_errors_upto=ACCEPT_POISON)

    assert dropped.exists()                               # the batch did run again ...
    assert (replay.batches, replay.silver_rows, replay.quarantined) == (1, 0, 0)
    assert versions(spark, paths) == before               # ... and wrote nothing
    assert read(spark, paths.gold.gold).collect() == gold
    assert_one_silver_row_per_bronze_row(spark, paths)
    assertDataFrameEqual(quarantined(spark, paths), expected_quarantine(spark))


@pytest.mark.spark
def test_a_lost_checkpoint_refuses_to_start_instead_of_duplicating(spark, paths):
    """F18: without its checkpoint the sinks cannot recognise their own batches."""
    append_bronze(paths.bronze, SECOND)
    run_once(spark, paths)
    shutil.rmtree(paths.checkpoint)

    with pytest.raises(UserError, match="checkpoint .* is missing"):
        run_once(spark, paths)
    assert_one_silver_row_per_bronze_row(spark, paths)


@pytest.mark.spark
def test_refuses_missing_bronze_and_foreign_tables(spark, paths):
    with pytest.raises(UserError, match="no bronze table"):
        start_bare_stream(spark, paths, KNOWN)
    append_bronze(paths.bronze, SECOND)
    spark.createDataFrame([(1,)], "x int").write.format("delta").save(paths.silver)
    with pytest.raises(UserError, match="does not have the silver schema"):
        start_bare_stream(spark, paths, KNOWN)
    assert not Path(paths.checkpoint).exists()        # nothing was started


@pytest.mark.spark
def test_negative_control_without_the_silver_guard_a_replayed_batch_appends_twice(
        spark, paths):
    """The replay of the test above with silver's guard off (no app transaction, no replay
    check): the batch's rows land in silver a second time."""
    append_bronze(paths.bronze, SECOND)
    run_once(spark, paths, switches=Switches(off={"silver_txn"}))
    _drop_last_commit(Path(paths.checkpoint))
    run_once(spark, paths, switches=Switches(off={"silver_txn"}))
    keys = [tuple(r) for r in read(spark, paths.silver).select(KEY).collect()]
    assert len(keys) == 2 * len(SECOND) and len(set(keys)) == len(SECOND)


@pytest.mark.spark
def test_a_batch_is_read_from_exactly_its_own_bronze_files(spark, paths):
    """``silver.writer.batch_rows`` reads a stream batch's bronze files with pyarrow when the
    batch is exactly those files (``batch_files``); the rows are the ones Spark collects, in
    every batch, also when Spark splits a file in several reads. Anything but the batch's
    own plan (here: a filter on it, a plain table read) is left to Spark."""
    from silver.writer import batch_files, batch_rows

    append_bronze(paths.bronze, FIRST)
    append_bronze(paths.bronze, SECOND)
    seen = []

    def keys(table: pa.Table) -> list[dict]:
        return table.select(KEY).sort_by([(k, "ascending") for k in KEY]).to_pylist()

    def batch(frame, batch_id: int) -> None:
        seen.append((batch_files(frame), keys(batch_rows(frame)) == keys(frame.toArrow()),
                     batch_files(frame.where(F.col("seq") == 0))))

    spark.conf.set("spark.sql.files.maxPartitionBytes", "1k")     # files read in splits
    try:
        (spark.readStream.format("delta").option("maxFilesPerTrigger", "1").load(paths.bronze)
         .writeStream.option("checkpointLocation", paths.checkpoint).foreachBatch(batch)
         .trigger(availableNow=True).start().awaitTermination())
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    bronze_files = sorted(str(p) for p in Path(paths.bronze).glob("*.parquet"))
    assert len(seen) == 2 and len(bronze_files) == 2
    assert sorted(files[0] for files, _, _ in seen) == bronze_files
    assert all(len(files) == 1 and same and filtered is None for files, same, filtered in seen)
    assert batch_files(read(spark, paths.bronze)) is None


@pytest.mark.spark
def test_a_batch_reads_at_most_batch_bytes_of_bronze(spark, paths, monkeypatch):
    """The driver holds a whole batch, so a batch is bounded (``BATCH_BYTES``): two bronze
    files bigger than the bound are two batches, each row still landing once."""
    monkeypatch.setattr("pipelines.run.stream.BATCH_BYTES", "1b")
    append_bronze(paths.bronze, FIRST)
    append_bronze(paths.bronze, SECOND)
    run = run_once(spark, paths, accept_errors_upto=ACCEPT_POISON)
    assert run.batches == 2
    assert_one_silver_row_per_bronze_row(spark, paths)
