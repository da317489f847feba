"""Prometheus metrics checked against independent facts, and passwords kept out of logs.

- A ``run_once`` pipeline with metrics, scraped over HTTP: each layer's rows and
  transactions equal what its table holds (read with deltalake / SQL, not through the
  code under test), the slot's lag equals ``pg_current_wal_lsn() - confirmed_flush_lsn``
  measured around the scrape, ``wal_status`` is ``reserved``, positions and freshness match
  the tables, and the quarantine count follows rows added to ``silver/quarantine``.
- ``lakecdc metrics`` as a real subprocess: serves the state (not the events), keeps
  serving when the dashboard cannot be reached (that part reported down), logs JSON lines
  without the DSN's password, stops on SIGTERM with exit 0.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pyarrow.compute as pc
import pytest
from core.layout import GOLD, QUARANTINE, SILVER
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from bronze.ship import Shipper
from pipelines.observe.metrics import pipeline_exporter
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import ROOT, cli_env, free_port, run_cli, wait_for
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration]

SECRET = "Obs3rv-S3cret"


def scrape(port: int) -> tuple[dict, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, text


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def slot_lag(source_db) -> int:
    with source_db.connect() as conn:
        return conn.execute("SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint "
                            "FROM pg_replication_slots WHERE slot_name = %s",
                            [source_db.slot]).fetchone()[0]


def rows(path: str, columns: list[str]):
    return DeltaTable(path).to_pyarrow_table(columns=columns)


def password_dsn(source_db) -> str:
    """The test database's DSN: it carries the cluster's real (random) password."""
    assert source_db.cluster.password in source_db.dsn
    return source_db.dsn


def secrets_of(source_db) -> tuple[str, str]:
    """What must never be printed: the source's password and the dashboard DSN's."""
    return source_db.cluster.password, SECRET


@pytest.mark.spark
def test_run_once_metrics_equal_the_tables_and_the_slot(source_db, config, spark):
    setup(config)
    mixed(source_db.dsn, seed=21)
    started = time.time()
    # What `lakecdc run --metrics-port` serves; max_age_s=0: every scrape reads the state.
    with pipeline_exporter(config, "127.0.0.1:0", max_age_s=0) as metrics:
        Pipeline(config, spark_factory=lambda: spark, metrics=metrics).run_once()
        port = metrics.port
        check_run_once_metrics(source_db, config, spark, port, started)


def check_run_once_metrics(source_db, config, spark, port, started):

    bronze = rows(config.bronze_path, ["commit_lsn", "commit_ts"])
    silver_path = config.table_path(SILVER)
    silver = rows(silver_path, ["commit_lsn"])
    assert bronze.num_rows > 100 and silver.num_rows == bronze.num_rows
    with source_db.connect() as conn:
        dashboard_rows = conn.execute("SELECT count(*) FROM service_stats").fetchone()[0]
    gold = DeltaTable(config.table_path(GOLD))
    newest_lsn = pc.max(bronze["commit_lsn"]).as_py()
    newest_ts = pc.max(bronze["commit_ts"]).as_py().replace(tzinfo=dt.timezone.utc)

    # Streaming progress reaches the listener through Spark's asynchronous listener bus.
    def streamed():
        samples = scrape(port)[0]
        return (value(samples, "lakecdc_rows_total", layer="silver"),
                value(samples, "lakecdc_stream_input_rows_total",
                      query="lakecdc_stream")) == (silver.num_rows, bronze.num_rows)
    wait_for(streamed, timeout=30, interval=0.2)
    lag_before = slot_lag(source_db)
    scraped_at = time.time()
    samples, _ = scrape(port)
    lag_after = slot_lag(source_db)

    # Events: rows and transactions per layer.
    assert value(samples, "lakecdc_rows_total", layer="bronze") == bronze.num_rows
    assert value(samples, "lakecdc_transactions_total", layer="bronze") == \
        len(pc.unique(bronze["commit_lsn"]))
    assert value(samples, "lakecdc_rows_total", layer="gold") == silver.num_rows
    assert value(samples, "lakecdc_transactions_total", layer="gold") == \
        len(pc.unique(silver["commit_lsn"]))
    assert value(samples, "lakecdc_rows_total", layer="dashboard") == dashboard_rows > 0
    for layer in ("bronze", "silver", "gold", "dashboard"):
        assert value(samples, "lakecdc_batch_duration_seconds_count", layer=layer) >= 1
        assert value(samples, "lakecdc_batch_duration_seconds_sum", layer=layer) > 0
        assert started <= value(samples, "lakecdc_last_batch_timestamp_seconds",
                                layer=layer) <= scraped_at

    # State: the slot, as Postgres reports it around the scrape.
    assert lag_before <= value(samples, "lakecdc_slot_lag_bytes", slot=source_db.slot) \
        <= lag_after
    assert value(samples, "lakecdc_slot_exists", slot=source_db.slot) == 1
    assert value(samples, "lakecdc_slot_wal_status", slot=source_db.slot,
                 wal_status="reserved") == 1
    assert [value(samples, "lakecdc_slot_wal_status", slot=source_db.slot, wal_status=s)
            for s in ("extended", "unreserved", "lost")] == [0, 0, 0]
    # State: every layer holds (gold and the dashboard: exactly up to) the newest change.
    for layer in ("bronze", "silver", "gold", "dashboard"):
        assert value(samples, "lakecdc_state_up", part=layer) == 1
        assert value(samples, "lakecdc_layer_commit_lsn_bytes", layer=layer) == newest_lsn
        assert value(samples, "lakecdc_layer_source_commit_timestamp_seconds",
                     layer=layer) == pytest.approx(newest_ts.timestamp(), abs=1e-3)
        assert 0 < value(samples, "lakecdc_layer_freshness_seconds", layer=layer) <= \
            time.time() - newest_ts.timestamp()
    assert value(samples, "lakecdc_layer_version", layer="bronze") == \
        DeltaTable(config.bronze_path).version()
    assert value(samples, "lakecdc_layer_version", layer="gold") == gold.version() == \
        value(samples, "lakecdc_layer_version", layer="dashboard")
    assert value(samples, "lakecdc_quarantine_rows") == 0
    assert value(samples, "lakecdc_state_up", part="tables") == 1
    assert value(samples, "lakecdc_table_live_files", table="bronze") == \
        len(DeltaTable(config.bronze_path).file_uris()) > 0
    assert value(samples, "lakecdc_table_live_files", table="gold") == len(gold.file_uris())
    assert value(samples, "lakecdc_table_log_entries", table="silver") > 0
    assert value(samples, "lakecdc_slot_safe_wal_size_bytes", slot=source_db.slot) is None
    assert value(samples, "lakecdc_source_max_slot_wal_keep_size_bytes",
                 slot=source_db.slot) is None                 # unlimited on this cluster
    assert [dict(labels)["slot"] for (name, labels), v in samples.items()
            if name == "lakecdc_info" and v == 1] == [source_db.slot]
    assert value(samples, "process_resident_memory_bytes") > 0

    # Quarantine: rows appear in the count as they land in the table.
    from silver.schema import SILVER_QUARANTINE
    quarantine_path = config.table_path(QUARANTINE)
    now = dt.datetime.now(dt.timezone.utc)
    poison = [(newest_lsn + 1, i, 2, newest_lsn + 1, now, "I", "unparseable JSON", "{oops",
               now) for i in range(2)]
    spark.createDataFrame(poison, SILVER_QUARANTINE).write.format("delta").mode(
        "append").save(quarantine_path)
    samples, _ = scrape(port)
    assert value(samples, "lakecdc_quarantine_rows") == \
        DeltaTable(quarantine_path).to_pyarrow_dataset().count_rows() == 2


def fail_lsn(source_db) -> int:
    """Where the slot would be invalidated: safe_wal_size + the current WAL position. It
    moves only when restart_lsn enters another segment (16 MB steps), unlike either part."""
    with source_db.connect() as conn:
        return conn.execute("SELECT safe_wal_size + (pg_current_wal_lsn() - '0/0')::bigint "
                            "FROM pg_replication_slots WHERE slot_name = %s",
                            [source_db.slot]).fetchone()[0]


@pytest.fixture
def keep_1gb(source_db):
    """``max_slot_wal_keep_size = 1GB`` on the shared cluster for one test (reloadable)."""
    def set_keep(value: str | None) -> None:
        with source_db.connect() as conn:
            conn.execute(f"ALTER SYSTEM {'RESET' if value is None else 'SET'} "
                         f"max_slot_wal_keep_size{'' if value is None else ' = ' + value}")
            conn.execute("SELECT pg_reload_conf()")

    def current() -> str:
        with source_db.connect() as conn:
            return conn.execute("SHOW max_slot_wal_keep_size").fetchone()[0]

    set_keep("'1GB'")
    wait_for(lambda: current() == "1GB", timeout=10)
    yield
    set_keep(None)
    wait_for(lambda: current() == "-1", timeout=10)


def test_metrics_command_serves_state_with_a_part_down_and_no_password(
        source_db, config, tmp_path, keep_1gb):
    setup(config)
    mixed(source_db.dsn, seed=22)
    Shipper(config).run(once=True)
    bronze = rows(config.bronze_path, ["commit_lsn"])

    env = {**cli_env(config),
           "LAKECDC_SOURCE_DSN": password_dsn(source_db),
           "LAKECDC_DASHBOARD_DSN": f"postgresql://postgres:{SECRET}@127.0.0.1:{free_port()}"
                                    f"/nowhere",
           "LAKECDC_LOG_FORMAT": "json"}
    port = free_port()
    fail_before = fail_lsn(source_db)
    stderr_path = tmp_path / "metrics.stderr"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines", "metrics", "--port",
                                 f"127.0.0.1:{port}"], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        def served():
            try:
                return scrape(port)
            except OSError:
                assert proc.poll() is None, stderr_path.read_text()
                return None
        scraped = []
        wait_for(lambda: scraped.append(served()) or scraped[-1] is not None, timeout=60,
                 interval=0.2)
        samples, text = scraped[-1]              # the exporter's first read of the state
        fail_after = fail_lsn(source_db)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    err = stderr_path.read_text()
    assert code == 0, err

    assert value(samples, "lakecdc_slot_wal_status", slot=source_db.slot,
                 wal_status="reserved") == 1
    assert value(samples, "lakecdc_layer_version", layer="bronze") == \
        DeltaTable(config.bronze_path).version()
    assert value(samples, "lakecdc_layer_commit_lsn_bytes", layer="bronze") == \
        pc.max(bronze["commit_lsn"]).as_py()
    assert value(samples, "lakecdc_slot_lag_bytes", slot=source_db.slot) >= 0
    assert value(samples, "lakecdc_source_max_slot_wal_keep_size_bytes",
                 slot=source_db.slot) == 1 << 30
    scraped_fail = value(samples, "lakecdc_slot_safe_wal_size_bytes", slot=source_db.slot) \
        + value(samples, "lakecdc_source_wal_lsn_bytes", slot=source_db.slot)
    assert min(abs(scraped_fail - f) for f in (fail_before, fail_after)) < 1 << 20
    ups = {part: value(samples, "lakecdc_state_up", part=part)
           for part in ("source", "bronze", "silver", "gold", "quarantine", "dashboard")}
    assert ups == {"source": 1, "bronze": 1, "silver": 1, "gold": 1, "quarantine": 1,
                   "dashboard": 0}
    assert value(samples, "lakecdc_layer_version", layer="dashboard") is None
    assert value(samples, "process_resident_memory_bytes") > 0
    assert "lakecdc_rows_total" not in text            # events belong to the running stages
    assert not any(secret in text for secret in secrets_of(source_db))

    records = [json.loads(line) for line in err.splitlines()]      # every line is JSON
    assert any(r["message"].startswith("serving Prometheus metrics on http://127.0.0.1:")
               for r in records)
    down = [r for r in records if r["level"] == "WARNING" and "dashboard" in r["message"]]
    assert down and "postgresql://postgres:***@" in down[0]["message"]
    assert not any(secret in err for secret in secrets_of(source_db))


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_shipper_run_with_a_password_in_the_dsn_never_logs_it(source_db, config, fmt):
    setup(config)
    mixed(source_db.dsn, seed=23)
    env = {**cli_env(config), "LAKECDC_SOURCE_DSN": password_dsn(source_db),
           "LAKECDC_LOG_FORMAT": fmt}
    result = run_cli(["-v", "ship", "--once"], env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("shipped ")
    lines = result.stderr.splitlines()
    assert any("shipped" in line for line in lines)        # -v: the batch lines are there
    if fmt == "json":
        assert all(json.loads(line)["logger"].startswith("lakecdc") for line in lines)
    assert source_db.cluster.password not in result.stdout + result.stderr


def test_run_metrics_port_in_use_is_one_sentence_exit_2(config):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**cli_env(config), "LAKECDC_METRICS_PORT": f"127.0.0.1:{port}"}
        result = run_cli(["run", "--once"], env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"lakecdc: error: cannot serve metrics on 127.0.0.1:{port}")
    result = run_cli(["run", "--once", "--metrics-port", "localhost:http"], cli_env(config))
    assert result.returncode == 2 and "is not a port number" in result.stderr


def test_state_reads_are_shared_and_a_hung_read_does_not_block_scrapes(caplog):
    from prometheus_client import CollectorRegistry, generate_latest

    from pipelines.observe.metrics_state import StateCollector, StateSnapshot

    reads, release = [], threading.Event()

    def read() -> StateSnapshot:
        reads.append(time.monotonic())
        if len(reads) == 3:
            release.wait(30)                 # the source hangs on the third read
        down = len(reads) >= 2
        return StateSnapshot(time.time(), up={"source": not down},
                             errors={"source": "connection refused"} if down else {})

    collector = StateCollector(read, max_age_s=3600, wait_s=0.2)
    registry = CollectorRegistry()
    registry.register(collector)
    with caplog.at_level(logging.DEBUG, logger="lakecdc.metrics"):
        for _ in range(3):                   # one read serves scrapes within max_age_s
            assert b'lakecdc_state_up{part="source"} 1.0' in generate_latest(registry)
        assert len(reads) == 1
        collector.max_age_s = 0
        assert b'lakecdc_state_up{part="source"} 0.0' in generate_latest(registry)
        started = time.monotonic()
        hung = generate_latest(registry)     # the read hangs: the last one is served
        assert time.monotonic() - started < 5 and len(reads) == 3
        assert b'lakecdc_state_up{part="source"} 0.0' in hung
        release.set()
        wait_for(lambda: not collector._worker.is_alive(), timeout=10)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == \
        ["metrics: cannot read source: connection refused"]    # once, not at every read
