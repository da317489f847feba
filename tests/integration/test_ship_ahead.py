"""A shipper batch's step on the dashboard as soon as bronze holds it, before the stream has
read it (``gold.ahead``; docs/gold.md, "Ahead of the stream"): the real shipper, wal2json
and dashboard, compared with the source's own GROUP BY after every batch; the stream and
the push from gold then change nothing. The fence is what keeps a step from being added
where the dashboard does not stand: with it off (the ``ahead_fence`` guard), a batch the
dashboard lacks is skipped over and the counts go wrong. In a catch-up the dashboard
follows the shipper while the stream waits, from ``lakecdc run``'s start on."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from contextlib import contextmanager

import psycopg
import pytest

from core.storage import gold_key
from gold.ahead import ShipAhead
from pipelines.run.behind import ShipperBehind
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.integration.workload import mixed
from tests.truth import _nonzero, check_gold, dashboard_counts, source_truth

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def started(config, spark, dsn: str) -> tuple[Pipeline, Counter]:
    """Set up on a populated source, one ``run --once``: the dashboard exact at a
    watermark. Returns the pipeline and the history rows purged so far."""
    mixed(dsn, seed=1)
    setup(config)
    purged = mixed(dsn, seed=2)
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    pipeline.run_once()
    check_gold(config.lakehouse, dsn, dsn, purged)
    return pipeline, purged


def dashboard_lsn(config, pipeline: Pipeline) -> int:
    with psycopg.connect(config.dashboard) as conn:
        return conn.execute("SELECT source_commit_lsn FROM lakecdc_push_progress WHERE "
                            "gold_table = %s", [gold_key(pipeline.where.gold)]).fetchone()[0]


@contextmanager
def steps_ahead(pipeline: Pipeline):
    """``lakecdc run``'s steps ahead of the stream (``gold.ahead``), added by the
    pipeline's dashboard feeder running in a thread of its own for the block (without a
    catch-up from gold: the stream is not running)."""
    feeder = pipeline.dashboard_feeder()
    thread = threading.Thread(target=feeder.run, daemon=True)
    thread.start()
    steps = ShipAhead(feeder, pipeline.config.counted)
    try:
        yield steps
    finally:
        steps.close()
        feeder.close()
        thread.join(60)
    assert not thread.is_alive()


def ship(shipper, pipeline: Pipeline) -> list:
    """Drain the slot; the batches that stored changes, as ``on_ship`` heard of them."""
    batches: list = []

    def heard(result, progress):
        if result.commit_lsn is not None:
            batches.append(result)
    pipeline.on_ship.append(heard)
    try:
        shipper.run(once=True)
    finally:
        pipeline.on_ship.remove(heard)
    return batches


def dashboard_exact_at(config, pipeline: Pipeline, dsn: str, purged: Counter,
                       lsn: int) -> None:
    """The dashboard equals the source's own GROUP BY, at watermark ``lsn``."""
    assert _nonzero(dashboard_counts(dsn)) == _nonzero(source_truth(dsn, purged))
    assert dashboard_lsn(config, pipeline) == lsn


def stream_changes_nothing(config, pipeline: Pipeline, dsn: str, purged: Counter) -> None:
    """The stream's own steps find the dashboard past them; gold catches up to it."""
    pipeline.stream(once=True)
    assert not pipeline.push(once=True).pushed
    check_gold(config.lakehouse, dsn, dsn, purged)


def test_each_shipper_batch_reaches_the_dashboard_before_the_stream_reads_it(
        source_db, config, spark):
    """From a shipper's first batch on, as on a start over a backlog: what bronze held
    before it is bronze's progress, which the dashboard's watermark is, and the parse
    knows the captured set's tables without the stream."""
    pipeline, purged = started(config, spark, source_db.dsn)
    for shippers in (1, 2):             # the second: a restarted shipper's first batch
        with steps_ahead(pipeline) as steps:
            shipper = pipeline.shipper(steps)
            for seed in (shippers * 10, shippers * 10 + 1):
                purged += mixed(source_db.dsn, seed=seed)
                batches = ship(shipper, pipeline)
                assert batches and all(b.ahead_seconds > 0 for b in batches)
                dashboard_exact_at(config, pipeline, source_db.dsn, purged,
                                   batches[-1].commit_lsn)
    stream_changes_nothing(config, pipeline, source_db.dsn, purged)


@pytest.mark.parametrize("fence", [True, False], ids=["fenced", "negative-control"])
def test_a_batch_the_dashboard_lacks_is_never_skipped_over(source_db, config, spark, fence):
    if not fence:
        config = config.with_(disabled_guards=frozenset({"ahead_fence"}))
    pipeline, purged = started(config, spark, source_db.dsn)
    before = _nonzero(source_truth(source_db.dsn, purged))
    purged += mixed(source_db.dsn, seed=3)
    ship(pipeline.shipper(), pipeline)        # `lakecdc ship` alone: bronze moves, not the
    purged += mixed(source_db.dsn, seed=4)    # dashboard
    with steps_ahead(pipeline) as steps:
        batches = ship(pipeline.shipper(steps), pipeline)
    if fence:
        assert not any(b.ahead_seconds for b in batches)
        assert _nonzero(dashboard_counts(source_db.dsn)) == before
    else:
        # Without the fence the batch's step is added on a dashboard that lacks the
        # batch before it: it then claims the source's newest commit with wrong counts.
        assert any(b.ahead_seconds for b in batches)
        assert dashboard_lsn(config, pipeline) == batches[-1].commit_lsn
        assert _nonzero(dashboard_counts(source_db.dsn)) != _nonzero(
            source_truth(source_db.dsn, purged))


class Recorded(ShipperBehind):
    def __init__(self) -> None:
        super().__init__(threading.Event())
        self.calls: list[bool] = []

    def set(self, behind: bool) -> None:
        self.calls.append(behind)
        super().set(behind)


