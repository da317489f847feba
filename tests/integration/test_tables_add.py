"""``lakecdc tables add/remove/list`` on real Postgres 15 + wal2json, Spark and Delta, with
``lakecdc run`` running and traffic going on.

Truth is the source itself (psycopg); the mirrors are read with delta-rs. A table added under
traffic - its rows from before the add read while changes go on, one ``add`` killed (-9)
right after storing the new set and one killed between backfill chunks, both rerun - ends
with its mirror equal to the source, every row and column. A removed table's mirror stays
as it was while the source goes on changing.
"""

from __future__ import annotations

import datetime as dt
import random
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from deltalake import DeltaTable

from bronze.capture_list import CaptureList
from core.layout import SILVER, mirror_path
from core.locks import is_held, ship_lock_name
from tests.integration.workload import insert
from tests.tests_support import ROOT, cli_env, one_sentence, run_cli, running_shipper, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLES_SQL = """
CREATE TABLE services (id uuid PRIMARY KEY, name text NOT NULL, active boolean,
                       message_limit bigint, created_at timestamptz DEFAULT now());
CREATE TABLE templates (id integer PRIMARY KEY, service_id uuid, name text, body text);
ALTER TABLE templates ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE event_log (at timestamptz, what text);
ALTER TABLE event_log REPLICA IDENTITY FULL;
"""
COLUMNS = {"public.services": ("id", "name", "active", "message_limit", "created_at"),
           "public.templates": ("id", "service_id", "name", "body")}


def body(rng: random.Random) -> str:
    """Text large and random enough to be stored out of line (TOAST)."""
    return "".join(rng.choice("abcdefghij") for _ in range(3000))


def populate(conn, rng: random.Random) -> None:
    for i in range(240):
        conn.execute("INSERT INTO services (id, name, active, message_limit) VALUES "
                     "(%s, %s, %s, %s)", [uuid.UUID(int=rng.getrandbits(128)), f"service {i}",
                                          i % 2 == 0, rng.randint(1, 10**12)])
    for i in range(160):
        conn.execute("INSERT INTO templates VALUES (%s, %s, %s, %s)",
                     [i, uuid.UUID(int=i), f"template {i}", body(rng)])


