"""gold.apply on real Delta tables: completeness, replay, crashes (F12, F15).

Silver input comes from ``Sim``, a tiny in-memory model of the two source tables that
emits silver rows transaction by transaction. The truth every test compares gold with is
``Sim.truth()``: GROUP BY dims over the simulated ``notifications`` + ``notification_history``
rows plus the rows purged from history - computed from the model's tables, never from
gold's own delta rules.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from pyspark.sql import Row

from core.commits import commit_metadata as metadata
from core.commits import newest
from core.engine.spark_delta import read_commits
from core.switches import Switches
import gold.apply
from gold.gold_tables import GOLD_SCHEMA, GoldPaths, ensure_gold_tables, seed_gold
from gold.asof import REBUILD_APP_ID, step_app_id
from gold.apply import GoldBatchWriter
from gold.deltas import GoldStopped
from gold.fold import FoldClock, summed
from gold.start import applied_batch, gold_writer
from tests.tests_support import run_gold_over_silver as run_gold
from silver.schema import SILVER_CHANGES

pytestmark = pytest.mark.spark

LIVE = ("public", "notifications")
HIST = ("public", "notification_history")
TS = datetime(2025, 3, 1, 12, 0, 0)
REPO = Path(__file__).resolve().parents[2]
DIM_NAMES = ("service_id", "template_id", "notification_type", "notification_status")


def last_metadata(spark, path: str) -> dict | None:
    """The newest lakecdc metadata of gold in the latest 100 commits of ``path``."""
    return newest(read_commits(spark, path, limit=100))


class Sim:
    """The source tables as dicts, and the silver rows their changes produce."""

    def __init__(self, first_lsn: int = 1000) -> None:
        self.live: dict[str, tuple] = {}
        self.hist: dict[str, tuple] = {}
        self.purged: Counter = Counter()
        self.lsn = first_lsn
        self.txs: list[list[dict]] = []
        self.truths: list[dict[tuple, int]] = []    # truth after each transaction
        self._ids = 0

    @property
    def rows(self) -> list[dict]:
        return [r for tx in self.txs for r in tx]

    def truth(self) -> dict[tuple, int]:
        total = Counter(self.live.values()) + Counter(self.hist.values()) + self.purged
        return {k: v for k, v in total.items() if v}

    def _commit(self, changes: list[dict]) -> list[dict]:
        self.lsn += 100
        tx = [_silver_row(self.lsn, seq, len(changes), **c) for seq, c in enumerate(changes)]
        self.txs.append(tx)
        self.truths.append(self.truth())
        return tx

    def create(self, *dims: tuple) -> list[str]:
        ids = []
        for d in dims:
            self._ids += 1
            ids.append(f"n{self._ids}")
            self.live[ids[-1]] = d
        self._commit([dict(op="I", table=LIVE, id=i, new=self.live[i]) for i in ids])
        return ids

    def set_status(self, ids: list[str], status: str) -> None:
        changes = []
        for i in ids:
            old = self.live[i]
            self.live[i] = (*old[:3], status)
            changes.append(dict(op="U", table=LIVE, id=i, new=self.live[i], old=old))
        self._commit(changes)

    def touch(self, ids: list[str]) -> None:
        """An UPDATE of a non-key column: no identity in the WAL."""
        self._commit([dict(op="U", table=LIVE, id=i, new=self.live[i]) for i in ids])

    def archive(self, ids: list[str]) -> None:
        changes = []
        for i in ids:
            self.hist[i] = self.live.pop(i)
            changes += [dict(op="I", table=HIST, id=i, new=self.hist[i]),
                        dict(op="D", table=LIVE, id=i, old=self.hist[i])]
        self._commit(changes)

    def purge(self, ids: list[str]) -> None:
        for i in ids:
            self.purged[self.hist[i]] += 1
        self._commit([dict(op="D", table=HIST, id=i, old=self.hist.pop(i)) for i in ids])

    def delete(self, ids: list[str]) -> None:
        self._commit([dict(op="D", table=LIVE, id=i, old=self.live.pop(i)) for i in ids])

    def message(self) -> None:
        self._commit([dict(op="M", table=None)])

    def truncate_live(self) -> None:
        self.live.clear()
        self._commit([dict(op="T", table=LIVE)])


def _silver_row(commit_lsn, seq, tx_changes, op, table, id=None, new=None, old=None):
    new, old = new or (None,) * 4, old or (None,) * 4
    schema, name = table or (None, None)
    return dict(commit_lsn=commit_lsn, seq=seq, tx_changes=tx_changes, xid=commit_lsn // 100,
                lsn=commit_lsn - 50 + seq, commit_ts=TS, op=op, schema_name=schema,
                table_name=name, id=id if new[0] else None,
                **dict(zip(DIM_NAMES, new)), old_id=id if old[0] else None,
                **{f"old_{c}": v for c, v in zip(DIM_NAMES, old)}, columns=None,
                message_prefix="app" if op == "M" else None,
                message_content="hello" if op == "M" else None, error=None, shipped_at=TS,
                identity=None, column_types=None)


def busy_sim() -> tuple[Sim, list[str]]:
    """Every kind of change once or more, over three services."""
    sim = Sim()
    a = ("svc-a", "tpl-1", "email", "created")
    b = ("svc-b", "tpl-2", "sms", "created")
    c = ("svc-c", "tpl-3", "letter", "created")
    ids = sim.create(a, a, a, b, b, c)
    sim.set_status(ids[:4], "sending")
    sim.touch(ids[:2])
    sim.message()
    sim.set_status(ids[:2], "delivered")
    sim.archive(ids[:3])
    sim.create(c, b)
    sim.purge(ids[:1])
    sim.delete([ids[3], ids[5]])               # svc-b "sending" drops to 0
    return sim, ids


def df(spark, rows):
    return spark.createDataFrame([Row(**r) for r in rows], SILVER_CHANGES)


def gold_counts(spark, path) -> dict[tuple, int]:
    return {tuple(r[c] for c in DIM_NAMES): r["count"]
            for r in spark.read.format("delta").load(path).collect()}


def nonzero(counts: dict) -> dict:
    return {k: v for k, v in counts.items() if v}


EVERY_BATCH = 1.0              # every step folded into gold at once, as a small gold does
ON_FINISH = 0.0                # steps wait in _deltas until told (the stream's end)


@pytest.fixture
def paths(spark, tmp_path) -> GoldPaths:
    p = GoldPaths.beside(str(tmp_path / "gold" / "service_stats"))
    ensure_gold_tables(spark, p)
    return p


class Crash(Exception):
    pass


class CrashAt(Switches):
    """In-process stand-in for a kill at a fault point: raises instead of exiting (``off``:
    the guards switched off, as ``Switches``)."""

    def __init__(self, point: str, off=()) -> None:
        super().__init__(off=off)
        self.point = point

    def hit(self, name: str) -> None:
        if name == self.point:
            raise Crash(name)


# --- the batch function, called directly ------------------------------------------------

def test_only_complete_transactions_are_applied_and_the_rest_is_carried(spark, paths):
    sim, _ = busy_sim()
    rows = sim.rows
    tx_cut = sim.txs[4]                      # the status change of two rows: split it
    first = [r for r in rows if r["commit_lsn"] < tx_cut[0]["commit_lsn"]] + tx_cut[:1]
    second = [r for r in rows if r not in first]
    writer = GoldBatchWriter(paths, fold_share=EVERY_BATCH)

    r0 = writer.apply(spark, df(spark, first).toArrow(), 0)
    assert r0.applied_transactions == 4 and r0.pending_transactions == 1
    assert r0.commit_lsn == sim.txs[3][0]["commit_lsn"]
    assert gold_counts(spark, paths.gold) == sim.truths[3]
    # The MERGE's own metrics: one gold row per key whose net delta is not 0, every key of
    # the step (gold was empty).
    assert r0.merged_keys == len(nonzero(sim.truths[3])) == r0.step_keys

    r1 = writer.apply(spark, df(spark, second).toArrow(), 1)
    assert r1.pending_transactions == 0
    assert r1.merged_keys == sum(1 for k in set(sim.truth()) | set(sim.truths[3])
                                 if sim.truth().get(k, 0) != sim.truths[3].get(k, 0))
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()
    # A key counted in batch 0 and emptied in batch 1 stays, at 0, for the dashboard.
    assert gold_counts(spark, paths.gold)[("svc-b", "tpl-2", "sms", "sending")] == 0
    assert spark.read.format("delta").load(paths.pending).isEmpty()
    meta = last_metadata(spark, paths.gold)
    assert (meta["batch_id"], meta["commit_lsn"]) == (1, sim.lsn)


def test_a_later_complete_transaction_waits_for_an_earlier_incomplete_one(spark, paths):
    sim = Sim()
    a = ("svc-a", "tpl-1", "email", "created")
    sim.create(a, a)                          # tx 1: two rows
    sim.create(a)                             # tx 2: one row
    writer = GoldBatchWriter(paths, fold_share=EVERY_BATCH)
    r0 = writer.apply(spark, df(spark, [sim.txs[0][0], sim.txs[1][0]]).toArrow(), 0)
    assert (r0.applied_transactions, r0.pending_transactions) == (0, 2)
    assert gold_counts(spark, paths.gold) == {}
    writer.apply(spark, df(spark, [sim.txs[0][1]]).toArrow(), 1)
    assert gold_counts(spark, paths.gold) == sim.truth() == {a: 3}


@pytest.mark.parametrize("share", [EVERY_BATCH, ON_FINISH], ids=["folded", "in_deltas"])
@pytest.mark.parametrize("guard", [True, False], ids=["guard_on", "guard_off_negative_control"])
def test_killed_after_the_step_before_pending_replays_without_double_count(spark, paths, guard,
                                                                          share):
    """Killed once batch 1's step is written (MERGEd into gold, or appended to _deltas)
    and before _pending: a new writer folds what _deltas holds, and the replay of batch 1
    is skipped because gold records it - nor is its step handed to the dashboard again
    (``planned``: ``lakecdc run``'s push ahead of gold, whose fence would take it, for it
    would start at gold's watermark, which holds it already)."""
    sim, _ = busy_sim()
    rows = sim.rows
    first = len(sim.txs[0])                   # batch 0: the first transaction, a watermark
    split = len(rows) - 1                     # the last transaction arrives in batch 2
    off = () if guard else {"gold_txn"}
    GoldBatchWriter(paths, switches=Switches(off=off), fold_share=share).apply(
        spark, df(spark, rows[:first]).toArrow(), 0)
    handed: list = []
    with pytest.raises(Crash):
        GoldBatchWriter(paths, fold_share=share,
                        switches=CrashAt("after_gold_merge", off)).apply(
            spark, df(spark, rows[first:split]).toArrow(), 1, handed.append)
    assert [step.batch_id for step in handed] == [1]
    restarted = GoldBatchWriter(paths, switches=Switches(off=off), fold_share=share)
    again: list = []
    restarted.apply(spark, df(spark, rows[first:split]).toArrow(), 1,   # Spark re-runs it
                    again.append)
    restarted.apply(spark, df(spark, rows[split:]).toArrow(), 2, again.append)
    restarted.fold()
    got = nonzero(gold_counts(spark, paths.gold))
    if guard:
        assert [step.batch_id for step in again] == [2]
        assert got == sim.truth()
    else:
        # The checker must be able to fail: without the txn guard batch 1 counts twice, and
        # its step is handed on again, from gold's watermark (which holds it).
        assert [step.batch_id for step in again] == [1, 2]
        assert again[0].after_lsn == handed[0].commit_lsn
        step, final = Counter(sim.truths[-2]), Counter(sim.truth())
        step.subtract(sim.truths[0])
        final.update(step)
        assert got != nonzero(sim.truth())
        assert got == nonzero(final)


def test_steps_wait_in_deltas_until_a_fold_brings_gold_to_them_all(spark, paths):
    """A large gold takes a batch's step into _deltas and folds several at once: gold then
    holds what one MERGE per batch would have, with the newest batch's watermark and
    transaction; the next step replaces what _deltas held."""
    from deltalake import DeltaTable

    sim, _ = busy_sim()
    txs = sim.txs
    writer = GoldBatchWriter(paths, fold_share=ON_FINISH)
    for batch_id, tx in enumerate(txs):
        step = writer.apply(spark, df(spark, tx).toArrow(), batch_id)
        assert not step.folded and step.merged_keys == 0
        assert writer.watermark(spark) == tx[0]["commit_lsn"]
    assert gold_counts(spark, paths.gold) == {}                      # nothing folded yet
    # _deltas holds every step: from an empty gold, their sum is the source's counts.
    held = summed([DeltaTable(paths.deltas).to_pyarrow_table()]).to_pylist()
    assert nonzero({tuple(r[c] for c in DIM_NAMES): r["delta"] for r in held}) == sim.truth()
    assert writer.fold() > 0
    got = gold_counts(spark, paths.gold)
    assert nonzero(got) == sim.truth()
    # A key counted and emptied between folds stays, at 0, for the dashboard.
    assert got[("svc-b", "tpl-2", "sms", "sending")] == 0
    meta = last_metadata(spark, paths.gold)
    assert (meta["batch_id"], meta["commit_lsn"]) == (len(txs) - 1, sim.lsn)
    assert DeltaTable(paths.gold).transaction_version(writer.folded_app) == sim.lsn
    assert writer.fold() == 0                                        # nothing waits
    a = ("svc-a", "tpl-1", "email", "created")
    sim.create(a)
    writer.apply(spark, df(spark, sim.txs[-1]).toArrow(), len(txs))
    assert DeltaTable(paths.deltas).to_pyarrow_table().column("batch_id").to_pylist() == \
        [len(txs)]


def test_a_kill_after_a_fold_of_several_steps_folds_none_again(spark, paths):
    sim, _ = busy_sim()
    writer = GoldBatchWriter(paths, fold_share=ON_FINISH, switches=CrashAt("after_gold_fold"))
    for batch_id, tx in enumerate(sim.txs):
        writer.apply(spark, df(spark, tx).toArrow(), batch_id)
    with pytest.raises(Crash):
        writer.fold()                              # killed right after the fold's commit
    restarted = gold_writer(spark, paths)           # folds what _deltas holds past gold
    assert restarted.fold() == 0
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()


def test_steps_of_the_writer_before_it_are_folded_when_the_stream_starts(spark, paths):
    """A process that stopped between folds left steps in _deltas; the next one folds them
    before its first batch, and its watermark is theirs."""
    sim, _ = busy_sim()
    first = GoldBatchWriter(paths, fold_share=ON_FINISH)
    for batch_id, tx in enumerate(sim.txs):
        first.apply(spark, df(spark, tx).toArrow(), batch_id)
    assert gold_counts(spark, paths.gold) == {}
    gold_writer(spark, paths)
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()
    assert last_metadata(spark, paths.gold)["commit_lsn"] == sim.lsn


@pytest.mark.parametrize("check", [True, False], ids=["guard_on", "guard_off_negative_control"])
def test_steps_left_in_deltas_before_a_rebuild_are_not_folded_after_it(spark, paths, check,
                                                                       monkeypatch):
    """A rebuild killed after its new gold and before it emptied _deltas: the steps there are
    of the epoch before (inside the rebuild's baseline). Folded, they would move gold's
    watermark back behind the baseline and record it under the new epoch. Told apart by
    ``_deltas``' app transaction, whose app id is the epoch's (``gold.asof.step_app_id``);
    the negative control gives every epoch the same one."""
    sim = Sim()
    a = ("svc-a", "tpl-1", "email", "created")
    for _ in range(3):
        sim.create(a)
    old = GoldBatchWriter(paths, fold_share=ON_FINISH)
    for batch_id, tx in enumerate(sim.txs):
        old.apply(spark, df(spark, tx).toArrow(), batch_id + 5)
    floor = sim.lsn + 50            # a consistent point after the last step's commit
    (spark.createDataFrame([(*a, 3, floor, None)], GOLD_SCHEMA).write.format("delta")
     .mode("overwrite").option("txnAppId", REBUILD_APP_ID).option("txnVersion", floor)
     .option("userMetadata", metadata(operation="rebuild", floor=floor,
                                      commit_lsn=floor - 1, epoch=floor))
     .save(paths.gold))
    if not check:          # the steps' app id of every epoch the same
        monkeypatch.setattr(gold.apply, "step_app_id", lambda epoch: step_app_id(None))
    sim.create(a)
    rebuilt = gold_writer(spark, paths, fold_share=EVERY_BATCH)
    started_at = last_metadata(spark, paths.gold)["commit_lsn"]
    if not check:                   # the old steps folded: gold's watermark moved back
        assert started_at < floor - 1
        return
    assert started_at == floor - 1                  # the rebuild's
    rebuilt.apply(spark, df(spark, sim.txs[-1]).toArrow(), 0)
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth() == {a: 4}
    assert last_metadata(spark, paths.gold)["commit_lsn"] == sim.lsn


def test_a_batch_only_deltas_records_counts_as_applied_for_the_checkpoint_check(spark, paths):
    """The stream refuses to start when gold records a batch its checkpoint has not planned
    (F18, ``check_checkpoint``); a step waiting in _deltas is such a record."""
    sim, _ = busy_sim()
    writer = GoldBatchWriter(paths, fold_share=ON_FINISH)
    writer.apply(spark, df(spark, sim.txs[0]).toArrow(), 7)
    assert last_metadata(spark, paths.gold) is None
    assert applied_batch(spark, paths) == 7


def test_a_fold_waits_its_turn_then_runs_in_the_background_after_gold_maintenance(
        spark, paths):
    """A fold waits for its turn: the fold before it took ``s`` seconds, so the next is due
    ``s * (1 - share) / share`` after it (a quiet stream's ``SilverGoldWriter.idle`` asks too). It
    runs in the background, and never beside gold's maintenance (``paused``)."""
    from deltalake import DeltaTable

    now = [100.0]
    sim, _ = busy_sim()
    writer = GoldBatchWriter(paths, fold_share=0.5)
    writer.clock = FoldClock(0.5, now=lambda: now[0])
    step = writer.apply(spark, df(spark, sim.txs[0]).toArrow(), 0)   # the first fold starts
    assert not step.folded                         # not in the batch: beside it
    writer.wait_for_fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truths[0]
    writer.clock.folded(2.0)                       # as if it had taken 2 s: next at +2 s
    writer.apply(spark, df(spark, sim.txs[1]).toArrow(), 1)
    assert not writer.fold_if_due()
    writer.wait_for_fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truths[0]
    now[0] += 2.0
    version = DeltaTable(paths.gold).version()
    with writer.paused():                          # gold's maintenance runs
        assert writer.fold_if_due()
        folding = writer._folding
        folding.join(timeout=2.0)                  # a fold of a few keys takes ~0.03 s
        assert folding.is_alive() and DeltaTable(paths.gold).version() == version
    writer.wait_for_fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truths[1]
    assert DeltaTable(paths.gold).transaction_version(writer.folded_app) == \
        last_metadata(spark, paths.gold)["commit_lsn"]
    assert not writer.fold_if_due()                # nothing waits


def test_batches_beside_background_folds_end_exact_and_a_replay_is_skipped(spark, paths):
    """Every step through _deltas while folds run beside the batches (one due after each
    step): gold ends where one MERGE per batch would, and a batch replayed after the folds
    is skipped by the version gold records."""
    sim, _ = busy_sim()
    writer = GoldBatchWriter(paths, fold_share=0.999)    # a fold due at once, each time
    for batch_id, tx in enumerate(sim.txs):
        writer.apply(spark, df(spark, tx).toArrow(), batch_id)
    writer.fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()
    last = len(sim.txs) - 1
    assert last_metadata(spark, paths.gold)["batch_id"] == last
    replay = GoldBatchWriter(paths, fold_share=0.999)
    replay.apply(spark, df(spark, sim.txs[-1]).toArrow(), last)
    replay.fold()
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()


def test_a_batch_that_changes_no_count_still_records_its_watermark_and_transaction(
        spark, paths):
    """An archival move nets 0 on every key, so the MERGE of its batch changes no gold row,
    and delta-rs commits no such MERGE: gold must still record the batch (its watermark,
    which the dashboard and ``verify`` wait for, and its app transaction, which skips it on
    a replay)."""
    from deltalake import DeltaTable

    sim = Sim()
    ids = sim.create(("svc-a", "tpl-1", "email", "delivered"))
    writer = GoldBatchWriter(paths, fold_share=EVERY_BATCH)
    writer.apply(spark, df(spark, sim.rows).toArrow(), 0)
    version = DeltaTable(paths.gold).version()
    sim.archive(ids)
    moved = writer.apply(spark, df(spark, sim.txs[-1]).toArrow(), 1)
    assert (moved.applied_transactions, moved.merged_keys) == (1, 0)
    meta = last_metadata(spark, paths.gold)
    assert (meta["batch_id"], meta["commit_lsn"]) == (1, sim.lsn)
    gold = DeltaTable(paths.gold)
    assert gold.version() == version + 1
    assert gold.transaction_version(writer.folded_app) == sim.lsn
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()


def test_killed_after_pending_write_replay_is_a_no_op(spark, paths):
    sim, _ = busy_sim()
    a = ("svc-a", "tpl-1", "email", "created")
    sim.create(a, a, a)                       # a 3-row transaction, 2 rows in batch 0
    rows = sim.rows
    split = len(rows) - 1
    with pytest.raises(Crash):
        GoldBatchWriter(paths, fold_share=EVERY_BATCH,
                        switches=CrashAt("after_gold_pending")).apply(
            spark, df(spark, rows[:split]).toArrow(), 0)
    restarted = GoldBatchWriter(paths, fold_share=EVERY_BATCH)
    # Recomputing would add the carried 2 rows to the same 2 rows again (4 of 3: a stop);
    # the recorded batch id in _pending says batch 0 is done.
    assert restarted.apply(spark, df(spark, rows[:split]).toArrow(), 0).replayed
    restarted.apply(spark, df(spark, rows[split:]).toArrow(), 1)
    assert nonzero(gold_counts(spark, paths.gold)) == sim.truth()


def test_failure_path_truncate_stops_before_writing_anything(spark, paths):
    sim = Sim()
    a = ("svc-a", "tpl-1", "email", "created")
    sim.create(a)
    sim.truncate_live()
    with pytest.raises(GoldStopped, match="rebuild-gold"):
        GoldBatchWriter(paths, fold_share=EVERY_BATCH).apply(
            spark, df(spark, sim.rows).toArrow(), 0)
    assert gold_counts(spark, paths.gold) == {}
    assert last_metadata(spark, paths.gold) is None


# --- the stream ---------------------------------------------------------------------

def write_silver(spark, path, rows, files=1):
    df(spark, rows).repartition(files, "seq").write.format("delta").mode("append").save(path)


def test_stream_split_into_small_batches_is_exact(spark, tmp_path):
    sim, _ = busy_sim()
    silver = str(tmp_path / "silver" / "changes")
    gold = str(tmp_path / "gold" / "service_stats")
    ckpt = str(tmp_path / "checkpoints" / "gold")
    rows = sim.rows
    # Two silver commits that cut a transaction in half, each spread over several files;
    # one file per micro-batch splits transactions across batches too.
    cut = next(i for i, r in enumerate(rows) if r["tx_changes"] > 2 and r["seq"] == 1)
    write_silver(spark, silver, rows[:cut], files=3)
    write_silver(spark, silver, rows[cut:], files=3)
    run = run_gold(spark, silver, gold, ckpt, max_files_per_trigger=1)
    assert len(run) >= 3
    assert any(b.pending_transactions for b in run)
    assert nonzero(gold_counts(spark, gold)) == sim.truth()
    assert [b.commit_lsn for b in run if b.commit_lsn][-1] == sim.lsn
    props = spark.sql(f"DESCRIBE DETAIL delta.`{gold}`").first().properties
    assert props["delta.enableChangeDataFeed"] == "true"
    # Nothing new: a second run applies nothing and changes nothing.
    again = run_gold(spark, silver, gold, ckpt)
    assert sum(b.applied_transactions for b in again) == 0
    assert nonzero(gold_counts(spark, gold)) == sim.truth()


def test_stream_truncate_stops_loudly_then_a_seeded_rebuild_resumes_exactly(spark, tmp_path):
    sim = Sim()
    a = ("svc-a", "tpl-1", "email", "created")
    b = ("svc-b", "tpl-2", "sms", "created")
    ids = sim.create(a, a, b)
    sim.truncate_live()
    silver = str(tmp_path / "silver" / "changes")
    write_silver(spark, silver, sim.rows)
    gold = str(tmp_path / "gold" / "service_stats")
    with pytest.raises(GoldStopped, match="TRUNCATE of public.notifications"):
        run_gold(spark, silver, gold, str(tmp_path / "ck1"))
    # The rebuild: a new gold seeded with the source's counts at a consistent point just
    # after the truncate's commit (the source is empty then: commits below the point are in
    # the snapshot), a new checkpoint; later changes apply on top.
    shutil.rmtree(tmp_path / "gold")
    seed_at = sim.lsn + 1
    paths = GoldPaths.beside(gold)
    ensure_gold_tables(spark, paths)
    assert seed_gold(spark, gold, spark.createDataFrame([], "service_id string, "
                     "template_id string, notification_type string, "
                     "notification_status string, count bigint"), seed_at)
    new_ids = sim.create(b, b)
    sim.set_status(new_ids[:1], "sending")
    write_silver(spark, silver, sim.rows[len(ids) + 1:])      # rows after the truncate
    run_gold(spark, silver, gold, str(tmp_path / "ck2"))
    assert nonzero(gold_counts(spark, gold)) == sim.truth()


# --- F12 with a real kill: a subprocess dies inside the batch after the MERGE commit ------

CRASHING_GOLD = textwrap.dedent("""
    import sys
    from core.spark import get_or_create
    from core.switches import Switches
    from tests.tests_support import run_gold_over_silver
    silver, gold, ckpt, guard, fault, share = sys.argv[1:]
    off = () if guard == "on" else {"gold_txn"}
    run_gold_over_silver(get_or_create("lakecdc-gold-crash"), silver, gold, ckpt,
                         switches=Switches(fault, off), fold_share=float(share))
""")


@pytest.mark.parametrize("guard,share,fault", [
    ("on", EVERY_BATCH, "after_gold_merge:1"), ("off", EVERY_BATCH, "after_gold_merge:1"),
    ("on", ON_FINISH, "after_gold_merge:1"), ("on", 0.5, "after_gold_fold:1")],
    ids=["guard_on", "guard_off_negative_control", "in_deltas", "in_a_background_fold"])
@pytest.mark.long
def test_gold_killed_after_its_step_commits_before_checkpoint(spark, tmp_path, guard, share,
                                                              fault):
    """The process dies once batch 0's step is committed: MERGEd into gold, or (a large
    gold) appended to _deltas, or folded into gold by a fold in the background (which may
    end after the batch's checkpoint)."""
    from deltalake import DeltaTable

    sim, _ = busy_sim()
    silver = str(tmp_path / "silver" / "changes")
    gold = str(tmp_path / "gold" / "service_stats")
    ckpt = str(tmp_path / "checkpoints" / "gold")
    write_silver(spark, silver, sim.rows, files=2)
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_GOLD, silver, gold, ckpt, guard,
                             fault, str(share)], start_new_session=True,
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        try:                                   # the JVM child of the killed driver, if any
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 137, err.decode()[-2000:]
    if share == ON_FINISH:
        assert gold_counts(spark, gold) == {}                       # the step is in _deltas
        assert DeltaTable(GoldPaths.beside(gold).deltas).to_pyarrow_table().num_rows > 0
    else:
        assert nonzero(gold_counts(spark, gold)) == sim.truth()     # the MERGE did commit
    if fault.startswith("after_gold_merge"):      # a fold may end after the checkpoint
        assert not os.path.exists(os.path.join(ckpt, "commits", "0"))
    run_gold(spark, silver, gold, ckpt,                                   # batch 0 again
             switches=Switches(off=() if guard == "on" else {"gold_txn"}))
    got = nonzero(gold_counts(spark, gold))
    if guard == "on":
        assert got == sim.truth()
    else:
        assert got == {k: 2 * v for k, v in sim.truth().items()}
