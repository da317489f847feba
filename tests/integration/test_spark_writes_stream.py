"""The one pass through Spark (``LAKECDC_WRITER=spark``): silver's appends, gold's
steps and folds, and the push's reads of gold all go through Spark's Delta, and stay
exactly once.

Every command runs with ``LAKECDC_WRITER=spark`` (a lakehouse keeps the writer it was set
up with: bronze's progress is kept differently on each path). Checked against independent
truth: the source's GROUP BY (``tests.truth``), bronze's rows read from the Delta log, and
which engine made each commit (``commitInfo.engineInfo`` in the log's own JSON). A kill
right after gold's MERGE replays exactly; with the ``gold_txn`` guard off the same replay
counts twice, and with ``silver_txn`` off a replay after silver's append appends it twice
(the negative controls).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.integration.workload import mixed
from tests.tests_support import crash_once_at
from tests.truth import check_gold

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPARK = {"LAKECDC_WRITER": "spark"}
# Each step folded into gold with its batch, so a kill after gold's step is right after a
# MERGE.
FOLD_EACH = {"LAKECDC_GOLD_FOLD_SHARE": "1"}
AFTER_MERGE = "after_gold_merge"


def lakecdc_commits(table: Path) -> list[dict]:
    """The commitInfo of every commit of ``table`` carrying lakecdc's metadata, oldest
    first, read from the Delta log's JSON (no Delta reader in between)."""
    found = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info and "lakecdc" in (info.get("userMetadata") or ""):
                found.append({**info, "version": int(entry.stem)})
    return found


def assert_made_by_spark(table: Path, operations: set[str]) -> None:
    commits = lakecdc_commits(table)
    assert {c["operation"] for c in commits} >= operations, (table, commits)
    other = [c for c in commits if "Apache-Spark" not in (c.get("engineInfo") or "")]
    assert not other, f"{table}: commits not made by Spark: {other[:2]}"


def assert_silver_is_bronze(lakehouse: Path) -> None:
    """One silver row per bronze row (key ``(commit_lsn, seq)``), none twice."""
    def keys(path: Path) -> Counter:
        rows = DeltaTable(str(path)).to_pyarrow_table(columns=["commit_lsn", "seq"])
        return Counter(zip(*(rows.column(c).to_pylist() for c in ("commit_lsn", "seq"))))

    bronze, silver = keys(lakehouse / "bronze" / "wal2json_changes"), \
        keys(lakehouse / "silver" / "changes")
    assert max(silver.values()) == 1, "a bronze row reached silver twice"
    assert silver == bronze


def ship(lakecdc, config) -> None:
    code, _, err = lakecdc(config, "ship", "--once", env=SPARK)
    assert code == 0, err[-3000:]


def killed_then_replayed(source_db, config, lakecdc, monkeypatch, fault: str,
                         guards: dict[str, str]) -> Counter:
    """Setup, traffic, ship; the stream through Spark killed at ``fault`` in batch 0
    (before the checkpoint records it); then the stream and a push through Spark again.
    Returns the purged history rows (for the truth)."""
    code, _, err = lakecdc(config, "setup", env=SPARK)
    assert code == 0, err[-3000:]
    purged = mixed(source_db.dsn, seed=37)
    ship(lakecdc, config)
    crash_once_at(monkeypatch, fault)       # the kill, in this process (its JVM goes on)
    code, _, err = lakecdc(config, "stream", "--once", env={**SPARK, **FOLD_EACH, **guards})
    assert code == 3 and f"Crash: {fault}" in err, err[-3000:]
    lakehouse = Path(config.lakehouse)
    assert not (lakehouse / "_checkpoints" / "stream" / "commits" / "0").exists(), \
        "the kill was meant to land inside batch 0"
    if fault == AFTER_MERGE:
        merged = lakecdc_commits(lakehouse / "gold" / "service_stats")[-1]
        assert merged["operation"] == "MERGE" and "Apache-Spark" in merged["engineInfo"]
        assert json.loads(merged["userMetadata"])["batch_id"] == 0
    else:
        appended = lakecdc_commits(lakehouse / "silver" / "changes")[-1]
        assert json.loads(appended["userMetadata"])["batch_id"] == 0
    for args in (("stream", "--once"), ("push", "--once")):
        code, _, err = lakecdc(config, *args, env={**SPARK, **guards})
        assert code == 0, err[-3000:]
    return purged