class Traffic(threading.Thread):
    """Inserts, updates (TOASTed body left alone, and rewritten) and deletes on both
    tables, with notifications now and then, in small transactions until stopped. Updates
    that leave a template's TOASTed body alone go on while its rows are read, so some land
    inside a read's window (the window rule then keeps the body from the read)."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rng, self.stop = dsn, random.Random(seed), threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        import psycopg

        rng = self.rng
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                next_template = 10_000
                while not self.stop.is_set():
                    with conn.transaction():
                        conn.execute("INSERT INTO services (id, name, active) VALUES "
                                     "(%s, 'new', true)", [uuid.UUID(int=rng.getrandbits(128))])
                        conn.execute("UPDATE services SET name = name || '+', active = NOT "
                                     "active WHERE id = (SELECT id FROM services ORDER BY "
                                     "random() LIMIT 1)")
                        conn.execute("INSERT INTO templates VALUES (%s, NULL, 'new', %s)",
                                     [next_template, body(rng)])
                        next_template += 1
                        conn.execute("UPDATE templates SET name = name || '+' WHERE id = "
                                     "(SELECT id FROM templates ORDER BY random() LIMIT 1)")
                        if rng.random() < 0.3:
                            conn.execute("UPDATE templates SET body = %s WHERE id = (SELECT "
                                         "id FROM templates ORDER BY random() LIMIT 1)",
                                         [body(rng)])
                        if rng.random() < 0.3:
                            conn.execute("DELETE FROM services WHERE id = (SELECT id FROM "
                                         "services ORDER BY random() LIMIT 1)")
                            conn.execute("DELETE FROM templates WHERE id = (SELECT id FROM "
                                         "templates ORDER BY random() LIMIT 1)")
                        if rng.random() < 0.3:
                            insert(conn, rng, 2)
                    self.transactions += 1
                    self.stop.wait(0.02)
        except BaseException as exc:            # the test fails on it after join
            self.error = exc

    def finish(self) -> int:
        self.stop.set()
        self.join(timeout=60)
        assert self.error is None, self.error
        assert self.transactions > 20, self.transactions
        return self.transactions


def source_rows(conn, table: str) -> dict:
    cols = ", ".join(COLUMNS[table])
    return {r[0]: tuple(_norm(v) for v in r) for r in conn.execute(f"SELECT {cols} FROM {table}")}


def mirror_rows(config, table: str) -> dict:
    data = DeltaTable(mirror_path(config.lakehouse, table)).to_pyarrow_table(
        columns=list(COLUMNS[table])).to_pylist()
    return {_norm(r["id"]): tuple(_norm(r[c]) for c in COLUMNS[table]) for r in data}


def _norm(value):
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            return value
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    return value


def assert_mirror_is_source(source_db, config, table: str) -> int:
    with source_db.connect() as conn:
        expected = source_rows(conn, table)
    got = mirror_rows(config, table)
    assert got.keys() == expected.keys(), (len(got), len(expected),
                                           list(set(got) ^ set(expected))[:3])
    differing = [k for k in expected if got[k] != expected[k]]
    assert not differing, (len(differing), [(got[k], expected[k]) for k in differing[:2]])
    return len(expected)


def create_docs(conn, rng: random.Random) -> None:
    """``docs``: a composite primary key (one part with a quote in it) and TOASTed bodies,
    30 rows."""
    conn.execute("CREATE TABLE docs (doc integer, lang text, name text, body text, "
                 "PRIMARY KEY (doc, lang))")
    conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
    for doc in range(1, 16):
        for lang in ("en", 'fr "ca"'):
            conn.execute("INSERT INTO docs VALUES (%s, %s, %s, %s)",
                         [doc, lang, f"doc {doc}", body(rng)])


def change_docs(conn, rng: random.Random) -> None:
    """Inside a chunk's window: ten rows updated without their body (wal2json leaves the
    unchanged TOASTed value out: their reads are cut to it), one rewritten whole and one
    deleted (their reads dropped)."""
    conn.execute("UPDATE docs SET name = name || '+' WHERE doc <= 5")
    conn.execute("UPDATE docs SET name = 'rewritten', body = %s "
                 "WHERE doc = 6 AND lang = 'en'", [body(rng)])
    conn.execute("DELETE FROM docs WHERE doc = 6 AND lang <> 'en'")


def assert_docs_mirrored(source_db, config) -> None:
    """The mirror of ``docs`` (read with delta-rs) equals the source's 29 rows."""
    columns = ["doc", "lang", "name", "body"]
    with source_db.connect() as conn:
        expected = set(conn.execute("SELECT doc, lang, name, body FROM docs").fetchall())
    got = {tuple(r[c] for c in columns) for r in DeltaTable(
        mirror_path(config.lakehouse, "public.docs")).to_pyarrow_table(columns=columns)
        .to_pylist()}
    assert len(expected) == 29 and got == expected, [
        row[:3] for row in sorted(got ^ expected, key=str)[:4]]


def start_run(env, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipelines", "run"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))


def stop_run(proc: subprocess.Popen, log) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=180)
    assert code == 0, log.read_text()[-4000:]


