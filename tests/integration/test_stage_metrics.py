"""Per-stage Prometheus exporters and the shipper's WAL-safety events, checked against facts
the pipeline's code does not produce, and the peek bound.

- ``lakecdc ship --metrics-port`` as a real subprocess: its heartbeat counter equals the
  heartbeat messages a witness slot sees in the WAL, its reconnect counter (by reason)
  equals the shipper sessions the test ended with ``pg_terminate_backend``, its row and
  transaction counters equal bronze; it serves the slot's and bronze's state and nothing
  of the other layers.
- Every stage command takes ``--metrics-port`` / ``LAKECDC_METRICS_PORT`` (a busy port is one
  sentence, exit 2, before any work); ``ship`` and ``run`` refuse a negative heartbeat
  interval or backoff.
- The stream (silver and gold) and push exporters (Spark): each layer's events equal its
  table; the continuous push (``gold.feeder.DashboardFeeder(on_result=...)``, as ``lakecdc run`` and
  ``lakecdc push`` use it) records every push: rows equal what the dashboard received, the
  pushed version equals the dashboard's progress row.
- A peek that outlives ``--peek-timeout``: one sentence, exit 2, nothing in bronze, the slot
  where it was; the same backlog then ships whole with a larger timeout.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import threading

import psycopg
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from tests.integration.test_observability import password_dsn, rows, scrape, secrets_of, value

from bronze.heartbeat import MIN_LAG_BYTES
from bronze.heartbeat import PREFIX as HEARTBEAT_PREFIX
from bronze.ship import Shipper
from core.layout import GOLD, SILVER
from core.lsn import Lsn
from core.storage import gold_key
from bronze.session_loss import RECONNECT_REASONS
from pipelines.observe.metrics import pipeline_exporter
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import ROOT, cli_env, free_port, run_cli, wait_for
from tests.integration.workload import insert, mixed

pytestmark = [pytest.mark.integration]

MB = 1 << 20


def heartbeats_in_wal(source_db, witness_slot: str) -> int:
    """Heartbeat messages of this test's shipper in the WAL, as a second slot decodes them
    (plain SQL; the shipper's own peek filters them out)."""
    with source_db.connect() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
            "'format-version', '2', 'add-tables', 'public.notifications') "
            "WHERE data::json ->> 'action' = 'M' AND data::json ->> 'prefix' = %s "
            "AND data::json ->> 'content' = %s",
            [witness_slot, HEARTBEAT_PREFIX, source_db.slot]).fetchone()[0]


def slot_lag(source_db) -> int:
    """WAL inserted past the slot (the insert position: a non-transactional message may not
    be written out of the WAL buffers yet, and pg_current_wal_lsn() would miss it)."""
    with source_db.connect() as conn:
        return conn.execute("SELECT (pg_current_wal_insert_lsn() - confirmed_flush_lsn)::bigint "
                            "FROM pg_replication_slots WHERE slot_name = %s",
                            [source_db.slot]).fetchone()[0]


def shipper_pids(source_db) -> list[int]:
    with source_db.connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name "
            "LIKE 'lakecdc ship%%' AND backend_type = 'client backend'", [source_db.name])]


def wal_elsewhere(source_db, megabytes: int) -> None:
    """WAL in another database of the cluster: nothing the slot can decode."""
    with psycopg.connect(source_db.cluster.dsn(), autocommit=True) as conn:
        for _ in range(megabytes):
            conn.execute("SELECT pg_logical_emit_message(false, 'elsewhere', repeat('y', %s))",
                         [MB])


def state_parts(samples: dict) -> set[str]:
    return {dict(labels)["part"] for (name, labels) in samples
            if name == "lakecdc_state_up"}


def event_layers(samples: dict) -> set[str]:
    return {dict(labels)["layer"] for (name, labels) in samples
            if name == "lakecdc_rows_total"}


# --- the shipper ---------------------------------------------------------------------------