def test_in_a_catch_up_the_dashboard_follows_the_shipper_which_peeks_on_meanwhile(
        source_db, config, spark):
    """Full peeks (a small bound here) while the dashboard follows: the shipper hands each
    batch on and peeks on while its step is pushed, and the stream is held meanwhile
    (``pipelines.run.behind``); the dashboard ends exact at bronze's end."""
    config = config.with_(upto_nchanges=40)
    pipeline, purged = started(config, spark, source_db.dsn)
    behind = Recorded()
    with steps_ahead(pipeline) as steps:
        shipper = pipeline.shipper(steps, behind)
        for seed in (3, 4):
            behind.calls.clear()
            purged += mixed(source_db.dsn, seed=seed)
            batches = ship(shipper, pipeline)
            # Each full batch is handed on, not waited for, and the stream held, until a
            # peek is not full: from the shipper's first batch on.
            assert sum(b.full for b in batches) >= 3
            assert not any(b.ahead_seconds for b in batches if b.full)
            assert behind.calls[0] is True and behind.calls[-1] is False
            steps.drain()
            dashboard_exact_at(config, pipeline, source_db.dsn, purged,
                               batches[-1].commit_lsn)
    stream_changes_nothing(config, pipeline, source_db.dsn, purged)


def test_run_started_on_a_backlog_starts_the_stream_once_the_shipper_caught_up(
        source_db, config, spark, monkeypatch):
    """``lakecdc run`` started on a backlog (full peeks: a small bound here) holds the
    stream's start while the dashboard follows the shipper (``pipelines.run.behind``): the
    stream starts after the shipper's first peek that was not full, not beside the
    catch-up. Without the hold it starts before the shipper's first batch."""
    config = config.with_(upto_nchanges=40)
    pipeline, purged = started(config, spark, source_db.dsn)
    purged += mixed(source_db.dsn, seed=3)
    # The hold's bound, far above this catch-up's seconds on a slow machine.
    monkeypatch.setattr("pipelines.run.pipeline.ShipperBehind",
                        functools.partial(ShipperBehind, hold_s=600.0))
    fulls: list[bool] = []
    pipeline.on_ship.append(lambda result, progress: fulls.append(result.full))
    at_start: list[list[bool]] = []
    start_stream = pipeline.start_stream

    def recorded(*args, **kwargs):
        at_start.append(list(fulls))
        return start_stream(*args, **kwargs)
    monkeypatch.setattr(pipeline, "start_stream", recorded)
    stop = threading.Event()
    runner = threading.Thread(target=pipeline.run_continuous, args=(stop,))
    runner.start()
    try:
        assert pipeline.started.wait(300)
    finally:
        stop.set()
        runner.join(timeout=300)
    assert not runner.is_alive()
    [shipped] = at_start
    assert sum(shipped) >= 3 and shipped[-1] is False, shipped
    assert _nonzero(dashboard_counts(source_db.dsn)) == _nonzero(
        source_truth(source_db.dsn, purged))


WIDE_ROWS = """
INSERT INTO notifications (id, service_id, template_id, notification_type,
                           notification_status, key_type, created_at, personalisation)
SELECT gen_random_uuid(), md5('wide-service')::uuid, md5('wide-template')::uuid, 'letter',
       'created', 'normal', now(), repeat('{"address": "1 Some Street"}', 64)
FROM generate_series(1, 10)"""


@pytest.mark.parametrize("grown", [True, False], ids=["peeks-grown-to-the-width", "full-peeks"])
def test_a_catch_up_of_wide_rows_is_followed_from_its_first_batch(source_db, config, spark,
                                                                  monkeypatch, grown):
    """Rows so wide that a peek of the shipper's bound holds more than a batch keeps
    (``bronze.shipped.KEPT_BYTES``, small here): a catch-up's first peek asks for
    ``FIRST_FOLLOWED_PEEK`` changes, and each next one for no more than the rows' width
    keeps, so every batch's step goes ahead and the stream is held from the first batch to
    the last. Peeks at the full bound (``full-peeks``, the negative control) hold too much:
    the first batch's step is left to the stream, which is released at once."""
    monkeypatch.setattr("bronze.shipped.KEPT_BYTES", 64 << 10)
    monkeypatch.setattr("bronze.shipped.NARROWEST_PEEK", 10)
    first = 20 if grown else 400
    monkeypatch.setattr("bronze.shipped.FIRST_FOLLOWED_PEEK", first)
    monkeypatch.setattr("bronze.ship.FIRST_FOLLOWED_PEEK", first)
    config = config.with_(upto_nchanges=400)
    pipeline, purged = started(config, spark, source_db.dsn)
    behind = Recorded()
    with steps_ahead(pipeline) as steps:
        shipper = pipeline.shipper(steps, behind)
        shipper.run(once=True)          # the first peek after nothing waited asks for `first`
        with psycopg.connect(source_db.dsn, autocommit=True) as conn:
            for _ in range(30):                 # 30 transactions of 10 rows of 2 KB
                conn.execute(WIDE_ROWS)
        behind.calls.clear()
        batches = ship(shipper, pipeline)
        steps.drain()
    if grown:
        assert sum(b.full for b in batches) >= 3
        # Held from the first batch, released only at the end: no step was left behind.
        calls = behind.calls
        assert calls[0] is True and calls[-1] is False and calls == sorted(calls, reverse=True)
        dashboard_exact_at(config, pipeline, source_db.dsn, purged, batches[-1].commit_lsn)
        stream_changes_nothing(config, pipeline, source_db.dsn, purged)
    else:
        assert behind.calls[:1] == [False]      # not followed: the stream is not held
        pipeline.run_once()
        check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
