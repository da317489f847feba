"""gold → Postgres service_stats: absolute counts, version guard, atomicity, F13 and F20,
and a batch's step pushed ahead of gold's MERGE (fenced on the dashboard's watermark).

Gold is written by the real batch function (``GoldBatchWriter``, its MERGE with change
data feed) from ``Sim`` silver rows; the dashboard is compared with ``Sim.truth()``, the
model's own GROUP BY, not with gold.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from tests.integration.test_gold_apply import Sim, df   # the source model and its silver rows

from bronze.slot import plugin_options
from gold.apply import GoldBatchWriter
from gold.gold_tables import GoldPaths, ensure_gold_tables
from core.errors import UserError
from core.storage import gold_key
from core.switches import Switches
from gold.feeder import DashboardFeeder
from gold.push import ensure_dashboard_tables, push_ahead, push_once
from gold.view import open_gold
from tests.tests_support import ROOT, error_line, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.spark]

A = ("svc-a", "tpl-1", "email", "created")
B = ("svc-b", "tpl-2", "sms", "created")


def dashboard(conn) -> dict[tuple, tuple]:
    rows = conn.execute("SELECT service_id, template_id, notification_type, "
                        "notification_status, count, source_commit_lsn, pushed_at "
                        "FROM service_stats").fetchall()
    return {tuple(r[:4]): tuple(r[4:]) for r in rows}


def counts(conn) -> dict[tuple, int]:
    return {k: v[0] for k, v in dashboard(conn).items()}


def progress(conn, gold_path):
    return conn.execute("SELECT gold_version, source_commit_lsn FROM lakecdc_push_progress "
                        "WHERE gold_table = %s", [gold_key(gold_path)]).fetchone()


def nonzero(d: dict) -> dict:
    return {k: v for k, v in d.items() if v}


@pytest.fixture
def gold(spark, tmp_path):
    paths = GoldPaths.beside(str(tmp_path / "gold" / "service_stats"))
    ensure_gold_tables(spark, paths)
    return paths


@pytest.fixture
def dash(source_db):
    with source_db.connect() as conn:
        ensure_dashboard_tables(conn)
        ensure_dashboard_tables(conn)          # idempotent
        yield conn


def apply(spark, paths, sim, start, batch_id):
    """Apply the sim's transactions from index ``start`` on as batch ``batch_id``, its step
    MERGEd into gold with the batch (a fold share of 1, as a small gold does)."""
    GoldBatchWriter(paths, fold_share=1.0).apply(
        spark, df(spark, [r for tx in sim.txs[start:] for r in tx]).toArrow(), batch_id)
    return len(sim.txs)


class Crash(Exception):
    pass


class CrashAt(Switches):
    def __init__(self, point):
        super().__init__()
        self.point = point

    def hit(self, name):
        if name == self.point:
            raise Crash(name)


def test_push_is_incremental_absolute_and_a_replay_is_a_no_op(spark, gold, dash, source_db):
    sim = Sim()
    ids = sim.create(A, A, A, B)
    sim.set_status(ids[:2], "sending")
    done = apply(spark, gold, sim, 0, 0)
    first_truth = sim.truth()

    first = push_once(gold.gold, source_db.dsn)
    assert first.pushed and first.full and first.upserted == len(first_truth)
    assert counts(dash) == first_truth
    assert progress(dash, gold.gold) == (first.gold_version, sim.lsn)
    before = dashboard(dash)

    replay = push_once(gold.gold, source_db.dsn)                 # F13: pushed already
    assert not replay.pushed
    assert dashboard(dash) == before                             # not even pushed_at moved

    sim.set_status(ids[2:3], "sending")                          # svc-a created: 1 -> 0
    sim.archive(ids[:1])                                         # count-neutral
    sim.create(B)
    apply(spark, gold, sim, done, 1)
    second = push_once(gold.gold, source_db.dsn)
    changed = {k for k in {*first_truth, *sim.truth()}
               if first_truth.get(k, 0) != sim.truth().get(k, 0)}
    assert second.pushed and not second.full and second.upserted == len(changed)
    assert nonzero(counts(dash)) == sim.truth()
    assert counts(dash)[A] == 0                                  # the key stays, at 0
    after = dashboard(dash)
    for key in set(after) - changed:                             # untouched rows untouched
        assert after[key] == before[key]
    assert progress(dash, gold.gold) == (second.gold_version, sim.lsn)


def test_a_push_behind_a_vacuumed_change_feed_pushes_every_row_exactly(
        spark, gold, dash, source_db):
    """Maintenance vacuums gold's change-data files once they are past the retention (0
    hours here) and an hour old (``UNREFERENCED_HOURS``: no commit's table state names
    them, as it names no file a writer has yet to commit): a dashboard that fell that far
    behind gold is brought up to it by a full push instead of failing on the missing
    files."""
    from core.maintenance import UNREFERENCED_HOURS, maintain_table

    sim = Sim()
    ids = sim.create(A, A, B)
    done = apply(spark, gold, sim, 0, 0)
    assert push_once(gold.gold, source_db.dsn).pushed
    sim.set_status(ids[:2], "delivered")
    sim.create(B)
    apply(spark, gold, sim, done, 1)
    aged = time.time() - UNREFERENCED_HOURS * 3600 - 60
    for change_data in Path(gold.gold, "_change_data").rglob("*.parquet"):
        os.utime(change_data, (aged, aged))
    assert maintain_table("gold", gold.gold, retention_hours=0).vacuumed > 0
    pushed = push_once(gold.gold, source_db.dsn)
    assert pushed.pushed and pushed.full
    assert nonzero(counts(dash)) == sim.truth()


def test_a_stale_push_of_an_older_gold_version_changes_nothing(spark, gold, dash, source_db):
    sim = Sim()
    ids = sim.create(A, B)
    done = apply(spark, gold, sim, 0, 0)
    old_version = open_gold(gold.gold).version()
    sim.set_status(ids, "delivered")
    apply(spark, gold, sim, done, 1)
    assert push_once(gold.gold, source_db.dsn).pushed
    latest = dashboard(dash)
    stale = push_once(gold.gold, source_db.dsn, version=old_version)
    assert not stale.pushed
    assert dashboard(dash) == latest and nonzero(counts(dash)) == sim.truth()


def planned_step(spark, paths, sim, start, batch_id):
    """The step batch ``batch_id`` (the sim's transactions from ``start``) plans, taken
    right before its MERGE, which then does not happen: gold as a running stream's batch
    leaves it while the dashboard is pushed ahead."""
    steps = []

    def stop_before_merge(step):
        steps.append(step)
        raise Crash("before the MERGE")

    with pytest.raises(Crash):
        GoldBatchWriter(paths, fold_share=1.0).apply(
            spark, df(spark, [r for tx in sim.txs[start:] for r in tx]).toArrow(), batch_id,
            planned=stop_before_merge)
    return steps[0]


def fenced(fence: bool) -> Switches:
    """No fault point; the ``ahead_fence`` guard on, or off (negative controls)."""
    return Switches(off=() if fence else {"ahead_fence"})


def ahead(dash, paths, step, fence=True) -> bool:
    return push_ahead(dash, gold_key(paths.gold), open_gold(paths.gold).metadata().id, step,
                      switches=fenced(fence))


def test_a_step_pushed_ahead_of_gold_is_added_once_and_gold_catching_up_changes_nothing(
        spark, gold, dash, source_db):
    sim = Sim()
    ids = sim.create(A, A, B)
    done = apply(spark, gold, sim, 0, 0)
    pushed = push_once(gold.gold, source_db.dsn)
    sim.set_status(ids[:2], "sending")
    sim.create(B)
    step = planned_step(spark, gold, sim, done, 1)
    assert (step.after_lsn, step.commit_lsn) == (sim.txs[done - 1][0]["commit_lsn"], sim.lsn)

    assert ahead(dash, gold, step)
    assert nonzero(counts(dash)) == sim.truth()
    assert progress(dash, gold.gold) == (pushed.gold_version, sim.lsn)   # gold not there yet
    assert not ahead(dash, gold, step)             # the batch replayed: the fence holds
    assert nonzero(counts(dash)) == sim.truth()

    apply(spark, gold, sim, done, 1)               # the replay's MERGE
    caught_up = push_once(gold.gold, source_db.dsn)
    assert not caught_up.pushed                    # step 2b: the version recorded, no rows
    assert progress(dash, gold.gold) == (caught_up.gold_version, sim.lsn)
    assert nonzero(counts(dash)) == sim.truth()


def test_negative_control_without_the_fence_a_replayed_step_counts_twice(spark, gold, dash,
                                                                         source_db):
    sim = Sim()
    sim.create(A)
    done = apply(spark, gold, sim, 0, 0)
    push_once(gold.gold, source_db.dsn)
    sim.create(A, B)
    step = planned_step(spark, gold, sim, done, 1)
    assert ahead(dash, gold, step, fence=False)
    assert ahead(dash, gold, step, fence=False)
    assert counts(dash) == {A: 3, B: 2} != sim.truth()


def test_a_push_of_a_gold_version_behind_the_dashboard_never_overwrites_it(spark, gold, dash,
                                                                           source_db):
    """Two steps ahead, then a push of gold at the first: the dashboard already holds gold
    further on, and the counts at that version must not take keys back. Without the fence
    (the ``ahead_fence`` guard off) they do."""
    for fence in (True, False):
        dash.execute("DELETE FROM service_stats")
        dash.execute("DELETE FROM lakecdc_push_progress")
        shutil.rmtree(gold.gold, ignore_errors=True)
        shutil.rmtree(gold.pending, ignore_errors=True)
        ensure_gold_tables(spark, gold)
        sim = Sim()
        ids = sim.create(A, A)
        done = apply(spark, gold, sim, 0, 0)
        push_once(gold.gold, source_db.dsn)
        sim.set_status(ids[:1], "sending")                   # batch 1
        first = planned_step(spark, gold, sim, done, 1)
        assert ahead(dash, gold, first)
        done = apply(spark, gold, sim, done, 1)
        sim.set_status(ids[1:], "sending")                   # batch 2: A goes 1 -> 0
        second = planned_step(spark, gold, sim, done, 2)
        assert ahead(dash, gold, second)
        assert nonzero(counts(dash)) == sim.truth()
        recorded = progress(dash, gold.gold)[0]
        stale = push_once(gold.gold, source_db.dsn, switches=fenced(fence))   # gold at batch 1
        if fence:
            assert not stale.pushed
            assert nonzero(counts(dash)) == sim.truth()
            # The dashboard is past batch 1's watermark: its version is not recorded (2b).
            assert progress(dash, gold.gold) == (recorded, sim.lsn) != (stale.gold_version,
                                                                        sim.lsn)
        else:
            assert counts(dash)[A] == 1 != sim.truth().get(A, 0)   # taken back
        apply(spark, gold, sim, done, 2)
        push_once(gold.gold, source_db.dsn, switches=fenced(fence))
        assert nonzero(counts(dash)) == sim.truth()          # either way, gold catches up


def test_failure_path_push_dying_before_commit_leaves_nothing_behind(spark, gold, dash,
                                                                    source_db):
    sim = Sim()
    sim.create(A, B, B)
    apply(spark, gold, sim, 0, 0)
    with pytest.raises(Crash):
        push_once(gold.gold, source_db.dsn, switches=CrashAt("after_push_stage"))
    assert counts(dash) == {}
    assert progress(dash, gold.gold) is None
    assert push_once(gold.gold, source_db.dsn).pushed
    assert counts(dash) == sim.truth()


def test_killed_right_after_the_push_commit_the_replay_changes_nothing(spark, gold, dash,
                                                                     source_db):
    """F13: the process dies after the push's COMMIT, before it can report; the rerun
    finds its version recorded and writes nothing, not even ``pushed_at``."""
    sim = Sim()
    sim.create(A, B, B)
    apply(spark, gold, sim, 0, 0)
    with pytest.raises(Crash):
        push_once(gold.gold, source_db.dsn, switches=CrashAt("after_push_commit"))
    assert counts(dash) == sim.truth()
    committed = dash.execute("SELECT gold_version, pushed_at FROM lakecdc_push_progress "
                             "WHERE gold_table = %s", [gold_key(gold.gold)]).fetchone()
    assert not push_once(gold.gold, source_db.dsn).pushed
    assert counts(dash) == sim.truth()
    assert dash.execute("SELECT gold_version, pushed_at FROM lakecdc_push_progress "
                        "WHERE gold_table = %s", [gold_key(gold.gold)]).fetchone() == committed


def test_a_rebuilt_gold_is_pushed_in_full_and_vanished_keys_are_removed(spark, gold, dash,
                                                                        source_db):
    sim = Sim()
    sim.create(A, B)
    apply(spark, gold, sim, 0, 0)
    push_once(gold.gold, source_db.dsn)
    shutil.rmtree(gold.gold)                  # a new table (new Delta id) at the same path
    shutil.rmtree(gold.pending)
    ensure_gold_tables(spark, gold)
    rebuilt = Sim(first_lsn=sim.lsn)
    rebuilt.create(B, B)
    apply(spark, gold, rebuilt, 0, 0)
    result = push_once(gold.gold, source_db.dsn)
    assert result.full and result.deleted == 1
    assert counts(dash) == rebuilt.truth() == {B: 2}


def _slot_changes(conn, slot, options) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, VARIADIC %s)",
        [slot, options]).fetchall()]


def test_push_into_the_source_database_never_reaches_the_slot(spark, gold, dash, source_db):
    """F20: the shipper's add-tables keeps the push's writes out of the change stream."""
    sim = Sim()
    sim.create(A, B)
    apply(spark, gold, sim, 0, 0)
    slot = source_db.slot + "_f20"
    dash.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", [slot])
    try:
        dash.execute("INSERT INTO notifications (id, service_id, template_id, "
                     "notification_type, notification_status, key_type, created_at) VALUES "
                     "(gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'sms', "
                     "'created', 'normal', now())")
        assert push_once(gold.gold, source_db.dsn).pushed
        captured = _slot_changes(dash, slot, plugin_options(("public.notifications",
                                                             "public.notification_history")))
        assert any('"table":"notifications"' in c for c in captured)    # the slot works
        assert not any("service_stats" in c or "lakecdc_push" in c for c in captured)
        # Negative control: without add-tables the push's rows are in the stream.
        everything = _slot_changes(dash, slot, ["format-version", "2"])
        assert any('"table":"service_stats"' in c for c in everything)
    finally:
        dash.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def test_failure_path_missing_gold_and_bad_dsn_are_user_errors(tmp_path, gold, source_db):
    with pytest.raises(UserError, match="no gold table"):
        push_once(str(tmp_path / "nowhere"), source_db.dsn)
    with pytest.raises(UserError, match="dashboard"):
        push_once(gold.gold, "postgresql://nobody:secret@127.0.0.1:1/none")
    with pytest.raises(UserError) as info:
        push_once(gold.gold, "postgresql://nobody:secret@127.0.0.1:1/none")
    assert "secret" not in str(info.value)
    with psycopg.connect(source_db.dsn) as conn:   # nothing was created by the failures
        assert conn.execute("SELECT to_regclass('service_stats')").fetchone()[0] is None


@pytest.mark.parametrize("sole", [True, False], ids=["guarded", "negative_control"])
def test_a_second_pipeline_is_refused_the_dashboard_until_it_takes_it_over(
        spark, gold, dash, source_db, tmp_path, sole):
    """Two pipelines (two lakehouses) pointed at one dashboard database. The second one's
    push - here the CLI's, exit 2 and one sentence - writes nothing, and the first keeps
    pushing; ``push --once --take-over`` replaces the first's counts with the second's, and
    from then on the first is the one refused. Without the guard (``sole_dashboard`` off)
    the second's first push, a full one, deletes the first's keys and overwrites the one
    they share."""
    C = ("svc-c", "tpl-3", "letter", "created")
    first = Sim()
    ids = first.create(A, A, B)
    done = apply(spark, gold, first, 0, 0)
    assert push_once(gold.gold, source_db.dsn).pushed
    other = GoldPaths.beside(str(tmp_path / "other" / "gold" / "service_stats"))
    ensure_gold_tables(spark, other)
    second = Sim()
    second.create(B, B, C, C)                          # B: 1 in the first, 2 here
    apply(spark, other, second, 0, 0)
    if not sole:
        push_once(other.gold, source_db.dsn, switches=Switches(off={"sole_dashboard"}))
        assert nonzero(counts(dash)) == second.truth() != first.truth()   # the first's: gone
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECDC_")}
    env.update(LAKECDC_SOURCE_DSN=source_db.dsn, LAKECDC_LAKEHOUSE=str(tmp_path / "other"),
               PYTHONPATH=str(ROOT))
    before = dashboard(dash)
    error_line(run_cli(["push", "--once"], env), "another pipeline", gold_key(gold.gold),
               "--take-over")
    assert dashboard(dash) == before and progress(dash, other.gold) is None
    first.set_status(ids[:1], "sending")                 # the first pipeline goes on
    apply(spark, gold, first, done, 1)
    assert push_once(gold.gold, source_db.dsn).pushed
    assert nonzero(counts(dash)) == first.truth()

    took = run_cli(["push", "--once", "--take-over"], env)
    assert took.returncode == 0, took.stderr[-2000:]
    assert counts(dash) == second.truth()                # a full push: the first's keys gone
    assert progress(dash, gold.gold) is None and progress(dash, other.gold) is not None
    with pytest.raises(UserError, match="another pipeline"):
        push_once(gold.gold, source_db.dsn)
    assert counts(dash) == second.truth()


def test_a_step_ahead_across_a_gold_version_that_takes_a_key_there_and_back_is_caught_up(
        spark, gold, dash, source_db):
    """A step ahead from gold's first version across its second: ``sending`` goes 0 -> 1
    (the second version's watermark) -> 0 inside the step, so the step does not write it.
    The push of the second version finds the dashboard past it and writes nothing (step
    2b); then ``sending`` goes back to 1 in gold's third version, whose feed does not name
    it (1 at the second version, 1 at the third). Had 2b recorded the second version, the
    next push would read the feed, and the keys steps wrote (3b), from there, and leave
    ``sending`` at 0 (found 2026-11-30 by the F13b kill test, 3 runs in 15)."""
    sim = Sim()
    ids = sim.create(A, A)
    done = apply(spark, gold, sim, 0, 0)
    synced = push_once(gold.gold, source_db.dsn)
    sim.set_status(ids[:1], "sending")                    # sending 0 -> 1
    sim.set_status(ids[:1], "delivered")                  # sending 1 -> 0
    assert ahead(dash, gold, planned_step(spark, gold, sim, done, 1))
    assert nonzero(counts(dash)) == sim.truth()
    GoldBatchWriter(gold, fold_share=1.0).apply(          # gold: the first of the two only
        spark, df(spark, sim.txs[done]).toArrow(), 1)
    passed = push_once(gold.gold, source_db.dsn)
    assert not passed.pushed
    assert progress(dash, gold.gold) == (synced.gold_version, sim.lsn)
    sim.set_status(ids[1:], "sending")                    # sending 0 -> 1 again
    apply(spark, gold, sim, done + 1, 2)                  # the last two, one gold version
    assert push_once(gold.gold, source_db.dsn).pushed
    assert nonzero(counts(dash)) == sim.truth()


@pytest.mark.parametrize("history", [None, 1], ids=["recent", "recorded_version_not_read"])
def test_a_push_past_a_dashboard_moved_ahead_refreshes_every_key_a_step_ahead_wrote(
        spark, gold, dash, source_db, monkeypatch, history):
    """A step ahead moves a row from ``created`` to ``sending`` on the dashboard; gold then
    merges that change and the next (``sending`` to ``delivered``) in one version. The feed
    from the version the dashboard recorded names ``created`` and ``delivered`` but not
    ``sending``, whose net change there is 0, while the dashboard holds it at 1 from the
    step ahead. The push refreshes every key a step ahead wrote since gold's recorded
    watermark (step 3b): without it, ``sending`` stays at 1. ``recorded_version_not_read``:
    the recorded version is older than the gold commits a push reads (its watermark
    unknown), so every key the dashboard holds is refreshed."""
    if history is not None:
        monkeypatch.setattr("gold.view.HISTORY", history)
    sim = Sim()
    ids = sim.create(A, A)
    done = apply(spark, gold, sim, 0, 0)
    push_once(gold.gold, source_db.dsn)
    sim.set_status(ids[:1], "sending")
    assert ahead(dash, gold, planned_step(spark, gold, sim, done, 1))
    assert nonzero(counts(dash)) == sim.truth()
    sim.set_status(ids[:1], "delivered")
    apply(spark, gold, sim, done, 1)              # both transactions, one version of gold
    assert push_once(gold.gold, source_db.dsn).pushed
    assert nonzero(counts(dash)) == sim.truth()


@contextmanager
def feeding(gold_path: str, dsn: str):
    """A dashboard feeder (``gold.feeder``) running in a thread of its own for the block."""
    feeder = DashboardFeeder(gold_path, dsn)
    thread = threading.Thread(target=feeder.run, daemon=True)
    thread.start()
    try:
        yield feeder
    finally:
        feeder.close()
        thread.join(60)
    assert not thread.is_alive()


def test_a_step_that_cannot_go_ahead_says_why_once_and_again_after_one_went(
        spark, gold, dash, source_db, caplog):
    """A first start's steps come before gold exists, about forty of them; a dashboard that
    is down fails every batch's step. Each reason is said once while it lasts, and again
    once a step went through in between."""
    sim = Sim()
    sim.create(A, B)
    done = apply(spark, gold, sim, 0, 0)
    push_once(gold.gold, source_db.dsn)
    sim.create(B)
    step = planned_step(spark, gold, sim, done, 1)

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno == logging.WARNING
                and "was not pushed ahead" in r.getMessage()]

    caplog.set_level(logging.DEBUG, logger="lakecdc.push")
    with feeding(str(gold.gold) + "_missing", source_db.dsn) as no_gold:
        assert not any(no_gold.offer(step, "stream").result(60).taken for _ in range(40))
    assert len(said()) == 1 and "no gold table" in said()[0].getMessage(), said()

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    down = f"host=127.0.0.1 port={closed.getsockname()[1]} dbname=x user=x connect_timeout=2"
    with feeding(gold.gold, down) as feeder:
        assert not any(feeder.offer(step, "stream").result(60).taken for _ in range(10))
        feeder.dsn = source_db.dsn
        assert feeder.offer(step, "stream").result(60).taken   # the next failure: said again
        feeder.dsn = down
        feeder._disconnect()                    # idle between steps: the dashboard lost
        assert not any(feeder.offer(step, "stream").result(60).taken for _ in range(10))
    closed.close()
    assert len(said()) == 3, [r.getMessage() for r in said()]


def test_the_feeder_adds_steps_in_order_catches_up_between_them_and_stops_on_a_refusal(
        spark, gold, dash, source_db, tmp_path):
    """The dashboard's one writer (``gold.feeder``): the steps handed to it are added in
    order, each under the fence (a replayed one is not taken); a catch-up runs only once no
    step waits, and brings the dashboard to gold (step 2b where it is there already). A
    catch-up refused with a sentence (the dashboard holds another pipeline's counts) ends
    the feeder with it, and a step handed on afterwards is answered not taken."""
    sim = Sim()
    ids = sim.create(A, A, B)
    done = apply(spark, gold, sim, 0, 0)
    push_once(gold.gold, source_db.dsn)
    sim.set_status(ids[:2], "sending")
    step = planned_step(spark, gold, sim, done, 1)
    caught_up = threading.Event()
    results = []

    def heard(result) -> None:
        results.append(result)
        caught_up.set()
    feeder = DashboardFeeder(gold.gold, source_db.dsn, on_result=heard)
    first, replayed = feeder.offer(step, "stream"), feeder.offer(step, "stream")
    feeder.catch_up()
    thread = threading.Thread(target=feeder.run, daemon=True)
    thread.start()
    assert first.result(60).taken and not replayed.result(60).taken
    assert caught_up.wait(60)
    assert [r.pushed for r in results] == [False]      # gold behind the dashboard: 2b
    assert nonzero(counts(dash)) == sim.truth()
    caught_up.clear()
    apply(spark, gold, sim, done, 1)                   # gold takes the step too
    feeder.catch_up()
    assert caught_up.wait(60)
    assert progress(dash, gold.gold) == (results[-1].gold_version, sim.lsn)
    assert nonzero(counts(dash)) == sim.truth()
    feeder.close()
    thread.join(60)
    assert not thread.is_alive()
    assert not feeder.offer(step, "stream").result(0).taken

    other = GoldPaths.beside(str(tmp_path / "other" / "gold" / "service_stats"))
    ensure_gold_tables(spark, other)
    second = Sim()
    second.create(B)
    apply(spark, other, second, 0, 0)
    refused = DashboardFeeder(other.gold, source_db.dsn)
    refused.catch_up()
    with pytest.raises(UserError, match="another pipeline"):
        refused.run()
    assert not refused.offer(step, "stream").result(0).taken
    assert nonzero(counts(dash)) == sim.truth()