def test_ship_metrics_count_heartbeats_and_reconnects_seen_on_the_source(
        source_db, config, tmp_path):
    setup(config)
    witness = f"{source_db.slot}_w"
    with source_db.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", [witness])
    port = free_port()
    # The flags override the environment: heartbeats off and a 30 s backoff there.
    env = {**cli_env(config), "LAKECDC_SOURCE_DSN": password_dsn(source_db),
           "LAKECDC_METRICS_PORT": f"127.0.0.1:{port}", "LAKECDC_HEARTBEAT_INTERVAL": "0",
           "LAKECDC_RECONNECT_MAX_BACKOFF": "30"}
    log = tmp_path / "ship.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines", "ship", "--poll-interval", "0.05",
             "--heartbeat-interval", "0.2", "--reconnect-max-backoff", "0.2"],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    rng = random.Random(5)
    terminated = 0
    try:
        def served():
            assert proc.poll() is None, log.read_text()
            try:
                return scrape(port)[0]
            except OSError:
                return None

        def metric(name, **labels):
            samples = served()
            return None if samples is None else value(samples, name, **labels)

        with source_db.connect() as conn:
            insert(conn, rng, 5)
        wait_for(lambda: metric("lakecdc_rows_total", layer="bronze") == 5, timeout=30)

        # Heartbeats: WAL written elsewhere until the shipper sends some and passes them.
        for _ in range(3):
            wal_elsewhere(source_db, 2)
            wait_for(lambda: slot_lag(source_db) < MIN_LAG_BYTES, timeout=30)
        sent = metric("lakecdc_ship_heartbeats_total")
        assert sent == heartbeats_in_wal(source_db, witness) >= 3

        # Reconnects: end the shipper's session twice; each time it comes back by itself.
        for n in (1, 2):
            wait_for(lambda: len(shipper_pids(source_db)) == 1, timeout=30)
            (pid,) = shipper_pids(source_db)
            with source_db.connect() as conn:
                terminated += conn.execute("SELECT pg_terminate_backend(%s, 10000)",
                                           [pid]).fetchone()[0]
            wait_for(lambda: metric("lakecdc_ship_reconnects_total",
                                    reason="admin_shutdown") == n, timeout=30)
            assert pid not in shipper_pids(source_db)
            with source_db.connect() as conn:
                insert(conn, rng, 3)
        wait_for(lambda: metric("lakecdc_rows_total", layer="bronze") == 11, timeout=30)
        # The state is read again at a scrape once the last read is 5 s old.
        wait_for(lambda: metric("lakecdc_layer_version", layer="bronze") ==
                 DeltaTable(config.bronze_path).version(), timeout=30, interval=0.5)
        samples, text = scrape(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        with source_db.connect() as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", [witness])
        output = log.read_text()
        print(output)                         # shown when the test fails
    assert code == 0, output

    assert terminated == 2
    assert {reason: value(samples, "lakecdc_ship_reconnects_total", reason=reason)
            for reason in RECONNECT_REASONS} == {
        reason: (2 if reason == "admin_shutdown" else 0) for reason in RECONNECT_REASONS}
    assert output.count("reconnected to the source after") == 2
    assert output.count("reconnect attempt 1 in 0.2s") == 2      # --reconnect-max-backoff
    assert output.count("(session lost: admin_shutdown)") == 2
    # No heartbeat since: the slot stayed close to the end of the WAL.
    assert value(samples, "lakecdc_ship_heartbeats_total") == sent

    bronze = rows(config.bronze_path, ["commit_lsn"])
    assert value(samples, "lakecdc_rows_total", layer="bronze") == bronze.num_rows == 11
    assert value(samples, "lakecdc_transactions_total", layer="bronze") == \
        len(pc.unique(bronze["commit_lsn"])) == 3
    # The shipper's stage: its own layer's events, the slot's and bronze's state only.
    assert event_layers(samples) == {"bronze"}
    assert state_parts(samples) == {"source", "bronze"}
    assert value(samples, "lakecdc_slot_exists", slot=source_db.slot) == 1
    assert value(samples, "lakecdc_layer_version", layer="bronze") == \
        DeltaTable(config.bronze_path).version()
    assert value(samples, "lakecdc_layer_version", layer="gold") is None
    assert "lakecdc_push_gold_version" not in text
    assert not any(secret in text + output for secret in secrets_of(source_db))


@pytest.mark.parametrize("command", ["ship", "stream", "push", "run"])
def test_every_stage_serves_metrics_on_the_port_it_is_given(config, command):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        by_flag = run_cli([command, "--once", "--metrics-port", f"127.0.0.1:{port}"],
                          cli_env(config), timeout=120)
        by_env = run_cli([command, "--once"],
                         {**cli_env(config), "LAKECDC_METRICS_PORT": f"127.0.0.1:{port}"},
                         timeout=120)
    for result in (by_flag, by_env):
        assert result.returncode == 2, result.stderr
        assert result.stderr == (f"lakecdc: error: cannot serve metrics on 127.0.0.1:{port} "
                                 "(Address already in use); choose another port "
                                 "(--metrics-port, LAKECDC_METRICS_PORT).\n")


@pytest.mark.parametrize("command", ["ship", "run"])
@pytest.mark.parametrize("flag", ["--heartbeat-interval=-1", "--reconnect-max-backoff=0"])
def test_shipper_safety_flags_refuse_impossible_values(config, command, flag):
    result = run_cli([command, "--once", flag], cli_env(config), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"lakecdc: Invalid value for '{flag.split('=')[0]}'")
    assert len(result.stderr.strip().splitlines()) == 1


# --- the stream (silver and gold) and the continuous push -----------------------------------

@pytest.mark.spark
def test_stream_and_continuous_push_exporters_equal_their_tables(source_db, config, spark):
    with source_db.connect() as conn:
        insert(conn, random.Random(8), 40)           # the baseline: gold's seed
    setup(config)
    mixed(source_db.dsn, seed=31)
    Shipper(config).run(once=True)
    bronze = rows(config.bronze_path, ["commit_lsn"])

    gold_path = config.table_path(GOLD)
    push_metrics = pipeline_exporter(config, "127.0.0.1:0", max_age_s=0, stage="push")
    with push_metrics as pm, source_db.connect() as dash:
        def pushed_version():
            row = dash.execute("SELECT gold_version FROM lakecdc_push_progress WHERE "
                               "gold_table = %s", [gold_key(gold_path)]).fetchone()
            return None if row is None else row[0]

        pusher = Pipeline(config, spark_factory=lambda: spark, push_interval_s=0.1,
                          metrics=pm)
        assert pusher.seed_gold_from_baseline()
        seeded = DeltaTable(gold_path).version()
        stop, failed = threading.Event(), []
        thread = threading.Thread(target=_run, args=(pusher, stop, failed))
        thread.start()
        try:
            wait_for(lambda: failed or pushed_version() == seeded, timeout=30)
            assert not failed, failed
            first = dash.execute("SELECT count(*) FROM service_stats").fetchone()[0]

            with pipeline_exporter(config, "127.0.0.1:0", max_age_s=0, stage="stream") as sm:
                Pipeline(config, spark_factory=lambda: spark, metrics=sm).stream(once=True)
                samples, _ = scrape(sm.port)
            silver = rows(config.table_path(SILVER), ["commit_lsn"])
            assert silver.num_rows == bronze.num_rows > 100
            gold = DeltaTable(gold_path)
            wait_for(lambda: pushed_version() == gold.version() > seeded, timeout=30)
            pushes = value(scrape(pm.port)[0], "lakecdc_batch_duration_seconds_count",
                           layer="dashboard")
            wait_for(lambda: value(scrape(pm.port)[0], "lakecdc_batch_duration_seconds_count",
                                   layer="dashboard") > pushes, timeout=30)  # and one no-op
            pushed, _ = scrape(pm.port)
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not failed, failed
        second = dash.execute("SELECT count(*) FROM service_stats WHERE source_commit_lsn = "
                              "(SELECT source_commit_lsn FROM lakecdc_push_progress WHERE "
                              "gold_table = %s)", [gold_key(gold_path)]).fetchone()[0]
        assert second > 0

    # The stream's stage: silver's rows equal its table, gold's rows and transactions equal
    # silver's; each layer's state as its table holds it.
    assert event_layers(samples) == {"silver", "gold"}
    assert state_parts(samples) == {"silver", "quarantine", "gold"}
    assert value(samples, "lakecdc_rows_total", layer="silver") == silver.num_rows
    assert value(samples, "lakecdc_quarantine_rows") == 0
    assert value(samples, "lakecdc_layer_commit_lsn_bytes", layer="silver") == \
        pc.max(silver["commit_lsn"]).as_py()
    assert value(samples, "lakecdc_rows_total", layer="gold") == silver.num_rows
    assert value(samples, "lakecdc_transactions_total", layer="gold") == \
        len(pc.unique(silver["commit_lsn"]))
    assert value(samples, "lakecdc_layer_version", layer="gold") == gold.version()

    # The continuous push: a full push of the seed (every row new), then an incremental one
    # that wrote exactly the rows now carrying its watermark; no-op pushes count 0 rows.
    assert event_layers(pushed) == {"dashboard"}
    assert state_parts(pushed) == {"dashboard"}
    assert value(pushed, "lakecdc_rows_total", layer="dashboard") == first + second
    assert value(pushed, "lakecdc_push_gold_version") == gold.version() == \
        value(pushed, "lakecdc_layer_version", layer="dashboard")
    assert value(pushed, "lakecdc_batch_duration_seconds_count", layer="dashboard") >= 3


def _run(pusher: Pipeline, stop: threading.Event, failed: list) -> None:
    try:
        pusher.push(once=False, stop=stop)
    except BaseException as exc:          # reported by the test, not lost in the thread
        failed.append(exc)
        stop.set()


# --- the peek bound -------------------------------------------------------------------------

BACKLOG = 300_000


def test_a_peek_longer_than_the_timeout_is_one_sentence_and_changes_nothing(source_db, config):
    setup(config)
    with source_db.connect() as conn:
        # One transaction: wal2json decodes it whole whatever --max-changes says, and at
        # 300k rows that takes seconds (spilling past logical_decoding_work_mem) anywhere.
        conn.execute("INSERT INTO notifications (id, service_id, template_id, "
                     "notification_type, notification_status, key_type, created_at) "
                     "SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'sms', "
                     "'created', 'normal', now() FROM generate_series(1, %s)", [BACKLOG])
        slot_before = conn.execute("SELECT confirmed_flush_lsn, restart_lsn FROM "
                                   "pg_replication_slots WHERE slot_name = %s",
                                   [source_db.slot]).fetchone()
    version = DeltaTable(config.bronze_path).version()

    result = run_cli(["ship", "--once", "--peek-timeout", "1"], cli_env(config), timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"lakecdc: error: a peek or advance of slot {source_db.slot} did not finish within "
        "--peek-timeout 1s; nothing was stored or advanced: raise --peek-timeout (one "
        "transaction is always decoded whole), or lower --max-changes.\n")
    bronze = DeltaTable(config.bronze_path)
    assert bronze.version() == version
    assert bronze.to_pyarrow_dataset().count_rows() == 0
    with source_db.connect() as conn:
        # Not advanced. Postgres itself may move restart_lsn while a peek decodes (to a
        # running-transactions record the confirmed position is already past), never
        # beyond that position.
        confirmed, restart, active = conn.execute(
            "SELECT confirmed_flush_lsn, restart_lsn, active_pid FROM pg_replication_slots "
            "WHERE slot_name = %s", [source_db.slot]).fetchone()
        assert (confirmed, active) == (slot_before[0], None)
        assert Lsn.parse(slot_before[1]) <= Lsn.parse(restart) <= Lsn.parse(confirmed)

    # The same backlog with the default timeout: shipped whole, so the timeout was the cause.
    result = run_cli(["ship", "--once"], cli_env(config), timeout=300)
    assert result.returncode == 0, result.stderr
    assert DeltaTable(config.bronze_path).to_pyarrow_dataset().count_rows() == BACKLOG
