"""``lakecdc backfill snapshot`` on real Postgres 15 + wal2json, Delta and Spark.

The checks here do not use the pipeline's own code:

- ``replay``: silver replayed in ``(commit_lsn, seq)`` order per (table, id) - R/I/U set a
  row, D removes it, an UPDATE that changes the id moves it - must equal the source tables
  (id + dims) at the end. Rows that existed before the slot reach silver only through the
  backfill, so this fails if a row is missed, read twice with different values, or read
  stale after a newer change.
- ``check_bronze_with_reads``: bronze minus its ``R`` rows equals what a witness slot saw;
  ``R`` rows only follow a HIGH watermark message inside its transaction, with
  ``tx_changes`` grown to match.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import uuid
from core.layout import SILVER
from collections import Counter, defaultdict
from types import SimpleNamespace

import psycopg
import pytest
from deltalake import DeltaTable

from bronze.snapshot_backfill import run_snapshot_backfill
from bronze.backfill_source import _reader, read_chunk
from bronze.backfill_staging import staging_path
from bronze.backfill_marks import BACKFILL_PREFIX
from bronze.ship import Shipper
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import ROOT, cli_env, run_cli, wait_for
from tests.truth import Witness, bronze_rows, check_gold
from tests.integration.workload import SERVICES, STATUSES, TEMPLATES, TYPES, insert

pytestmark = pytest.mark.integration

TABLES = ("notifications", "notification_history")


# --- source helpers -----------------------------------------------------------------------

def populate(conn: psycopg.Connection, table: str, n: int, seed: int) -> None:
    """``n`` rows that exist before the slot (no INSERT in the stream)."""
    rng = random.Random(seed)
    with conn.cursor().copy(f"COPY {table} (id, service_id, template_id, notification_type, "
                            "notification_status, key_type, created_at, billable_units, "
                            "personalisation) FROM STDIN") as copy:
        for i in range(n):
            copy.write_row((uuid.UUID(int=rng.getrandbits(128)), rng.choice(SERVICES),
                            rng.choice(TEMPLATES), rng.choice(TYPES), rng.choice(STATUSES),
                            "normal", "2026-01-01T00:00:00Z", i % 7 or None,
                            f"p{i}" if i % 3 else None))


def source_rows(dsn: str) -> dict[tuple[str, str], tuple]:
    rows = {}
    with psycopg.connect(dsn) as conn:
        for table in TABLES:
            for r in conn.execute(f"SELECT id::text, service_id::text, template_id::text, "
                                  f"notification_type::text, notification_status FROM {table}"):
                rows[(table, r[0])] = tuple(r[1:])
    return rows


class Churn(threading.Thread):
    """Status changes, key changes, inserts, deletes and archival moves on random rows."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rng = dsn, random.Random(seed)
        self.stop = threading.Event()
        self.ops: Counter = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                live = [r[0] for r in conn.execute("SELECT id FROM notifications")]
                hist = [r[0] for r in conn.execute("SELECT id FROM notification_history")]
                while not self.stop.is_set():
                    self.step(conn, live, hist)
                    self.stop.wait(0.002)          # pacing, not waiting for anything
        except BaseException as exc:               # reported by the test
            self.error = exc

    def step(self, conn, live: list, hist: list) -> None:
        rng, r = self.rng, self.rng.random()
        if r >= 0.80 and len(live) < 200:   # rows left to change however long the backfill
            r = 0.70                          # takes on a slow machine: insert instead
        if r < 0.45:
            conn.execute("UPDATE notifications SET notification_status = %s WHERE id = ANY(%s)",
                         [rng.choice(STATUSES), rng.sample(live, 8)])
            self.ops["status"] += 1
        elif r < 0.55:
            conn.execute("UPDATE notification_history SET notification_status = %s "
                         "WHERE id = ANY(%s)", [rng.choice(STATUSES), rng.sample(hist, 4)])
            self.ops["history status"] += 1
        elif r < 0.65:
            i = rng.randrange(len(live))
            row = conn.execute("UPDATE notifications SET id = gen_random_uuid() WHERE id = %s "
                               "RETURNING id", [live[i]]).fetchone()
            if row:
                live[i] = row[0]
            self.ops["key change"] += 1
        elif r < 0.80:
            new = conn.execute("INSERT INTO notifications (id, service_id, template_id, "
                               "notification_type, notification_status, key_type, created_at) "
                               "VALUES (gen_random_uuid(), %s, %s, %s, 'created', 'normal', "
                               "now()) RETURNING id", [rng.choice(SERVICES), rng.choice(TEMPLATES),
                                                       rng.choice(TYPES)]).fetchone()[0]
            live.append(new)
            self.ops["insert"] += 1
        elif r < 0.90:
            gone = [live.pop(rng.randrange(len(live))) for _ in range(3)]
            conn.execute("DELETE FROM notifications WHERE id = ANY(%s)", [gone])
            self.ops["delete"] += 1
        else:
            moved = live.pop(rng.randrange(len(live)))
            with conn.transaction():
                conn.execute("INSERT INTO notification_history SELECT * FROM notifications "
                             "WHERE id = %s", [moved])
                conn.execute("DELETE FROM notifications WHERE id = %s", [moved])
            hist.append(moved)
            self.ops["archive"] += 1

    def finish(self) -> Counter:
        self.stop.set()
        self.join(timeout=60)
        assert self.error is None, f"churn failed: {self.error!r}"
        return self.ops


