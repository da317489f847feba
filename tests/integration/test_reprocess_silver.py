"""``lakecdc backfill reprocess-silver``: a range of silver parsed again from bronze."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from deltalake import DeltaTable

from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from pipelines.backfill.rebuild import reprocess_and_rebuild
from tests.tests_support import cli_env
from tests.truth import check_gold
from tests.integration.workload import archive, insert, mixed, transition

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def pipeline(config, spark):
    setup(config)
    return Pipeline(config, spark_factory=lambda: spark)


def _silver_rows(pipeline) -> list[dict]:
    return DeltaTable(pipeline.where.silver.silver_path).to_pyarrow_table(
        columns=["commit_lsn", "seq", "notification_status", "op"]).to_pylist()


def _damage(pipeline, spark) -> tuple[int, int]:
    """A 'parser bug': every status in the middle third of silver's transactions wrong."""
    path = pipeline.where.silver.silver_path
    lsns = sorted({r["commit_lsn"] for r in _silver_rows(pipeline)})
    lo, hi = lsns[len(lsns) // 3], lsns[2 * len(lsns) // 3]
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.appendOnly' = 'false')")
    spark.sql(f"UPDATE delta.`{path}` SET notification_status = 'garbled' "
              f"WHERE commit_lsn BETWEEN {lo} AND {hi} AND notification_status IS NOT NULL")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.appendOnly' = 'true')")
    return lo, hi


def test_reprocess_replaces_the_range_once_and_gold_stays_exact(source_db, config, pipeline,
                                                                spark):
    rng = random.Random(71)
    for _ in range(6):                       # many small transactions
        with source_db.connect() as conn:
            insert(conn, rng, 20)
            transition(conn, 0.3, "sending")
    purged = mixed(source_db.dsn, seed=72)
    pipeline.run_once()
    before = _silver_rows(pipeline)
    lo, hi = _damage(pipeline, spark)
    assert any(r["notification_status"] == "garbled" for r in _silver_rows(pipeline))

    report = reprocess_and_rebuild(pipeline.spark, pipeline.config, pipeline.where,
                                   pipeline.gold_lock,
                                   from_lsn=f"{lo >> 32:X}/{lo & 0xFFFFFFFF:X}",
                                   to_lsn=f"{hi >> 32:X}/{hi & 0xFFFFFFFF:X}")
    assert (report.first_lsn, report.last_lsn) == (lo, hi)
    after = _silver_rows(pipeline)
    key = lambda r: (r["commit_lsn"], r["seq"])      # noqa: E731
    assert len({key(r) for r in after}) == len(after), "duplicate silver rows"
    assert sorted(after, key=key) == sorted(before, key=key)   # the fixed parse, once
    bronze_rows = DeltaTable(config.bronze_path).to_pyarrow_table(columns=["seq"]).num_rows
    assert len(after) == bronze_rows
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)   # rebuilt: fresh baseline

    # The gold stream carries on past the replacing commits (skipChangeCommits).
    purged = mixed(source_db.dsn, seed=73)
    pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
    assert len(_silver_rows(pipeline)) == DeltaTable(config.bronze_path).to_pyarrow_table(
        columns=["seq"]).num_rows


@pytest.mark.long
def test_reprocess_by_time_range_from_the_cli(source_db, config, pipeline, cli_here):
    with source_db.connect() as conn:
        insert(conn, random.Random(74), 40)
        archive(conn, 0.5)
    pipeline.run_once()
    rows = len(_silver_rows(pipeline))
    now = datetime.now(timezone.utc)
    env = cli_env(config)
    result = cli_here(["backfill", "reprocess-silver", "--since",
                       (now - timedelta(hours=1)).isoformat(), "--until",
                       (now + timedelta(hours=1)).isoformat()], env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{rows:,} rows (0 quarantined)" in result.stdout
    assert len(_silver_rows(pipeline)) == rows
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)

    bad = cli_here(["backfill", "reprocess-silver", "--from-lsn", "yesterday"], env)
    assert bad.returncode == 2 and "--from-lsn" in bad.stderr
