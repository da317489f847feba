"""What the tables others read keep: a user's own stream of ``silver/changes`` resumes
after an outage longer than lakecdc's internal log retention, across maintenance.

``lakecdc`` keeps its own tables' logs minutes (``LAKECDC_LOG_RETENTION_MINUTES``) and the
tables others read a day by default (``LAKECDC_READER_RETENTION``; docs/operations.md,
"What each table keeps"). The negative control keeps silver's log as briefly as the
internal tables': the same outage then breaks the user's stream.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from core.config import reader_retention
from core.layout import GOLD_DELTAS, SILVER
from pipelines.maintain.once import maintain_once
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def outage(lakehouse: str, seconds: float) -> None:
    """Every log entry of the lakehouse written ``seconds`` ago, each table with a
    checkpoint at its newest version (as its writer makes one every 100 commits): an
    outage that long after more traffic than this test's."""
    for log in Path(lakehouse).rglob("_delta_log"):
        DeltaTable(str(log.parent)).create_checkpoint()
        for entry in log.iterdir():
            os.utime(entry, (time.time() - seconds,) * 2)


def user_stream(spark, source: str, sink: str, checkpoint: str) -> None:
    """A user's Structured Streaming query of ``source``, run until it has read all there is."""
    (spark.readStream.format("delta").load(source)
     .writeStream.format("delta").option("checkpointLocation", checkpoint)
     .trigger(availableNow=True).start(sink).awaitTermination())


def keys(path: str) -> Counter:
    rows = DeltaTable(path).to_pyarrow_table(columns=["commit_lsn", "seq"]).to_pylist()
    return Counter((r["commit_lsn"], r["seq"]) for r in rows)


@pytest.mark.parametrize("kept", ["default", "1m"])
def test_a_users_stream_of_silver_resumes_after_an_outage_longer_than_the_internal_log(
        source_db, config, spark, tmp_path, kept):
    """Internal logs kept one minute. The user's stream reads silver's first batches and
    stops; three more rounds of traffic and ``run --once``; then an hour's outage
    (``outage``) and ``maintain --once``. gold/_deltas's log no longer starts at version 0; silver's
    still does, and the user's stream resumes with every silver row exactly once. With silver kept
    one minute as well (``1m``), maintenance cleans silver's log and the stream cannot resume."""
    config = config.with_(mirrors=(), log_retention_minutes=1,
                          **({} if kept == "default" else
                             {"reader_retention": reader_retention(kept)}))
    setup(config)
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    silver = config.table_path(SILVER)
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    mixed(source_db.dsn, seed=41)
    pipeline.run_once()
    user_stream(spark, silver, sink, checkpoint)
    first = sum(keys(sink).values())
    assert keys(sink) == keys(silver) and first > 0

    for seed in (42, 43, 44):
        mixed(source_db.dsn, seed=seed)
        pipeline.run_once()
    outage(config.lakehouse, 3600)
    maintain_once(config)
    deltas_log = Path(config.table_path(GOLD_DELTAS)) / "_delta_log"
    assert not (deltas_log / f"{0:020d}.json").exists(), "the internal log was not cleaned"
    silver_log = Path(silver) / "_delta_log"

    if kept != "default":
        assert not (silver_log / f"{0:020d}.json").exists()
        with pytest.raises(Exception, match="DELTA_LOG_FILE_NOT_FOUND_FOR_STREAMING_SOURCE"):
            user_stream(spark, silver, sink, checkpoint)
        return
    assert (silver_log / f"{0:020d}.json").exists()
    assert DeltaTable(silver).metadata().configuration["delta.logRetentionDuration"] == \
        "interval 1440 minutes"
    user_stream(spark, silver, sink, checkpoint)
    got, want = keys(sink), keys(silver)
    assert max(got.values()) == 1, "a row reached the user's stream twice"
    assert got == want and len(want) > first
