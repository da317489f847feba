"""The mirrors at the seams where a replay must be recognised, or must not be taken for one,
on real Postgres + wal2json, Spark and Delta; each mirror is compared with its source table
read by psycopg, never with what the pipeline says:

- silver made anew by the documented way out of a lost stream checkpoint (F18): the
  mirrors' query starts a new checkpoint whose batch ids restart at 0, and the next change
  of a mirrored table still reaches its mirror (F32: the app id carries the query's epoch);
- a kill between a mirror's new initial rows and the drop of its old tail: the old tail is
  never laid over the new rows (F33);
- a finished ``tables add`` whose held changes the mirrors' query has not applied yet, then
  an outage longer than the log retention and ``maintain --once``: the replay is still due,
  read from app transactions, on each engine (F30).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from core.config import reader_retention
from core.layout import mirror_path
from tests.integration.test_mirrors import (
    INSERT,
    TABLE,
    assert_mirror_is_source,
    mirrored_after_one_run,
    values,
)
from tests.tests_support import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLE_ADDED = "public.docs"         # ``test_tables_add``'s table with TOASTed bodies


def move_away(config, *parts: str) -> None:
    """Move lakehouse paths aside, as an operator would."""
    lakehouse = Path(config.lakehouse)
    for part in parts:
        target = lakehouse.parent / "moved-away" / part
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(lakehouse / part), str(target))


def ok(done) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_after_silver_is_made_anew_the_mirrors_take_every_later_change(
        source_db, config, cli_here):
    """One ``run --once``: the mirror records its batch 0. Then the way out of a lost
    stream checkpoint (docs/silver.md): silver's two tables and the stream's checkpoint
    moved away, ``backfill rebuild-gold``, ``run --once``. The mirrors' query finds silver
    a new table and starts its checkpoint afresh: its batch 0 holds all of the new silver,
    the rows changed since included, and the mirror equals the source."""
    from tests.integration.workload import insert

    with source_db.connect() as conn:                 # counted too: gold has counts to rebuild
        insert(conn, random.Random(31), 10)
    env = mirrored_after_one_run(source_db, config, cli_here, seed=32, rounds=20)
    assert_mirror_is_source(source_db, config)
    move_away(config, "silver/changes", "silver/quarantine", "_checkpoints/stream")
    ok(cli_here(["backfill", "rebuild-gold"], env))
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET small = small + 1")     # the body left alone
        conn.execute("DELETE FROM typed_rows WHERE k1 % 5 = 0")
        conn.execute(INSERT, values(random.Random(33), 7, "after"))
    ok(cli_here(["run", "--once"], env))
    assert_mirror_is_source(source_db, config)


def test_a_kill_between_new_initial_rows_and_the_drop_of_the_old_tail_lays_no_stale_row(
        source_db, config, cli_here, monkeypatch):
    """A mirror keeping its batches in a tail (``LAKECDC_MIRROR_MERGE_S=0``) is killed right
    after its tail took a batch (``small = 1``). The rows then change again (``small = 2``)
    and a newer baseline of the table is written (a lakehouse set up before mirrors were
    loaded by chunks: ``silver/_mirror_baselines``), which the next start lays down as the
    mirror's rows; that start is killed right after the new rows' commit
    (``after_mirror_seed``). The mirror, its tail laid over it, equals the source then, and
    after the next run, which drains what tail is left, so does its table alone."""
    import psycopg

    from pipelines.source.mirror_baseline import write_baselines
    from silver.mirrors.tail import tail_path
    from tests.tests_support import crash_once_at

    env = mirrored_after_one_run(source_db, config, cli_here, seed=33, rounds=10)
    env = {**env, "LAKECDC_MIRROR_MERGE_S": "0"}
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET small = 1")
    for stage in (["ship", "--once"], ["stream", "--once"]):
        ok(cli_here(stage, env))
    tail = tail_path(mirror_path(config.lakehouse, TABLE))
    crash_once_at(monkeypatch, "after_mirror_merge")
    assert cli_here(["mirrors", "--once"], env).returncode == 3       # killed
    assert DeltaTable(tail).to_pyarrow_table().num_rows > 0

    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET small = 2")
    with psycopg.connect(source_db.dsn) as snapshot:        # the new baseline, at a point
        snapshot.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        name = snapshot.execute("SELECT pg_export_snapshot()").fetchone()[0]
        point = snapshot.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()[0]
        write_baselines(source_db.dsn, name, (TABLE,), config.lakehouse, point)
    crash_once_at(monkeypatch, "after_mirror_seed")
    assert cli_here(["mirrors", "--once"], env).returncode == 3       # killed
    seeded = json.loads(DeltaTable(mirror_path(config.lakehouse, TABLE)).history(1)[0]
                        ["userMetadata"])
    assert seeded["seed"] == point, seeded
    assert_mirror_is_source(source_db, config, tail=True)
    ok(cli_here(["mirrors", "--once"], env))
    assert_mirror_is_source(source_db, config)


def outlive_the_log(cli_here, env: dict, config, path: str, engine=None) -> None:
    """An outage longer than the log retention (one minute here), then ``maintain --once``,
    then the log cleaned: every entry of the mirror at ``path`` aged an hour, maintenance,
    every entry aged again and a checkpoint. Delta cleans an expired log only before a
    checkpoint that is itself past the retention, at a later maintenance on delta-rs's path
    (``core.maintenance``), at its next checkpoint on Spark's
    (``core.engine.spark_maintenance``); ``clean_log`` does it here. Through Spark
    (``engine``) the mirror's own maintenance alone, as ``maintain --once`` runs it: every
    table's through Spark takes minutes on two cores. Asserts that no commit of a load is left
    in the mirror's history to read."""
    from core.commits import parse_commit_metadata
    from core.maintenance import clean_log

    def age() -> None:
        for entry in (Path(path) / "_delta_log").iterdir():
            os.utime(entry, (time.time() - 3600,) * 2)

    age()
    if engine is None:
        maintained = ok(cli_here(["maintain", "--once"], env))
        assert f"mirror {TABLE_ADDED}:" in maintained, maintained
    else:
        from pipelines.maintain.owners import Maintained
        from pipelines.maintain.schedule import maintain

        maintain([Maintained(f"mirror {TABLE_ADDED}", path, 1)], config, engine=engine)
    age()
    DeltaTable(path).create_checkpoint()
    clean_log(path, log_retention_minutes=1)
    left = [m for c in DeltaTable(path).history()
            if (m := parse_commit_metadata(c.get("userMetadata"), "mirror")) and "load" in m]
    assert not left, left