@pytest.mark.long
def test_a_table_added_under_traffic_ends_equal_to_its_source_and_a_removed_one_keeps_its_mirror(
        source_db, config, tmp_path, cli_here):
    # The commands run in this process (``cli_here``: what they print and return is the
    # same), but for the kills, which end their process; ``lakecdc run`` is a process of its
    # own, as the shipper ``tables add`` waits for is in production.
    rng = random.Random(17)
    log = tmp_path / "run.log"
    with source_db.connect() as conn:
        conn.execute(TABLES_SQL)
        populate(conn, rng)
        insert(conn, rng, 50)
    env = {**cli_env(config), "LAKECDC_MIRRORS": "all"}       # captured: the counted two
    assert cli_here(["setup"], env).returncode == 0
    store = CaptureList(config.lakehouse)
    assert store.read().active == ("public.notifications", "public.notification_history")

    # Refused before anything changes: a table without a key (FULL identity, no primary
    # key), a table that does not exist; and without a running shipper.
    version = store.read().version
    one_sentence(*_code_err(cli_here(["tables", "add", "public.services"], env)),
                 "no lakecdc shipper is running", "nothing was changed")
    proc = start_run(env, log)
    try:
        with source_db.connect() as conn:
            wait_for(lambda: proc.poll() is not None or is_held(
                conn, ship_lock_name(config.slot)), timeout=120)
        assert proc.poll() is None, log.read_text()[-3000:]
        one_sentence(*_code_err(cli_here(["tables", "add", "public.event_log"], env)),
                     "has no primary key", "nothing was changed")
        one_sentence(*_code_err(cli_here(["tables", "add", "public.nope"], env)),
                     "public.nope does not exist")
        assert store.read().version == version

        traffic = Traffic(source_db.dsn, seed=18)
        traffic.start()
        added = cli_here(["tables", "add", "public.services", "--chunk-rows", "40"], env)
        assert added.returncode == 0, added.stderr[-3000:]
        assert "public.services: captured from" in added.stdout, added.stdout

        # Killed right after storing the set, then between two chunks; each rerun goes on.
        for fault in ("after_capture_stored:1", "after_mirror_chunk:2", "after_mirror_loaded:1"):
            killed = run_cli(["tables", "add", "public.templates", "--chunk-rows", "40"],
                             {**env, "LAKECDC_FAULT": fault})
            assert killed.returncode == 137, (fault, killed.stderr[-3000:])
            assert store.read().state("public.templates") == "snapshotting"
        listed = cli_here(["tables"], env)
        assert listed.returncode == 0 and "snapshotting" in listed.stdout, listed.stdout
        again = cli_here(["tables", "add", "public.templates", "--chunk-rows", "40"], env)
        assert again.returncode == 0, again.stderr[-3000:]
        transactions = traffic.transactions
        wait_for(lambda: traffic.transactions > transactions + 20, timeout=120)
        assert cli_here(["tables", "add", "public.templates"], env).stdout.strip() == \
            "public.templates is already captured."
        traffic.finish()
    finally:
        stop_run(proc, log)
    drained = cli_here(["run", "--once"], env)           # the drains: in this test's JVM
    assert drained.returncode == 0, drained.stderr[-3000:]
    counts = {t: assert_mirror_is_source(source_db, config, t) for t in COLUMNS}
    assert store.read().active == ("public.notifications", "public.notification_history",
                                   "public.services", "public.templates")
    listed = cli_here(["tables"], env).stdout
    for table, n in counts.items():
        line = next(ln for ln in listed.splitlines() if ln.startswith(table + " "))
        assert "captured" in line and f"{n:,}" in line, listed

    # Removed: no longer captured, its mirror kept as it was while the source goes on.
    one_sentence(*_code_err(cli_here(["tables", "remove", "public.notifications"], env)),
                 "counted by service_stats")
    removed = cli_here(["tables", "remove", "public.services"], env)
    assert removed.returncode == 0 and "kept as it was" in removed.stdout, removed.stderr
    kept = mirror_rows(config, "public.services")
    with source_db.connect() as conn:
        conn.execute("UPDATE services SET name = 'after removal'")
        conn.execute("UPDATE templates SET name = 'after removal'")
    assert cli_here(["run", "--once"], env).returncode == 0
    assert mirror_rows(config, "public.services") == kept
    assert assert_mirror_is_source(source_db, config, "public.templates") == counts[
        "public.templates"]
    silver = DeltaTable(config.table_path(SILVER)).to_pyarrow_table(
        columns=["table_name", "columns"]).to_pylist()
    assert not [r for r in silver if r["table_name"] == "services"
                and dict(r["columns"] or []).get("name") == "after removal"]
    assert "removed" in cli_here(["tables"], env).stdout


