"""Every query file under ``sql/`` runs against the lakehouse tables registered by name, after
a real pipeline run, and the dashboard numbers agree with a ``GROUP BY`` of the source;
``lakecdc sql`` runs a file and refuses a wrong query with one sentence."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.observe.query import TABLES, read_query, register_tables, run_query, table_paths
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import ROOT, cli_env, error_line
from tests.truth import source_truth
from tests.integration.workload import mixed, transition

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SQL_DIR = Path(ROOT) / "sql"
FAILED = ("permanent-failure", "temporary-failure", "technical-failure")


def test_every_query_file_runs_and_agrees_with_the_source(source_db, config, spark,
                                                          cli_here):
    setup(config)
    purged = mixed(source_db.dsn, seed=81)
    with source_db.connect() as conn:
        transition(conn, 0.3, "permanent-failure")
        transition(conn, 0.2, "technical-failure")
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    pipeline.run_once()
    assert set(register_tables(spark, table_paths(config))) == set(TABLES)

    files = sorted(SQL_DIR.glob("*.sql"))
    assert {f.stem for f in files} >= {"top_services", "status_breakdown", "failure_rates",
                                       "freshness"}
    results = {f.stem: run_query(spark, read_query(str(f))).collect() for f in files}
    assert all(results.values()), [name for name, rows in results.items() if not rows]

    truth = {k: v for k, v in source_truth(source_db.dsn, purged).items() if v}
    by_status = Counter()
    per_service = Counter()
    finished = Counter()
    failed = Counter()
    for (service, _template, kind, status), n in truth.items():
        by_status[(service, kind, status)] += n
        per_service[service] += n
        if status == "delivered" or status in FAILED:
            finished[(service, kind)] += n
        if status in FAILED:
            failed[(service, kind)] += n

    assert {(r.service_id, r.notification_type, r.notification_status): r.notifications
            for r in results["status_breakdown"]} == {k: v for k, v in by_status.items() if v}
    top = sorted(per_service.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    assert [(r.service_id, r.notifications) for r in results["top_services"]] == top
    assert abs(sum(float(r.share_pct) for r in results["top_services"]) - 100.0) < 0.1 \
        or len(per_service) > 10
    assert {(r.service_id, r.notification_type): (r.failed, r.delivered + r.failed)
            for r in results["failure_rates"]} == \
        {k: (failed[k], finished[k]) for k in finished}
    assert sum(failed.values()) > 0

    fresh = {r.layer: r for r in results["freshness"]}
    assert list(fresh) == ["bronze", "silver", "gold"]
    from gold.asof import gold_state
    assert fresh["gold"].commit_lsn == gold_state(spark, pipeline.where.gold).watermark
    assert fresh["gold"].commit_lsn <= fresh["silver"].commit_lsn <= fresh["bronze"].commit_lsn
    assert all(r.age_seconds is not None and r.age_seconds >= 0 for r in fresh.values())

    # The command, on a file, as CSV; then a query naming a column that does not exist.
    env = cli_env(config)
    result = cli_here(["sql", "-f", "sql/status_breakdown.sql", "--format", "csv"], env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert {(r["service_id"], r["notification_type"], r["notification_status"]):
            int(r["notifications"]) for r in rows} == {k: v for k, v in by_status.items() if v}
    # Without a JVM (delta-rs's DataFusion, ``--engine delta-rs``): every file in Spark's
    # and DataFusion's common SQL gives Spark's rows; freshness.sql is Spark's dialect
    # (``unix_micros``): refused there with the way to run it, and run on Spark by the
    # default engine, which says so.
    for f in files:
        done = cli_here(["sql", "-f", str(f), "--format", "json", "--engine", "delta-rs"], env)
        if f.stem == "freshness":
            assert "--engine spark" in error_line(done, "delta-rs's SQL engine cannot run it")
            continue
        assert done.returncode == 0, (f.stem, done.stderr[-3000:])
        assert [_normal(json.loads(line)) for line in done.stdout.splitlines()] == \
            [_normal(r.asDict()) for r in results[f.stem]], f.stem
    turned = cli_here(["sql", "-f", "sql/freshness.sql"], env)
    assert turned.returncode == 0 and "running it on Spark" in turned.stderr, turned.stderr
    assert [line.split()[0] for line in turned.stdout.splitlines()[2:5]] == \
        ["bronze", "silver", "gold"]

    wrong = cli_here(["sql", "SELECT no_such_column FROM gold_service_stats"], env)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    [line] = [ln for ln in wrong.stderr.splitlines() if ln.startswith("lakecdc: error:")]
    assert "the query failed" in line and "no_such_column" in line

    # It never writes: a DELETE, an INSERT, a maintenance command, even after a query, is
    # one sentence and changes nothing (by path here; through a catalog's names:
    # test_mirrors' tail test).
    gold_rows = spark.read.format("delta").load(pipeline.where.gold).count()
    gold_history = len(DeltaTable(pipeline.where.gold).history())
    for statement in ("DELETE FROM gold_service_stats",
                      "INSERT INTO gold_service_stats SELECT * FROM gold_service_stats",
                      f"DELETE FROM delta.`{pipeline.where.gold}`",
                      f"OPTIMIZE delta.`{pipeline.where.gold}`",
                      "SELECT 1; DELETE FROM gold_service_stats"):
        refused = cli_here(["sql", statement], env)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, statement
        [line] = [ln for ln in refused.stderr.splitlines() if ln.startswith("lakecdc: error:")]
        assert "never changes a table" in line, (statement, line)
    assert spark.read.format("delta").load(pipeline.where.gold).count() == gold_rows
    assert len(DeltaTable(pipeline.where.gold).history()) == gold_history


def _normal(row: dict) -> dict:
    """A result row with numbers as floats (one engine's DECIMAL is the other's DOUBLE)."""
    def value(v):
        try:
            return round(float(v), 6) if v is not None and not isinstance(v, bool) else v
        except (TypeError, ValueError):
            return str(v)
    return {k: value(v) for k, v in row.items()}