# --- pipeline helpers ---------------------------------------------------------------------

def start_shipper(config, guards: str = "") -> subprocess.Popen:
    env = cli_env(config)
    if guards:
        env["LAKECDC_UNSAFE_DISABLE_GUARDS"] = guards
    return subprocess.Popen([sys.executable, "-m", "pipelines", "ship", "--poll-interval", "0.05",
                             "--max-changes", "300"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop_shipper(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the shipper ignored SIGTERM for 60 s:\n{proc.communicate()[1]}")
    assert code == 0, proc.stderr.read()


def shipper_running(source_db) -> bool:
    with source_db.connect() as conn:
        from core.locks import is_held, ship_lock_name
        return is_held(conn, ship_lock_name(source_db.slot))


@pytest.fixture
def witness(source_db):
    """``witness()`` creates the witness slot (call it right after ``setup``: it must see
    the same WAL as the shipper's slot)."""
    made = []

    def make() -> Witness:
        made.append(Witness(source_db.dsn, source_db.slot + "_w"))
        return made[-1]
    yield make
    for w in made:
        w.drop()


def check_bronze_with_reads(path: str, witnessed: dict[int, list[str]]) -> list[dict]:
    """Bronze without its R rows is exactly what the witness saw; R rows sit after a HIGH
    watermark message in its transaction, whose ``tx_changes`` counts them. Returns them."""
    rows = bronze_rows(path)
    keys = [(r["commit_lsn"], r["seq"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate (commit_lsn, seq) in bronze"
    by_tx: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_tx[r["commit_lsn"]].append(r)
    assert set(by_tx) == set(witnessed), "bronze and the witness hold different transactions"
    reads = []
    for commit, expected in witnessed.items():
        got = sorted(by_tx[commit], key=lambda r: r["seq"])
        assert [r["seq"] for r in got] == list(range(len(got))), f"gap in seq at {commit}"
        assert all(r["tx_changes"] == len(got) for r in got), f"tx_changes wrong at {commit}"
        assert [r["data"] for r in got[:len(expected)]] == expected, f"{commit} differs"
        extra = got[len(expected):]
        assert all(r["action"] == "R" for r in extra), f"unexpected rows at {commit}"
        if extra:
            high = json.loads(expected[-1])
            assert high["action"] == "M" and high["prefix"] == BACKFILL_PREFIX
            assert json.loads(high["content"])["mark"] == "high"
            run = json.loads(high["content"])["run"]
            reads += [{**r, "run": run} for r in extra]
    return reads


def read_key(row: dict) -> tuple[str, str, str]:
    doc = json.loads(row["data"])
    key = next(c["value"] for c in doc["columns"] if c["name"] == "id")
    return row["run"], doc["table"], key


def silver_rows(spark, config) -> list:
    return (spark.read.format("delta").load(config.table_path(SILVER))
            .select("commit_lsn", "seq", "op", "table_name", "id", "old_id", "service_id",
                    "template_id", "notification_type", "notification_status", "error")
            .collect())


def replay(rows) -> dict[tuple[str, str], tuple]:
    """Silver in commit order per (table, id): R/I/U set the row, D removes it."""
    state: dict[tuple[str, str], tuple] = {}
    for r in sorted(rows, key=lambda r: (r.commit_lsn, r.seq)):
        assert r.error is None, f"silver error at {r.commit_lsn}/{r.seq}: {r.error}"
        if r.op in ("R", "I", "U"):
            if r.op == "U" and r.old_id is not None and r.old_id != r.id:
                state.pop((r.table_name, r.old_id), None)
            state[(r.table_name, r.id)] = (r.service_id, r.template_id, r.notification_type,
                                           r.notification_status)
        elif r.op == "D":
            state.pop((r.table_name, r.old_id), None)
        elif r.op == "T":
            state = {k: v for k, v in state.items() if k[0] != r.table_name}
    return state


def check_replay(rows, dsn: str) -> None:
    got, truth = replay(rows), source_rows(dsn)
    missing = set(truth) - set(got)
    extra = set(got) - set(truth)
    stale = {k for k in set(got) & set(truth) if got[k] != truth[k]}
    assert not (missing or extra or stale), (
        f"silver replay differs from the source: {len(missing)} missing, {len(extra)} extra "
        f"(resurrected), {len(stale)} stale rows")


def bronze_metadata_sum(path: str, key: str) -> int:
    return sum(int(h.get(key, 0)) for h in DeltaTable(path).history())


# --- the SQL builds what wal2json writes ---------------------------------------------------

def test_read_rows_are_written_exactly_as_wal2json_writes_an_insert(source_db):
    with source_db.connect() as conn:
        conn.execute('CREATE TABLE odd (id int8 PRIMARY KEY, b bool, f4 real, f8 float8, '
                     'n numeric(10,2), nn numeric, v varchar(20), ch char(3), ts timestamptz, '
                     'a int[], j jsonb, bt bytea, o oid, s2 smallint, "Odd ""name"" é" text, '
                     'g int GENERATED ALWAYS AS (id * 2) STORED, u uuid, iv interval, '
                     'e notification_type, dropped int)')
        conn.execute("ALTER TABLE odd DROP COLUMN dropped")
        w = Witness(source_db.dsn, source_db.slot + "_odd", tables="public.odd")
        try:
            conn.execute(r"""INSERT INTO odd VALUES
              (1, true, 'NaN', '-Infinity', 1.50, 'NaN', E'é"\\ \n\t\u0001/', 'ab', now(),
               '{1,2}', '{"a": [1, 2]}', '\x00ff', 12, -3, 'q', DEFAULT, gen_random_uuid(),
               '1 day', 'sms'),
              (2, false, 1.5e30, 1e-300, -0.01, 12345678901234567890.123456789012345, NULL,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, DEFAULT, NULL, NULL, NULL),
              (3, NULL, 'Infinity', 0.1, 99999999.99, '-Infinity', '', 'abc', '-infinity',
               '{}', 'null', '\x', 0, 32767, '', DEFAULT, NULL, '-1 year 2 mons', 'email')""")
            inserts = [d for tx in w.transactions().values() for d in tx]
        finally:
            w.drop()
    with _reader(source_db.dsn) as reader:
        first = read_chunk(reader, "public.odd", None, 2)
        rest = read_chunk(reader, "public.odd", first.keys[-1], 2)
    assert first.keys == ["1", "2"] and rest.keys == ["3"]
    for wal2json, ours in zip(inserts, first.data + rest.data, strict=True):
        assert ours.startswith('{"action":"R","schema":"public","table":"odd","columns":[')
        # Byte for byte the same columns array as wal2json's INSERT of the same row.
        assert ours[ours.index('"columns":'):] == wal2json[wal2json.index('"columns":'):]


# --- concurrent with changes ---------------------------------------------------------------

def backfill_under_churn(source_db, config, witness, guards: str = ""):
    """Populated tables; setup; shipper running; churn while the backfill runs with small
    chunks; then drain into bronze."""
    with source_db.connect() as conn:
        populate(conn, "notifications", 3000, seed=1)
        populate(conn, "notification_history", 600, seed=2)
    setup(config)
    w = witness()
    shipper = start_shipper(config, guards)
    churn = Churn(source_db.dsn, seed=3)
    try:
        wait_for(lambda: shipper_running(source_db), timeout=60)
        churn.start()
        report = run_snapshot_backfill(config.with_(disabled_guards=frozenset(
            g for g in guards.split(",") if g)), chunk_rows=60, timeout_s=120)
    finally:
        ops = churn.finish()
        stop_shipper(shipper)
    assert report.outcome == "complete", report.summary()
    drained = config.with_(disabled_guards=frozenset(g for g in guards.split(",") if g))
    Shipper(drained).run(once=True)
    assert sum(ops.values()) > 200, ops
    return churn, report, w


@pytest.mark.long
def test_backfill_concurrent_with_changes_never_leaves_a_stale_row_and_gold_stays_exact(
        source_db, config, witness, spark):
    churn, report, w = backfill_under_churn(source_db, config, witness)
    print(report.summary(), dict(churn.ops))
    reads = check_bronze_with_reads(config.bronze_path, w.transactions())
    # Every row read at most once per run, and the window rule really dropped some.
    keys = Counter(read_key(r) for r in reads)
    assert keys and max(keys.values()) == 1
    staged = sum(t.rows for t in report.per_table.values())
    dropped = bronze_metadata_sum(config.bronze_path, "lakecdc.backfill_dropped")
    assert dropped > 0, "no chunk row was changed inside its window: the test proves nothing"
    assert len(reads) + dropped == staged
    # Silver replayed equals the source; gold ignores the reads and stays exact.
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    pipeline.run_once()
    check_replay(silver_rows(spark, config), source_db.dsn)
    check_gold(config.lakehouse, source_db.dsn, config.dashboard)
    # The staged rows are gone once the run is complete; the run is remembered.
    assert DeltaTable(staging_path(config)).to_pyarrow_dataset(
        file_pruning_predicate="kind = 'row'").count_rows() == 0
    again = run_cli(["backfill", "snapshot"], cli_env(config))
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr


@pytest.mark.long
def test_without_the_window_rule_the_replay_check_finds_stale_rows(
        source_db, config, witness, spark):
    backfill_under_churn(source_db, config, witness, guards="backfill_window")
    assert bronze_metadata_sum(config.bronze_path, "lakecdc.backfill_dropped") == 0
    Pipeline(config, spark_factory=lambda: spark).stream(once=True)
    with pytest.raises(AssertionError, match="silver replay differs"):
        check_replay(silver_rows(spark, config), source_db.dsn)


# --- killed and resumed --------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["after_backfill_stage:3", "after_backfill_low:2",
                                   "after_backfill_high:4"])
def test_backfill_killed_then_resumed_reads_every_row_exactly_once(
        source_db, config, witness, fault):
    with source_db.connect() as conn:
        populate(conn, "notifications", 500, seed=4)
        populate(conn, "notification_history", 130, seed=5)
    setup(config)
    w = witness()
    with source_db.connect() as conn:
        insert(conn, random.Random(6), 20)        # streamed changes too
    env = cli_env(config)
    shipper = start_shipper(config)
    try:
        wait_for(lambda: shipper_running(source_db), timeout=60)
        killed = run_cli(["backfill", "snapshot", "--chunk-rows", "100"],
                         {**env, "LAKECDC_FAULT": fault})
        assert killed.returncode == 137, killed.stderr
        resumed = run_cli(["backfill", "snapshot", "--chunk-rows", "100"], env)
        assert resumed.returncode == 0, resumed.stderr
        assert "(resumed)" in resumed.stdout and "complete" in resumed.stdout, resumed.stdout
    finally:
        stop_shipper(shipper)
    Shipper(config).run(once=True)
    reads = check_bronze_with_reads(config.bronze_path, w.transactions())
    keys = Counter(read_key(r) for r in reads)
    assert len({run for run, _, _ in keys}) == 1, "the resume started another run"
    assert max(keys.values()) == 1, "a row was read twice"
    # No concurrent changes while reading: every source row read, each once.
    assert {(t, k) for _, t, k in keys} == set(source_rows(source_db.dsn))
    again = run_cli(["backfill", "snapshot"], env)
    assert again.returncode == 0 and "already complete" in again.stdout


def test_sigterm_stops_between_chunks_a_rerun_finishes_and_new_run_reads_again(
        source_db, config, witness):
    with source_db.connect() as conn:
        populate(conn, "notifications", 1500, seed=7)
    setup(config)
    w = witness()
    env = cli_env(config)
    shipper = start_shipper(config)
    try:
        wait_for(lambda: shipper_running(source_db), timeout=60)
        proc = subprocess.Popen([sys.executable, "-m", "pipelines", "backfill", "snapshot",
                                 "--chunk-rows", "25"], env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: bronze_metadata_sum(config.bronze_path, "lakecdc.backfill_rows") >= 50,
                 timeout=120)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "stopped between chunks" in out, out
        resumed = run_cli(["backfill", "snapshot"], env)
        assert resumed.returncode == 0 and "(resumed)" in resumed.stdout, resumed.stderr
        fresh = run_cli(["backfill", "snapshot", "--new-run", "--chunk-rows", "500"], env)
        assert fresh.returncode == 0 and "complete" in fresh.stdout, fresh.stderr
        assert "(resumed)" not in fresh.stdout
    finally:
        stop_shipper(shipper)
    Shipper(config).run(once=True)
    keys = Counter(read_key(r) for r in check_bronze_with_reads(config.bronze_path,
                                                                 w.transactions()))
    assert max(keys.values()) == 1
    runs = {run for run, _, _ in keys}
    assert len(runs) == 2
    for run in runs:
        assert {(t, k) for r, t, k in keys if r == run} == set(source_rows(source_db.dsn))


# --- refusals ------------------------------------------------------------------------------

def test_an_uncaptured_table_is_refused_with_one_sentence(config):
    result = run_cli(["backfill", "snapshot", "--table", "public.nope"], cli_env(config))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not captured" in result.stderr, result.stderr


def test_without_a_running_shipper_the_backfill_says_so_and_exits_2(source_db, config):
    setup(config)
    result = run_cli(["backfill", "snapshot", "--table", "notifications"], cli_env(config))
    assert result.returncode == 2
    assert "no lakecdc shipper is running" in result.stderr and \
        result.stderr.count("\n") == 1, result.stderr


# --- a transaction visible later than its commit record ------------------------------------

def bronze_changes(path: str) -> list:
    """Bronze change rows shaped like silver's (for ``replay``), parsed with json.loads."""
    rows = []
    for r in bronze_rows(path):
        doc = json.loads(r["data"])
        if doc["action"] not in ("I", "U", "D", "R", "T"):
            continue
        new = {c["name"]: c["value"] for c in doc.get("columns") or ()}
        old = {c["name"]: c["value"] for c in doc.get("identity") or ()}
        rows.append(SimpleNamespace(
            commit_lsn=r["commit_lsn"], seq=r["seq"], op=doc["action"], table_name=doc["table"],
            id=new.get("id"), old_id=old.get("id"), error=None,
            **{c: new.get(c) for c in ("service_id", "template_id", "notification_type",
                                        "notification_status")}))
    return rows


def test_a_change_committed_before_low_but_invisible_to_the_chunk_is_not_read_stale(
        source_db, config, pg_cluster):
    """Commit order is not visibility order in Postgres: with synchronous replication a
    transaction writes its commit record, then waits for the standby before it becomes
    visible. Here it waits for a standby that does not exist, so it commits *before* the
    LOW watermark but is still invisible to the chunk's snapshot: the read would be older
    than a change before it in the stream, and the LSN window alone would keep it."""
    with source_db.connect() as conn:
        populate(conn, "notifications", 40, seed=9)
        target = conn.execute("SELECT id::text FROM notifications ORDER BY id "
                              "OFFSET 20 LIMIT 1").fetchone()[0]
    setup(config)
    admin = psycopg.connect(pg_cluster.dsn(), autocommit=True)
    # Every session of this database commits without waiting for a standby, except the
    # one that makes the late-visible transaction.
    admin.execute(f'ALTER DATABASE "{source_db.name}" SET synchronous_commit = local')
    admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'lakecdc_no_such_standby'")
    admin.execute("SELECT pg_reload_conf()")
    shipper = start_shipper(config)
    late = source_db.connect()
    late.execute("SET synchronous_commit = on")
    pid = late.info.backend_pid
    done = threading.Event()
    try:
        wait_for(lambda: shipper_running(source_db), timeout=60)

        def waiting() -> bool:
            return admin.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                 [pid]).fetchone()[0] == "SyncRep"

        def update():
            late.execute("UPDATE notifications SET notification_status = 'late-visible' "
                         "WHERE id = %s", [target])
            done.set()
        # The checkpointer applies the new setting asynchronously: retry until the commit
        # really waits for the (missing) standby.
        for attempt in range(50):
            thread = threading.Thread(target=update, daemon=True)
            done.clear()
            thread.start()
            wait_for(lambda: done.is_set() or waiting(), timeout=30)
            if not done.is_set():
                break
            thread.join()
        assert waiting(), "could not make a commit wait for a synchronous standby"
        xid = admin.execute("SELECT backend_xid::text::bigint FROM pg_stat_activity "
                            "WHERE pid = %s", [pid]).fetchone()[0]
        report = run_snapshot_backfill(config, tables=["notifications"], chunk_rows=100,
                                       timeout_s=60)
        assert report.outcome == "complete"
    finally:
        admin.execute("SELECT pg_cancel_backend(%s)", [pid])   # commits it locally
        admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        admin.execute("SELECT pg_reload_conf()")
        done.wait(30)
        stop_shipper(shipper)
        late.close()
        admin.close()
    Shipper(config).run(once=True)
    rows = bronze_rows(config.bronze_path)
    update_lsn = next(r["commit_lsn"] for r in rows
                      if r["action"] == "U" and target in r["data"])
    staging = DeltaTable(staging_path(config))
    chunk = next(m for m in staging.to_pyarrow_table(
        filters=[("kind", "=", "chunk")]).to_pylist())
    # The anomaly happened: committed before LOW, yet invisible to the chunk's snapshot...
    assert update_lsn < chunk["low_lsn"] and xid in chunk["in_progress"]
    staged = DeltaTable(staging_path(config), version=staging.version() - 2).to_pyarrow_table(
        filters=[("kind", "=", "row")]).to_pylist()
    stale = next(json.loads(r["data"]) for r in staged if r["key"] == target)
    assert {c["name"]: c["value"] for c in stale["columns"]}["notification_status"] != \
        "late-visible", "the chunk did see the change: nothing was tested"
    # ...so the read was stale: it was dropped, and the stream replays to the source.
    assert not [r for r in rows if r["action"] == "R" and target in r["data"]]
    assert bronze_metadata_sum(config.bronze_path, "lakecdc.backfill_dropped") == 1
    check_replay(bronze_changes(config.bronze_path), source_db.dsn)