@pytest.mark.parametrize("guard", ["on", "off"])
def test_a_table_loaded_while_it_changes_ends_equal_to_its_source_and_without_its_guard_not(
        source_db, config, cli_here, guard):
    """A table with a composite primary key and TOASTed bodies, added while its shipper
    runs, in chunks of 10 rows. ``tables add`` is killed right after its first chunk
    (docs 1-5) is in the mirror; then the rows are changed: ten of that chunk updated without
    their body (wal2json leaves the unchanged TOASTed value out), in a chunk not read yet
    one rewritten whole and one deleted. The stream and the mirrors' query take those
    changes while the table is still loading; the rerun loads the rest. Then the mirrors'
    query applies every change it held back, from the load's floor, onto the loaded rows:
    the mirror equals the source, each updated row with the body its chunk read. With
    ``mirror_replay`` off (the negative control) the query applies the changes as they
    come, into a mirror still being loaded: the rewritten row is in it twice."""
    from pipelines.setup.prepare import setup
    from tests.truth import bronze_rows

    rng = random.Random(23)
    with source_db.connect() as conn:
        create_docs(conn, rng)
    setup(config)
    env = {**cli_env(config), "LAKECDC_MIRRORS": "all"}
    if guard == "off":
        env["LAKECDC_UNSAFE_DISABLE_GUARDS"] = "mirror_replay"
    with running_shipper(config):
        killed = run_cli(["tables", "add", "public.docs", "--chunk-rows", "10"],
                         {**env, "LAKECDC_FAULT": "after_mirror_chunk:1"})
        assert killed.returncode == 137, killed.stderr[-3000:]
        loaded = DeltaTable(mirror_path(config.lakehouse, "public.docs")).to_pyarrow_table(
            columns=["doc"]).column("doc").to_pylist()
        assert sorted(loaded) == sorted([d for d in range(1, 6)] * 2), loaded
        with source_db.connect() as conn:
            change_docs(conn, rng)
        wait_for(lambda: any("rewritten" in r["data"] for r in bronze_rows(config.bronze_path)),
                 timeout=120, interval=0.2)
        for step in (["stream", "--once"], ["mirrors", "--once"]):   # while it loads
            done = cli_here(step, env)
            assert done.returncode == 0, done.stderr[-3000:]
        again = run_cli(["tables", "add", "public.docs", "--chunk-rows", "10"], env)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "its 29 current rows loaded" in again.stdout, again.stdout
    if guard == "off":              # the rewritten row: merged while loading, then loaded
        keys = [(r["doc"], r["lang"]) for r in DeltaTable(
            mirror_path(config.lakehouse, "public.docs")).to_pyarrow_table().to_pylist()]
        assert len(keys) == 30 and keys.count((6, "en")) == 2, sorted(keys)
        return
    drained = cli_here(["run", "--once"], env)
    assert drained.returncode == 0, drained.stderr[-3000:]
    assert_docs_mirrored(source_db, config)


