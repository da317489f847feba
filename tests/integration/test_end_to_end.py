"""slot → bronze → silver → gold → dashboard, exact against a GROUP BY on the source."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from pipelines.demo.traffic import Traffic
from tests.tests_support import cli_env, error_line, run_cli
from tests.truth import check_gold, dashboard_counts
from tests.integration.workload import (archive, insert, mixed, multi_row_insert, purge_history,
                                        transition)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def pipeline(config, spark):
    setup(config)
    return Pipeline(config, spark_factory=lambda: spark)


@pytest.mark.long
def test_mixed_workloads_over_several_run_once_rounds_are_exact(source_db, config, pipeline):
    purged = Counter()
    purged += mixed(source_db.dsn, seed=1)
    pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)

    # A long transaction interleaved with short ones, committed in a later round.
    rng = random.Random(2)
    long_tx = source_db.connect(autocommit=False)
    insert(long_tx, rng, 30)
    purged += mixed(source_db.dsn, seed=3)
    pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
    transition(long_tx, 0.5, "sending")
    long_tx.commit()
    long_tx.close()

    # A 50k-row transaction, then archival and deletes touching it.
    with source_db.connect() as conn:
        multi_row_insert(conn, rng, 50_000)
        transition(conn, 0.2, "delivered")
        archive(conn, 0.1)
        purged += purge_history(conn, 0.5)
    report = pipeline.run_once()
    assert report.shipped > 50_000
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)


def test_the_cli_run_once_leaves_the_dashboard_exact(source_db, config):
    """Also the shell's conventions: ``status`` exits 4 with no slot, 5 while a layer holds
    nothing, 0 once every layer does; ``run --once``, ``tables`` and ``maintain --once``
    report in JSON."""
    import json

    from deltalake import DeltaTable

    missing = run_cli(["status"], cli_env(config))
    assert missing.returncode == 4 and "slot: MISSING" in missing.stdout, missing.stderr
    assert run_cli(["setup"], cli_env(config)).returncode == 0
    empty = run_cli(["status"], cli_env(config))
    assert empty.returncode == 5 and ("not created yet" in empty.stdout
                                      or "nothing pushed yet" in empty.stdout), empty.stdout
    purged = mixed(source_db.dsn, seed=11)
    # Gold folds each batch's step with the batch (LAKECDC_GOLD_FOLD_SHARE=1): nothing
    # goes through gold/_deltas.
    result = run_cli(["run", "--once", "--json"],
                     {**cli_env(config), "LAKECDC_GOLD_FOLD_SHARE": "1"})
    assert result.returncode == 0, result.stderr
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
    report = json.loads(result.stdout)
    assert report["shipped"] > 0 and report["silver_rows"] > 0, report
    assert report["pushed_version"] == DeltaTable(config.table_path(("gold", "service_stats"))
                                                  ).version(), report
    listed = json.loads(run_cli(["tables", "--json"], cli_env(config)).stdout)
    assert [(t["table"], t["state"]) for t in listed] == \
        [(t, "captured") for t in config.tables], listed

    from core.layout import GOLD_DELTAS

    assert DeltaTable(config.table_path(GOLD_DELTAS)).version() == 0
    status = run_cli(["status", "--json"], cli_env(config))
    assert status.returncode == 0 and '"wal_status": "reserved"' in status.stdout
    # Drained: every layer's recorded progress is the newest source commit bronze holds.
    newest = max(DeltaTable(config.bronze_path).to_pyarrow_table(
        columns=["commit_lsn"]).column("commit_lsn").to_pylist())
    with source_db.connect() as conn:
        marks = dict(conn.execute("SELECT layer, source_commit_lsn FROM "
                                  "lakecdc_layer_progress").fetchall())
    assert marks == {layer: newest for layer in ("bronze", "silver", "gold", "dashboard")}
    # Each table's size as its snapshot has it (maintenance shows in it: docs/operations.md).
    tables = {t["table"]: t for t in json.loads(status.stdout)["tables"]}
    for name, path in (("bronze", config.bronze_path),
                       ("gold", config.table_path(("gold", "service_stats")))):
        table = DeltaTable(path)
        assert tables[name]["live_files"] == len(table.file_uris()) > 0, tables[name]
        assert tables[name]["live_bytes"] == sum(
            table.get_add_actions(flatten=True).column("size_bytes").to_pylist())
        assert tables[name]["log_entries"] >= table.version()
    assert {"silver", "quarantine", "gold_pending"} <= set(tables)
    text = run_cli(["status"], cli_env(config)).stdout
    assert "live files" in text and "never" in text      # not maintained yet: a short run
    maintained = run_cli(["maintain", "--once", "--json"], cli_env(config))
    assert maintained.returncode == 0, maintained.stderr[-3000:]
    reports = {r["table"]: r for r in json.loads(maintained.stdout)}
    assert {"bronze", "silver", "gold"} <= set(reports), reports
    assert reports["gold"]["files_after"] == len(DeltaTable(
        config.table_path(("gold", "service_stats"))).file_uris())


@pytest.mark.long
def test_continuous_mode_under_traffic_ends_exact(source_db, config, pipeline):
    stop_traffic, stop_pipeline = threading.Event(), threading.Event()
    traffic = Traffic(source_db.dsn, seed=5)
    runner = threading.Thread(target=pipeline.run_continuous, args=(stop_pipeline,))
    writer = threading.Thread(target=traffic.run, args=(stop_traffic, 0.2, 5))
    runner.start()
    writer.start()
    try:
        # Let the continuous pipeline push something while traffic flows.
        from tests.tests_support import wait_for
        wait_for(lambda: sum(dashboard_counts(source_db.dsn).values()) > 0, timeout=240,
                 interval=0.5)
    finally:
        stop_traffic.set()
        writer.join()
        stop_pipeline.set()
        runner.join(timeout=300)
    assert not runner.is_alive() and traffic.steps > 0
    pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)


@pytest.mark.long
def test_truncate_of_notifications_stops_run_with_one_sentence(source_db, config, cli_here):
    env = cli_env(config)
    assert run_cli(["setup"], env).returncode == 0
    with source_db.connect() as conn:
        insert(conn, random.Random(41), 10)
    assert cli_here(["run", "--once"], env).returncode == 0
    before = dashboard_counts(source_db.dsn)
    source_db.execute("TRUNCATE notifications")
    result = cli_here(["run", "--once"], env)
    error_line(result, "rebuild-gold")
    assert dashboard_counts(source_db.dsn) == before      # nothing half-applied


def test_a_populated_database_is_exact_from_the_first_run(source_db, config, cli_here):
    """Rows that existed before setup have no INSERT in the WAL: the baseline counted in
    the slot's exported snapshot must carry them, while writers keep going."""
    rng = random.Random(51)
    with source_db.connect() as conn:
        insert(conn, rng, 300)
        transition(conn, 0.5, "delivered")
        archive(conn, 0.3)
    stop = threading.Event()
    traffic = Traffic(source_db.dsn, seed=52)
    writer = threading.Thread(target=traffic.run, args=(stop, 0.02, 5))
    writer.start()                        # setup must not block writers, nor miss their work
    try:
        result = run_cli(["setup"], cli_env(config))
    finally:
        stop.set()
        writer.join()
    assert result.returncode == 0, result.stderr
    assert "as the baseline" in result.stdout
    with source_db.connect() as conn:
        transition(conn, 0.3, "sending")
        purged = purge_history(conn, 0.2)
    assert cli_here(["run", "--once"], cli_env(config)).returncode == 0
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
