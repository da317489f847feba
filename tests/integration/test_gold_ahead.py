"""A shipper batch's step in gold as soon as bronze holds it, before the stream has read it
(``gold.ahead``, ``GoldBatchWriter.step_ahead``; docs/gold.md, "Gold ahead of the
stream"): the real shipper and wal2json, gold read by path as a SQL reader reads it and
compared with the source's own GROUP BY after each fold. The stream then leaves out the rows
gold holds: with that filter off (the ``gold_watermark`` guard) it counts them again. A
writer that stopped with the steps still in ``_deltas`` leaves them for the next writer
to fold, by their watermark."""

from __future__ import annotations

from collections import Counter

import pytest

from gold.asof import gold_state
from gold.start import gold_writer
from pipelines.run.pipeline import Pipeline
from tests.integration.test_ship_ahead import ship, started, steps_ahead
from tests.integration.workload import mixed
from tests.truth import _nonzero, check_gold, gold_counts, source_truth

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def gold_exact_at(config, spark, pipeline: Pipeline, dsn: str, purged: Counter,
                  lsn: int) -> None:
    """Gold, read by path, equals the source's own GROUP BY, at watermark ``lsn``."""
    assert _nonzero(gold_counts(config.lakehouse)) == _nonzero(source_truth(dsn, purged))
    assert gold_state(spark, pipeline.where.gold).watermark == lsn


def shipped_into_gold(config, spark, dsn: str, fold: bool):
    """``started``, then two rounds of traffic shipped with each batch's step taken into
    gold by a writer that folds only when told (``fold``: after each round, with gold then
    checked). Returns the pipeline, the history rows purged and the newest batch."""
    pipeline, purged = started(config, spark, dsn)
    writer = gold_writer(spark, pipeline.where.stream.gold, tables=config.counted,
                         fold_share=0.0)
    with steps_ahead(pipeline) as steps:
        steps.to_gold(writer)
        shipper = pipeline.shipper(steps)
        for seed in (10, 11):
            purged += mixed(dsn, seed=seed)
            batches = ship(shipper, pipeline)
            steps.to_gold(None)             # every batch handed on is in _deltas
            steps.to_gold(writer)
            assert batches and writer.watermark(spark) == batches[-1].commit_lsn
            if fold:
                writer.fold()
                gold_exact_at(config, spark, pipeline, dsn, purged, batches[-1].commit_lsn)
    return pipeline, purged, batches[-1]


def test_each_shipper_batch_reaches_gold_before_the_stream_reads_it(source_db, config, spark):
    pipeline, purged, _ = shipped_into_gold(config, spark, source_db.dsn, fold=True)
    # The stream over the same bronze rows: every one is in gold already.
    run = pipeline.stream(once=True)
    assert run.batches and run.applied_transactions == 0
    pipeline.push(once=True)
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)


@pytest.mark.parametrize("guard", [True, False], ids=["filtered", "negative-control"])
def test_steps_left_in_deltas_are_folded_by_the_next_writer_and_never_counted_again(
        source_db, config, spark, guard):
    """The state a kill right after a step's append leaves (``after_gold_ahead``): the
    steps in ``_deltas``, none folded. The stream's writer folds them when it starts (gold's
    folds record the newest folded step's watermark, so it knows which rows are past it)
    and leaves out the rows they hold; without that filter it counts them twice."""
    pipeline, purged, newest = shipped_into_gold(config, spark, source_db.dsn, fold=False)
    if not guard:
        pipeline = Pipeline(config.with_(disabled_guards=frozenset({"gold_watermark"})),
                            spark_factory=lambda: spark)
    pipeline.stream(once=True)
    assert gold_state(spark, pipeline.where.gold).watermark == newest.commit_lsn
    if guard:
        pipeline.push(once=True)
        check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
    else:
        gold, truth = (_nonzero(c) for c in (gold_counts(config.lakehouse),
                                             source_truth(source_db.dsn, purged)))
        assert gold != truth
        assert sum(gold.values()) > sum(truth.values())     # the shipped rows twice