@pytest.mark.parametrize("guard", ["on", "off"])
def test_add_reads_rows_only_once_the_shipper_took_up_the_set_and_without_that_a_change_is_lost(
        source_db, config, monkeypatch, guard):
    """The shipper here reads the stored set once every 20 s (``ShipperSet.CHECK_S``), so it
    takes up a new set late. ``tables add`` waits for that before it reads the table's rows,
    so a change committed as soon as it returns reaches bronze. With the wait switched off
    (``capture_ack``: the negative control) that change falls between the read and the
    shipper taking up the set: wal2json leaves it out, the slot moves past it with the next
    commit, and bronze never gets it."""
    from bronze.capture_list import ACK_SUFFIX, ShipperSet
    from bronze.heartbeat import emit
    from bronze.table import BronzeTable
    from pipelines.setup import capture
    from pipelines.setup.prepare import setup
    from tests.truth import bronze_rows

    with source_db.connect() as conn:
        conn.execute("CREATE TABLE extra (id integer PRIMARY KEY, v double precision)")
        conn.execute("INSERT INTO extra SELECT i, 0 FROM generate_series(1, 50) AS i")
    setup(config)
    monkeypatch.setattr(ShipperSet, "CHECK_S", 20.0)
    monkeypatch.setattr(capture, "ACK_TIMEOUT_S", 300.0)
    store, bronze = CaptureList(config.lakehouse), BronzeTable(config.bronze_path)
    app = config.slot + ACK_SUFFIX

    def taken_up(version: int | None = None) -> bool:
        """The shipper peeks with set ``version`` or a newer one (default: the newest)."""
        acked = bronze.app_version(app)
        return acked is not None and acked >= (store.read().version if version is None
                                               else version)

    def taken_up_beating(version: int | None = None) -> bool:
        with source_db.connect() as conn:   # a heartbeat: something to commit the ack with
            emit(conn, config.slot)
        return taken_up(version)

    def in_bronze(value: str) -> bool:
        return any(value in r["data"] for r in bronze_rows(config.bronze_path))

    with running_shipper(config):
        wait_for(taken_up_beating, timeout=120, interval=1)   # it read setup's set at its start
        off = frozenset() if guard == "on" else frozenset({"capture_ack"})
        before = store.read().version           # every later set captures public.extra
        said = capture.add_table(config.with_(disabled_guards=off, mirrors=None), "public.extra",
                                 chunk_rows=100)
        assert "public.extra: captured from" in said and "50 current rows" in said, said
        assert "public.extra: NaN and ±Infinity in v arrive as NULL" in said, said
        source_db.execute("UPDATE extra SET v = 424242 WHERE id = 1")
        # A notification after it: once bronze holds that, the slot has moved past the
        # UPDATE with whichever set the shipper peeked with (a peek decodes anew from there).
        source_db.execute(
            "INSERT INTO notifications (id, service_id, template_id, notification_type, "
            "notification_status, key_type, created_at, reference) VALUES (gen_random_uuid(), "
            "gen_random_uuid(), gen_random_uuid(), 'email', 'created', 'normal', now(), "
            "'after-the-update')")
        wait_for(lambda: in_bronze("after-the-update"), timeout=120, interval=0.2)
        # The shipper peeks with a set that captures public.extra: already with the guard
        # on (tables add waited for that), at its next look at the set without.
        wait_for(lambda: taken_up_beating(before + 1), timeout=300, interval=1)
        source_db.execute("UPDATE extra SET v = 515151 WHERE id = 2")
        wait_for(lambda: in_bronze("515151"), timeout=120, interval=0.2)
    assert in_bronze("424242") is (guard == "on")


def _code_err(result: subprocess.CompletedProcess) -> tuple[int, str]:
    return result.returncode, result.stderr


def test_a_value_its_mirror_cannot_hold_stops_the_load_in_one_sentence(source_db, config):
    """A date of ``infinity`` (no mirror's date holds it) in the table's second chunk: `tables
    add` ends in one sentence, exit 2, the first chunk stays in the mirror, and the table
    stays ``snapshotting`` for a rerun once the value is fixed, which then completes."""
    from pipelines.setup.prepare import setup

    with source_db.connect() as conn:
        conn.execute("CREATE TABLE days (id integer PRIMARY KEY, day date)")
        conn.execute("INSERT INTO days SELECT i, DATE '2026-01-01' + i "
                     "FROM generate_series(1, 30) AS i")
        conn.execute("UPDATE days SET day = 'infinity' WHERE id = 25")
    setup(config)
    env = {**cli_env(config), "LAKECDC_MIRRORS": "all"}
    with running_shipper(config):
        refused = run_cli(["tables", "add", "public.days", "--chunk-rows", "20"], env)
        one_sentence(refused.returncode, refused.stderr,
                     "a value of public.days does not convert to its mirror's type",
                     "rerun `lakecdc tables add`")
        assert CaptureList(config.lakehouse).read().state("public.days") == "snapshotting"
        loaded = DeltaTable(mirror_path(config.lakehouse, "public.days")).to_pyarrow_table()
        assert sorted(loaded.column("id").to_pylist()) == list(range(1, 21))
        source_db.execute("UPDATE days SET day = DATE '2030-01-01' WHERE id = 25")
        again = run_cli(["tables", "add", "public.days", "--chunk-rows", "20"], env)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "its 30 current rows loaded" in again.stdout, again.stdout