# Through Spark a soak (95 s): the delta-rs run proves the same replay, and the Spark
# writer's app transactions are read after a log cleanup by test_replay_after_log_cleanup's
# ``[spark]`` tests.
@pytest.mark.parametrize("writer", ["delta-rs", pytest.param("spark", marks=pytest.mark.soak)])
def test_a_finished_add_is_replayed_after_an_outage_longer_than_the_log_retention(
        source_db, config, spark, cli_here, monkeypatch, writer):
    """``tables add`` crashes right after the first chunk of ``docs`` is in its mirror; the
    rows change (ten of that chunk updated without their TOASTed body, one rewritten, one
    deleted), and the stream and the mirrors' query take those changes while the table
    still loads: the mirrors hold them back. The rerun completes the load. Then the
    pipeline stays down longer than the log retention (one minute), and ``maintain
    --once`` runs, its log cleaned: no commit of the load is left in the mirror's history.
    The next ``run --once`` must still apply the held changes: the mirror equals the
    source. On each engine (``LAKECDC_WRITER``)."""
    from core.engine.spark_delta import SparkDelta
    from pipelines.setup.prepare import setup
    from pipelines.setup.capture import add_table
    from tests.integration.test_tables_add import (
        assert_docs_mirrored,
        change_docs,
        create_docs,
    )
    from tests.tests_support import Crash, crash_once_at, running_shipper, wait_for
    from tests.truth import bronze_rows

    rng = random.Random(30)
    with source_db.connect() as conn:
        create_docs(conn, rng)
    spark_writes = writer == "spark"
    config = config.with_(mirrors=None, log_retention_minutes=1,
                          reader_retention=reader_retention("1m"),
                          writer="spark" if spark_writes else config.writer)
    setup(config, spark_factory=lambda: spark)
    env = {**cli_env(config), "LAKECDC_LOG_RETENTION_MINUTES": "1",
           "LAKECDC_READER_RETENTION": "1m",
           **({"LAKECDC_WRITER": "spark"} if spark_writes else {})}
    engine = SparkDelta(spark) if spark_writes else None
    with running_shipper(config, engine=engine):
        crash_once_at(monkeypatch, "after_mirror_chunk")
        with pytest.raises(Crash):
            add_table(config, TABLE_ADDED, chunk_rows=10, spark_factory=lambda: spark)
        with source_db.connect() as conn:
            change_docs(conn, rng)
        wait_for(lambda: any("rewritten" in r["data"] for r in bronze_rows(config.bronze_path)),
                 timeout=120, interval=0.2)
        for step in (["stream", "--once"], ["mirrors", "--once"]):      # while it loads
            ok(cli_here(step, env))
        assert "its 29 current rows loaded" in ok(cli_here(
            ["tables", "add", TABLE_ADDED, "--chunk-rows", "10"], env))
    outlive_the_log(cli_here, env, config, mirror_path(config.lakehouse, TABLE_ADDED), engine)
    ok(cli_here(["run", "--once"], env))
    assert_docs_mirrored(source_db, config)
