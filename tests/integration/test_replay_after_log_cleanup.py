"""F30: a replay recognised without the commit history.

The pipeline stops right after a write (before Spark's checkpoint records the batch), stays
down longer than the log retention, and maintenance cleans the log: every commit file that
carried lakecdc's metadata (a batch id, a step, a floor) is gone. What a replay is
recognised by must still be there: the Delta app transactions, which every checkpoint
carries (silver's appends, gold's folds, ``_pending``, ``_deltas``, the seed and the
rebuild), and the rows of lakecdc's own ``_deltas``.

``outlive_the_log`` makes the outage without waiting: the log's retention set to a minute
(a commit, as maintenance's), every log entry aged an hour, a checkpoint at the newest one
(delta-rs cleans a log only up to the newest checkpoint at or before its oldest unexpired
entry), and the log cleaned as maintenance cleans it (``core.maintenance.clean_log``). It
asserts that no lakecdc metadata is left to read, so each test really runs without the
history.

The bare tests use real Delta tables and the real stream, no Postgres; the last one is the
whole scenario through the CLI, on each engine (``LAKECDC_WRITER``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from core.commits import commit_metadata
from core.config import reader_retention
from core.engine.delta_rs import read_commits_rs
from core.errors import UserError
from core.layout import GOLD, GOLD_DELTAS, GOLD_PENDING, QUARANTINE, SILVER, STREAM_CHECKPOINT
from core.maintenance import clean_log
from core.switches import Switches
from gold.gold_tables import GOLD_SCHEMA, GoldPaths, ensure_gold_tables, seed_gold
from gold.apply import GoldBatchWriter
from gold.asof import REBUILD_APP_ID, gold_state
from gold.start import gold_writer
from tests.integration.test_gold_apply import ON_FINISH, Crash, CrashAt, Sim, busy_sim, df
from tests.integration.test_gold_apply import gold_counts, nonzero
from tests.integration.test_stream import KNOWN, append_bronze, insert_json, row
from tests.integration.workload import mixed
from tests.invariants import check_invariants
from tests.tests_support import crash_once_at, run_bare_stream, stream_paths

pytestmark = pytest.mark.spark

A = ("svc-a", "tpl-1", "email", "created")


def outlive_the_log(*paths: str) -> None:
    """An outage longer than the log retention, then maintenance's log cleanup, on each
    table at ``paths``: afterwards no commit it holds carries lakecdc's metadata."""
    for path in paths:
        clean_log(path, log_retention_minutes=1)          # its retention: a commit
        for entry in (Path(path) / "_delta_log").iterdir():
            os.utime(entry, (time.time() - 3600,) * 2)
        DeltaTable(path).create_checkpoint()
        clean_log(path, log_retention_minutes=1)
        left = [c for c in read_commits_rs(path, layer="gold") if c.meta] + \
            [c for c in read_commits_rs(path, layer="silver") if c.meta]
        assert not left, f"{path} still holds lakecdc commits: {left}"


def gold_tables(paths: GoldPaths) -> tuple[str, str, str]:
    return paths.gold, paths.pending, paths.deltas


def keys(path: str) -> Counter:
    rows = DeltaTable(path).to_pyarrow_table(columns=["commit_lsn", "seq"]).to_pylist()
    return Counter((r["commit_lsn"], r["seq"]) for r in rows)


