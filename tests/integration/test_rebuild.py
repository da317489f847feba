"""``lakecdc backfill rebuild-gold``: a fresh baseline swapped into gold in one commit."""

from __future__ import annotations

import random
import threading

import pytest
from deltalake import DeltaTable

from gold.deltas import GoldStopped
from pipelines.backfill.rebuild import rebuild_and_push
from core.locks import gold_writer_lock
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import cli_env, run_cli
from tests.truth import check_gold, dashboard_counts, gold_counts, source_truth
from tests.integration.workload import archive, insert, mixed, purge_history, transition

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def pipeline(config, spark):
    setup(config)
    return Pipeline(config, spark_factory=lambda: spark)


def test_rebuild_after_a_truncate_restores_exact_counts(source_db, config, pipeline):
    rng = random.Random(61)
    with source_db.connect() as conn:
        insert(conn, rng, 200)
        transition(conn, 0.5, "delivered")
        archive(conn, 0.3)
    pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)

    source_db.execute("TRUNCATE notifications")
    with source_db.connect() as conn:        # changes after the TRUNCATE, before the rebuild
        insert(conn, rng, 50)
        transition(conn, 0.4, "sending")
    with pytest.raises(GoldStopped, match="rebuild-gold"):
        pipeline.run_once()

    report = rebuild_and_push(pipeline.spark, pipeline.config, pipeline.where, pipeline.gold_lock)
    # The baseline holds what the source has now: the 50 new rows + the archived history.
    assert report.baseline_total == sum(source_truth(source_db.dsn).values())
    # Rows up to the new baseline (the TRUNCATE, the 50 inserts) are skipped, not re-added.
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)

    purged = mixed(source_db.dsn, seed=62)
    pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)


def test_rebuild_repairs_drift_and_readers_never_see_a_partial_gold(source_db, config,
                                                                    pipeline):
    rng = random.Random(63)
    with source_db.connect() as conn:
        insert(conn, rng, 400)
        transition(conn, 0.5, "delivered")
        archive(conn, 0.5)
        purge_history(conn, 0.2)          # purged rows leave the counts after a rebuild
    pipeline.run_once()
    gold_path = pipeline.where.gold
    pipeline.spark.sql(f"UPDATE delta.`{gold_path}` SET count = count + 7 "
                       "WHERE notification_status = 'delivered'")
    drifted = sum(gold_counts(config.lakehouse).values())

    seen: list[int] = []
    stop = threading.Event()

    def read_gold():
        while not stop.is_set():
            seen.append(sum(DeltaTable(gold_path).to_pyarrow_table().column("count")
                            .to_pylist()))

    reader = threading.Thread(target=read_gold)
    reader.start()
    try:
        report = rebuild_and_push(pipeline.spark, pipeline.config, pipeline.where,
                                  pipeline.gold_lock)
    finally:
        stop.set()
        reader.join()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)
    exact = sum(gold_counts(config.lakehouse).values())
    assert exact == report.baseline_total != drifted
    assert len(seen) > 3, "the reader did not overlap the rebuild"
    assert set(seen) <= {drifted, exact}, f"a reader saw a partial gold: {set(seen)}"
    assert dashboard_counts(source_db.dsn) == gold_counts(config.lakehouse)


def test_rebuild_refuses_while_another_process_writes_gold(source_db, config, pipeline):
    env = cli_env(config)
    with gold_writer_lock(config.dashboard, pipeline.where.gold):
        result = run_cli(["backfill", "rebuild-gold"], env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "only one may write gold" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_rebuild_gold_prints_what_it_did(source_db, config, pipeline, cli_here):
    with source_db.connect() as conn:
        insert(conn, random.Random(64), 30)
    pipeline.run_once()
    result = cli_here(["backfill", "rebuild-gold"], cli_env(config))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rebuilt gold from a baseline of 30 notifications" in result.stdout
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)
    # The rebuild started gold's stream afresh (batch ids from 0, its own app id): later
    # changes are applied.
    purged = mixed(source_db.dsn, seed=66)
    pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)


@pytest.mark.parametrize("epoch_app_id", ["on", "off"])
@pytest.mark.long
def test_a_lost_checkpoint_is_recovered_by_a_new_silver_and_a_rebuild_only_with_an_app_id_per_epoch(
        source_db, config, pipeline, monkeypatch, epoch_app_id):
    """The documented way out of a lost stream checkpoint: move silver and the checkpoint
    away, rebuild gold. The new checkpoint's batch ids start at 0 again; under the old Delta
    app id ``_pending`` records the old ones (here its last batch's, which carried a
    transaction's start and wrote it), so the new batches would be taken for replays and
    skipped. Each rebuild is an epoch with an app id of its own, so they apply. Negative
    control: with the epoch taken out of the app id, the changes after the rebuild never
    reach gold."""
    import shutil
    from pathlib import Path

    import gold.apply
    import gold.asof
    from gold.deltas import CONTRIBUTIONS

    if epoch_app_id == "off":
        monkeypatch.setattr(gold.apply, "txn_app_id", lambda epoch: gold.asof.APP_ID)
    rng = random.Random(65)
    for _ in range(3):                        # gold batches 0, 1, 2 under lakecdc-gold
        with source_db.connect() as conn:
            insert(conn, rng, 20)
        pipeline.run_once()
    (pipeline.spark.createDataFrame([], CONTRIBUTIONS).write.format("delta").mode("overwrite")
     .option("txnAppId", gold.asof.APP_ID).option("txnVersion", 2)
     .save(pipeline.where.stream.gold.pending))
    lakehouse = Path(config.lakehouse)
    for part in ("silver", "_checkpoints/stream"):
        shutil.move(str(lakehouse / part), str(lakehouse.parent / part.replace("/", "_")))
    rebuild_and_push(pipeline.spark, pipeline.config, pipeline.where, pipeline.gold_lock)
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)     # the rebuild is exact
    for _ in range(3):
        with source_db.connect() as conn:
            insert(conn, rng, 20)
        pipeline.run_once()
    if epoch_app_id == "on":
        check_gold(config.lakehouse, source_db.dsn, source_db.dsn)
    else:
        with pytest.raises(AssertionError, match="gold differs from the source"):
            check_gold(config.lakehouse, source_db.dsn, source_db.dsn)