def test_the_one_pass_through_spark_is_exact_after_a_kill_and_spark_made_every_commit(
        source_db, config, lakecdc, monkeypatch):
    purged = killed_then_replayed(source_db, config, lakecdc, monkeypatch, AFTER_MERGE, {})
    lakehouse = Path(config.lakehouse)
    check_gold(config.lakehouse, source_db.dsn, config.dashboard, purged)
    assert_silver_is_bronze(lakehouse)

    # More traffic, shipped, then ``run --once`` through Spark (nothing left
    # to ship): its push reads gold's change data feed through Spark.
    purged += mixed(source_db.dsn, seed=38)
    ship(lakecdc, config)
    code, out, err = lakecdc(config, "run", "--once", env={**SPARK, "LAKECDC_MIRRORS": "none"})
    assert code == 0, err[-3000:]
    assert "not readable" not in err, err[-3000:]
    check_gold(config.lakehouse, source_db.dsn, config.dashboard, purged)
    assert_silver_is_bronze(lakehouse)

    # status reads every layer through Spark: silver holds what bronze does, gold's version
    # is its log's newest.
    code, out, err = lakecdc(config, "status", "--json", env=SPARK)
    assert code == 0, err[-3000:]
    layers = {layer["layer"]: layer for layer in json.loads(out)["layers"]}
    assert layers["silver"]["commit_lsn"] == layers["bronze"]["commit_lsn"] is not None
    assert layers["gold"]["version"] == DeltaTable(str(lakehouse / "gold" / "service_stats")
                                                   ).version()
    assert layers["gold"]["commit_lsn"] is not None

    assert_made_by_spark(lakehouse / "silver" / "changes", {"WRITE"})
    assert_made_by_spark(lakehouse / "gold" / "service_stats", {"MERGE"})


@pytest.mark.parametrize("guard", ["gold_txn", "silver_txn"])
def test_negative_controls_without_a_txn_guard_the_replay_writes_twice(
        source_db, config, lakecdc, monkeypatch, guard):
    """The same kill and replay with an app transaction off. ``gold_txn``: killed after
    gold's MERGE, neither Spark nor the writer skips the replayed MERGE, so gold counts
    batch 0 twice. ``silver_txn``: killed after silver's append, the replay appends it
    again."""
    fault = AFTER_MERGE if guard == "gold_txn" else "after_silver_append"
    purged = killed_then_replayed(source_db, config, lakecdc, monkeypatch, fault,
                                  {"LAKECDC_UNSAFE_DISABLE_GUARDS": guard})
    if guard == "gold_txn":
        with pytest.raises(AssertionError, match="gold differs from the source"):
            check_gold(config.lakehouse, source_db.dsn, config.dashboard, purged)
    else:
        with pytest.raises(AssertionError, match="reached silver twice"):
            assert_silver_is_bronze(Path(config.lakehouse))


def test_a_continuous_run_through_spark_pushes_ahead_and_ends_exact(source_db, config,
                                                                    lakecdc, spark):
    """``lakecdc run`` (continuous) with ``LAKECDC_WRITER=spark`` in this process: the
    stream's batches push their steps ahead of gold, the dashboard's feeder reads gold through
    Spark; the dashboard reaches the source while it runs, and gold equals it after."""
    from pipelines.run.pipeline import Pipeline
    from tests.truth import dashboard_counts, source_truth
    from tests.tests_support import wait_for

    code, _, err = lakecdc(config, "setup", env=SPARK)
    assert code == 0, err[-3000:]
    pipeline = Pipeline(config.with_(writer="spark"), spark_factory=lambda: spark,
                        push_interval_s=0.5)
    passes = []
    pipeline.on_pass.append(passes.append)
    stop = threading.Event()
    runner = threading.Thread(target=pipeline.run_continuous, args=(stop,))
    runner.start()
    try:
        assert pipeline.started.wait(300)
        purged = mixed(source_db.dsn, seed=39)
        truth = {k: v for k, v in source_truth(source_db.dsn, purged).items() if v}
        wait_for(lambda: not runner.is_alive() or
                 {k: v for k, v in dashboard_counts(source_db.dsn).items() if v} == truth,
                 timeout=300, interval=0.5)
        assert runner.is_alive(), "the continuous run stopped"
    finally:
        stop.set()
        runner.join(timeout=300)
    assert not runner.is_alive()
    assert any(p.ahead_seconds > 0 for p in passes), "no step was pushed ahead of gold"
    check_gold(config.lakehouse, source_db.dsn, config.dashboard, purged)
    lakehouse = Path(config.lakehouse)
    assert_made_by_spark(lakehouse / "silver" / "changes", {"WRITE"})
    assert_made_by_spark(lakehouse / "gold" / "_deltas", {"WRITE"})


def test_status_through_spark_reads_the_newest_change_in_utc_on_a_driver_off_utc(
        spark, tmp_path, monkeypatch):
    """pyspark hands timestamps to Python as naive local times: read on a driver whose zone
    is New York, the layer's newest change is still the instant written (not 5 h off)."""
    import datetime as dt
    import time

    import pyarrow as pa
    from deltalake import write_deltalake

    from core.engine.spark_delta import SparkDelta
    from pipelines.observe.status import delta_layer

    written = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.timezone.utc)
    path = str(tmp_path / "layer")
    write_deltalake(path, pa.table({"commit_lsn": [5], "commit_ts": pa.array(
        [written], pa.timestamp("us", tz="UTC"))}))
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        layer = delta_layer("silver", path, "commit_lsn", "commit_ts", SparkDelta(spark))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (layer.commit_lsn, layer.commit_ts) == (5, written)