def drop_last_commit(checkpoint: str) -> None:
    """Spark's record of the newest batch, as a kill before it was written leaves it."""
    commits = Path(checkpoint) / "commits"
    last = max((p for p in commits.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    last.unlink()
    (commits / f".{last.name}.crc").unlink(missing_ok=True)


# --- silver ---------------------------------------------------------------------------------

@pytest.mark.parametrize("guard", [True, False], ids=["silver_txn", "negative_control"])
def test_silver_recognises_a_replayed_batch_after_the_log_is_cleaned(spark, tmp_path, guard):
    """Killed after batch 1's appends, before Spark's commit; the log of every table then
    cleaned. The replay of batch 1 appends nothing: silver holds each bronze row once.
    With silver's app transaction off (``silver_txn``) the replay appends it again."""
    paths = stream_paths(tmp_path / "lakehouse")
    switches = Switches(off=() if guard else {"silver_txn"})
    for n in (1, 2):
        append_bronze(paths.bronze, [row(100 * n, insert_json(n))])
        run_bare_stream(spark, paths, KNOWN, switches=switches)
    drop_last_commit(paths.checkpoint)
    outlive_the_log(paths.silver, paths.quarantine, *gold_tables(paths.gold))
    replay = run_bare_stream(spark, paths, KNOWN, switches=switches)
    assert replay.batches == 1
    silver = keys(paths.silver)
    if guard:
        assert replay.silver_rows == 0
        assert silver == keys(paths.bronze)
    else:
        assert silver == Counter({(100, 0): 1, (200, 0): 2})


# --- gold -----------------------------------------------------------------------------------

def engine_of(spark, engine: str):
    """A new engine, as each process's writer makes its own."""
    from core.engine.delta_rs import DeltaRs
    from core.engine.spark_delta import SparkDelta

    return SparkDelta(spark) if engine == "spark" else DeltaRs()


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_steps_waiting_in_deltas_are_folded_once_after_the_log_is_cleaned(spark, tmp_path,
                                                                         engine):
    """Steps of batches 0-2 folded into gold, steps of 3-5 waiting in ``_deltas`` when the
    process stops; both logs then cleaned. The next writer folds 3-5, and only them: gold
    records which batches it holds in its app transaction, ``_deltas`` which it holds in
    its own and in its rows."""
    paths = GoldPaths.beside(str(tmp_path / "gold" / "service_stats"))
    ensure_gold_tables(spark, paths)
    sim, _ = busy_sim()
    first = GoldBatchWriter(paths, fold_share=ON_FINISH, engine=engine_of(spark, engine))
    for batch_id, tx in enumerate(sim.txs[:6]):
        first.apply(spark, df(spark, tx).toArrow(), batch_id)
        if batch_id == 2:
            first.fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truths[2]
    outlive_the_log(*gold_tables(paths))
    restarted = gold_writer(spark, paths, fold_share=ON_FINISH,
                            engine=engine_of(spark, engine))
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truths[5]
    for batch_id, tx in enumerate(sim.txs[6:], start=6):
        restarted.apply(spark, df(spark, tx).toArrow(), batch_id)
    restarted.fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()


@pytest.mark.parametrize("engine,cleaned", [("delta-rs", ("gold",)),
                                            ("spark", ("gold", "deltas"))],
                         ids=["delta-rs,gold-log", "spark,both-logs"])
def test_a_batch_gold_holds_is_recognised_after_gold_s_log_is_cleaned(spark, tmp_path, engine,
                                                                      cleaned):
    """Every step folded when the process stops, the last batch not yet in Spark's
    checkpoint, and ``_deltas`` still holding the steps (the next step would replace them);
    then gold's log is cleaned, with or without ``_deltas``'. The next writer folds none of
    them again, and its replay of the last batch takes no step: gold's app transaction says
    it holds them all."""
    paths = GoldPaths.beside(str(tmp_path / "gold" / "service_stats"))
    ensure_gold_tables(spark, paths)
    sim, _ = busy_sim()
    first = GoldBatchWriter(paths, fold_share=ON_FINISH, engine=engine_of(spark, engine))
    last = len(sim.txs) - 2
    for batch_id, tx in enumerate(sim.txs[:-1]):
        first.apply(spark, df(spark, tx).toArrow(), batch_id)
    first.fold()
    assert DeltaTable(paths.deltas).to_pyarrow_table().num_rows > 0
    outlive_the_log(*(getattr(paths, table) for table in cleaned))
    restarted = gold_writer(spark, paths, fold_share=ON_FINISH,
                            engine=engine_of(spark, engine))
    handed: list = []
    for batch_id in (last, last + 1):                 # the replay, then the next batch
        restarted.apply(spark, df(spark, sim.txs[batch_id]).toArrow(), batch_id,
                        handed.append)
    restarted.fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()
    assert [step.batch_id for step in handed] == [last + 1]


def test_a_batch_that_wrote_pending_is_recognised_after_the_log_is_cleaned(spark, tmp_path):
    """Killed right after batch 0 wrote ``_pending`` (a transaction carried), its log then
    cleaned: the replay of batch 0 returns at step (1), as ``_pending``'s app transaction
    says; recomputed, it would add the carried rows to themselves."""
    paths = GoldPaths.beside(str(tmp_path / "gold" / "service_stats"))
    ensure_gold_tables(spark, paths)
    sim, _ = busy_sim()
    sim.create(A, A, A)                        # a 3-row transaction, 2 rows in batch 0
    rows = sim.rows
    split = len(rows) - 1
    with pytest.raises(Crash):
        GoldBatchWriter(paths, fold_share=1.0, switches=CrashAt("after_gold_pending")).apply(
            spark, df(spark, rows[:split]).toArrow(), 0)
    outlive_the_log(*gold_tables(paths))
    restarted = gold_writer(spark, paths, fold_share=1.0)
    assert restarted.apply(spark, df(spark, rows[:split]).toArrow(), 0).replayed
    restarted.apply(spark, df(spark, rows[split:]).toArrow(), 1)
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()


def test_gold_keeps_its_floor_and_epoch_after_the_log_is_cleaned(spark, tmp_path):
    """A seed at floor ``S``, batches 5-7 of a stream, a rebuild at ``L`` (counts exact as of
    ``L``: the old stream's steps and a transaction it never read), then gold's log is
    cleaned. The next writer still has floor ``L`` and epoch ``L`` (from the seed's and the
    rebuild's app transactions): a replay of rows below ``L`` counts nothing, its batch 0
    (numbered afresh) applies, and gold reports floor ``L`` (``verify``'s purges start
    there)."""
    paths = GoldPaths.beside(str(tmp_path / "gold" / "service_stats"))
    ensure_gold_tables(spark, paths)
    sim = Sim()
    seed_at = sim.lsn - 50
    assert seed_gold(spark, paths.gold, spark.createDataFrame(
        [], "service_id string, template_id string, notification_type string, "
            "notification_status string, count bigint"), seed_at)
    old = GoldBatchWriter(paths, floor_lsn=seed_at, fold_share=1.0)
    for n in range(3):
        sim.create(A)
        old.apply(spark, df(spark, sim.txs[-1]).toArrow(), 5 + n)
    sim.create(A)                               # committed before L, never read by gold
    floor = sim.lsn + 1
    (spark.createDataFrame([(*A, 4, floor, None)], GOLD_SCHEMA).write.format("delta")
     .mode("overwrite").option("txnAppId", REBUILD_APP_ID).option("txnVersion", floor)
     .option("userMetadata", commit_metadata(operation="rebuild", floor=floor,
                                             commit_lsn=floor - 1, epoch=floor))
     .save(paths.gold))
    sim.create(A)                               # after L
    outlive_the_log(*gold_tables(paths))
    assert (gold_state(spark, paths.gold).floor, gold_state(spark, paths.gold).epoch) == \
        (floor, floor)
    rebuilt = gold_writer(spark, paths, fold_share=1.0)
    assert (rebuilt.floor_lsn, rebuilt.epoch) == (floor, floor)
    rebuilt.apply(spark, df(spark, [*sim.txs[-2], *sim.txs[-1]]).toArrow(), 0)
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth() == {A: 5}
    assert gold_state(spark, paths.gold).floor == floor


# --- the stream's start: a checkpoint older than the tables ------------------------------

def test_an_older_checkpoint_is_refused_after_the_log_is_cleaned(spark, tmp_path):
    """The checkpoint restored from a copy made after batch 0, the tables at batch 1 and
    their logs cleaned: the start is refused (F18), from what silver's and gold's app
    transactions record."""
    paths = stream_paths(tmp_path / "lakehouse")
    copy = tmp_path / "checkpoint-after-batch-0"
    for n in (1, 2):
        append_bronze(paths.bronze, [row(100 * n, insert_json(n))])
        run_bare_stream(spark, paths, KNOWN)
        if n == 1:
            shutil.copytree(paths.checkpoint, copy)
    shutil.rmtree(paths.checkpoint)
    shutil.copytree(copy, paths.checkpoint)
    outlive_the_log(paths.silver, paths.quarantine, *gold_tables(paths.gold))
    with pytest.raises(UserError, match=r"at batch 0 but silver \(batch 1\) and gold "
                                        r"\(batch 1\)"):
        run_bare_stream(spark, paths, KNOWN)
    assert keys(paths.silver) == keys(paths.bronze)


# --- the whole scenario, through the CLI, on each engine -----------------------------------

STREAM_TABLES = (SILVER, QUARANTINE, GOLD, GOLD_PENDING, GOLD_DELTAS)


# Through Spark the whole scenario is a soak (two minutes): each of its replays is
# recognised by the tests above on that engine too (``[spark]``), and Spark's own
# txnAppId skip already caught silver's replay before the fix.
@pytest.fixture(params=["delta-rs", pytest.param("spark", marks=pytest.mark.soak)])
def config(request, config):
    """The test's configuration on each engine (``LAKECDC_WRITER``): ``setup`` (the
    ``witness`` fixture) makes the lakehouse with it."""
    return config.with_(writer=request.param, log_retention_minutes=1,
                        reader_retention=reader_retention("1m"))


@pytest.mark.integration
@pytest.mark.long
def test_killed_after_a_silver_append_then_down_longer_than_the_log_retention_ends_exact(
        source_db, config, witness, lakecdc, monkeypatch):
    """Mirrors off. ``stream --once`` dies right after batch 1's silver append (before
    Spark records the batch), the pipeline stays down longer than the log retention (every
    log entry aged two days: Spark's cleanup counts whole days), ``maintain --once`` runs
    twice, and the log is cleaned of every stream commit (delta-rs's maintenance cleaned
    silver's, which it compacted; the others, and Spark's, are cleaned at checkpoints their
    writers make, after more commits). Then ``run --once``: I1-I5 hold, and ``verify``
    finds no drift."""
    env = {"LAKECDC_WRITER": config.writer, "LAKECDC_MIRRORS": "none",
           "LAKECDC_LOG_RETENTION_MINUTES": str(config.log_retention_minutes),
           "LAKECDC_READER_RETENTION": "1m"}
    purged = mixed(source_db.dsn, seed=30)
    code, _, err = lakecdc(config, "run", "--once", env=env)           # batch 0
    assert code == 0, err[-3000:]
    purged += mixed(source_db.dsn, seed=31)
    code, _, err = lakecdc(config, "ship", "--once", env=env)
    assert code == 0, err[-3000:]
    crash_once_at(monkeypatch, "after_silver_append")
    code, _, err = lakecdc(config, "stream", "--once", env=env)        # batch 1, killed
    assert code == 3 and "Crash: after_silver_append" in err, err[-3000:]
    assert not (Path(config.table_path(STREAM_CHECKPOINT)) / "commits" / "1").exists()

    # Two maintenances in the outage: the log is cleaned up to the newest checkpoint at or
    # before its oldest unexpired entry, and the first one's checkpoint follows its own
    # (unexpired) commits.
    for _ in range(2):
        for log in Path(config.lakehouse).rglob("_delta_log"):
            for entry in log.iterdir():
                os.utime(entry, (time.time() - 2 * 86400,) * 2)
        code, out, err = lakecdc(config, "maintain", "--once", env=env)
        assert code == 0, err[-3000:]
    if config.writer == "delta-rs":
        assert not [c for c in read_commits_rs(config.table_path(SILVER), layer="silver")
                    if c.meta], f"maintenance was meant to clean silver's log: {out}{err}"
    outlive_the_log(*(config.table_path(t) for t in STREAM_TABLES))

    code, _, err = lakecdc(config, "run", "--once", env=env)           # batch 1 again
    assert code == 0, err[-3000:]
    check_invariants(config, witness, purged,
                     drain=lambda: lakecdc(config, "ship", "--once", env=env))
    code, out, err = lakecdc(config, "verify", env=env)
    assert code == 0, (out + err)[-3000:]
