"""Maintenance through Spark (``core.engine.spark_maintenance``, ``LAKECDC_WRITER=spark``)
never lets Delta's own log cleanup delete what the table's stream reads again when it restarts.

Delta (not lakecdc) deletes expired log entries there, at its checkpoints, while the table's
``delta.enableExpiredLogCleanup`` is on. A restarted stream plans its newest committed batch
once more, from the version where it began: for a stream that has committed only its first
batch, that is the table as the stream first read it, however long ago. Real Spark, a real
Delta stream and real checkpoints; the log's age is set on its files' times, which are what
Delta's cleanup reads.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from core.engine.spark_delta import SparkDelta
from core.engine.spark_maintenance import (
    maintain_table_spark,
    stream_needs_log,
    stream_position_spark,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DAY = 86_400


def _append(spark, path: str, start: int) -> None:
    spark.range(start, start + 10).write.format("delta").mode("append").save(path)


def _stream(spark, path: str, checkpoint: str) -> list[int]:
    """The ids the stream reads in one ``availableNow`` run from its checkpoint."""
    seen: list[int] = []
    query = (spark.readStream.format("delta").load(path).writeStream
             .foreachBatch(lambda batch, _: seen.extend(r.id for r in batch.collect()))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    return seen


@pytest.mark.parametrize("guarded", [True, False], ids=["kept", "negative_control"])
def test_a_stream_that_committed_only_its_first_batch_restarts_after_maintenance(
        spark, tmp_path, guarded, monkeypatch):
    """The stream reads a table's first three commits in its batch 0, and stops. A day
    later (the log's files aged so), the table is maintained at a log retention of one
    minute, then written on past two Delta checkpoints. The stream restarts and reads
    every row once. Without the rule (``stream_needs_log`` answering no), Delta's cleanup
    deletes the entries batch 0 began at, and the restart fails."""
    from core.engine import spark_maintenance

    if not guarded:
        monkeypatch.setattr(spark_maintenance, "stream_needs_log", lambda *a: False)
    path, checkpoint = str(tmp_path / "t"), str(tmp_path / "checkpoint")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta "
              "TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    for start in (0, 10, 20):
        _append(spark, path, start)
    assert sorted(_stream(spark, path, checkpoint)) == list(range(30))
    log = Path(path, "_delta_log")
    for entry in log.iterdir():
        os.utime(entry, (time.time() - DAY, time.time() - DAY))

    floor = stream_position_spark(spark, checkpoint, replayed=True)
    assert floor == -1                                  # only batch 0 committed
    maintain_table_spark(SparkDelta(spark), "t", path, retention_hours=24,
                         log_retention_minutes=1,
                         reader_floor=stream_position_spark(spark, checkpoint),
                         log_floor=floor)
    for start in range(30, 80, 10):
        _append(spark, path, start)
    if not guarded:
        assert not (log / f"{0:020d}.json").exists()    # what the restart needs: gone
        with pytest.raises(Exception):
            _stream(spark, path, checkpoint)
        return
    assert sorted(_stream(spark, path, checkpoint)) == list(range(30, 80))


def test_the_rule_of_which_logs_a_stream_still_needs():
    def young(version):
        return 1_000.0

    def old(version):
        return 0.0

    def gone(version):
        return None

    assert not stream_needs_log(old, 10, None, 5, 1_000.0)          # no stream
    assert not stream_needs_log(old, 10, 5, 5, 1_000.0)             # it read everything
    assert stream_needs_log(young, 10, -1, 5, 1_000.0)              # batch 0 at most
    assert stream_needs_log(gone, 10, 2, 5, 1_000.0)                # its entry unreadable
    assert stream_needs_log(old, 10, 2, 5, 1_000.0)                 # older than half
    assert not stream_needs_log(young, 10, 2, 5, 1_000.0)           # within it
