"""``lakecdc verify``: exact → 0, tampered gold or dashboard → 1 with the key in the diff,
``--repair`` → 0 again; writers never blocked; a running pipeline waited for; bad DSN → 2.

Every database here is populated before ``setup`` (rows with no INSERT in the WAL, history
included), then gets traffic with updates, archival, deletes and history purges. Where a
test judges exactness it also checks against the independent truth of ``tests/truth.py``,
so a verify that always said "exact" would fail here; the tamper tests are the negative
control.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from core.layout import GOLD
from core.config import Config
from core.lsn import Lsn
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from pipelines.verify.report import LayerCounts, Verdict, document, drift_sentence, render
from tests.tests_support import ROOT, cli_env, error_line, run_cli, wait_for
from tests.truth import check_gold, source_truth
from tests.integration.workload import (archive, hard_delete, insert, mixed, purge_history,
                                        transition)

KEY_RE = re.compile(r"^([0-9a-f-]{36})\s+([0-9a-f-]{36})\s+(\w+)\s+([\w-]+)\s+"
                    r"(-?[\d,]+)\s+(-?[\d,]+)\s+(-?[\d,]+)$", re.MULTILINE)


@dataclass
class Populated:
    pipeline: Pipeline
    purged: Counter          # history rows purged after setup: the truth still counts them


@pytest.fixture
def populated(source_db, config, spark) -> Populated:
    """2,000 notifications (some moved to history, some of those purged) before setup,
    then mixed traffic and one ``run --once``."""
    rng = random.Random(61)
    with source_db.connect() as conn:
        insert(conn, rng, 2000)
        transition(conn, 0.5, "sending")
        transition(conn, 0.3, "delivered")
        archive(conn, 0.3)
        purge_history(conn, 0.1)       # before the baseline: no longer counted anywhere
    setup(config)
    purged = mixed(source_db.dsn, seed=62)
    with source_db.connect() as conn:
        transition(conn, 0.2, "permanent-failure")
        archive(conn, 0.2)
        hard_delete(conn, 0.05)
        purged += purge_history(conn, 0.1)
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    pipeline.run_once()
    return Populated(pipeline, purged)


@pytest.fixture
def verify(config, capsys, monkeypatch):
    """``lakecdc verify ARGS`` through the real CLI entry point, in this process (the test
    Spark session is reused: no JVM start). Returns (exit code, stdout, stderr)."""
    from pipelines import cli

    for name in [n for n in os.environ if n.startswith("LAKECDC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LAKECDC_MIRRORS", "none")   # as the suite's config fixture
    logger = logging.getLogger("lakecdc")

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        saved = logger.handlers[:], logger.level, logger.propagate
        try:
            code = cli.main(["--source-dsn", config.source_dsn, "--lakehouse", config.lakehouse,
                             "--slot", config.slot, "verify", *args])
        finally:   # the CLI points lakecdc's log at this test's captured stderr: undo that
            logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def temporary_slots(source_db) -> list[str]:
    with source_db.connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'lakecdc_tmp_%' "
            "AND database = current_database()")]


def gold_key_with(spark, config, at_least: int) -> tuple:
    from core.captured import DIMS

    row = (spark.read.format("delta").load(config.table_path(GOLD))
           .where(f"count >= {at_least}").orderBy(*DIMS).first())
    return tuple(row[c] for c in DIMS)


def where(key: tuple) -> str:
    from core.captured import DIMS

    return " AND ".join(f"{c} = '{v}'" for c, v in zip(DIMS, key))


def diff_rows(out: str) -> dict[tuple, tuple[int, int, int]]:
    """The diff table: key → (truth, gold, dashboard)."""
    return {m.groups()[:4]: tuple(int(x.replace(",", "")) for x in m.groups()[4:])
            for m in KEY_RE.finditer(out)}


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("lakecdc: ")]


# --- exact ---------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.long
def test_verify_on_a_populated_database_is_exact_and_pins_no_wal(source_db, config, populated,
                                                                verify):
    truth = +source_truth(source_db.dsn, populated.purged)
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, populated.purged)

    # The real command in its own process: it drives the pipeline past its marker itself.
    result = run_cli(["verify"], cli_env(config))
    assert result.returncode == 0, result.stderr[-3000:]
    gold = re.search(r"^gold: exact, ([\d,]+) keys, ([\d,]+) notifications as of LSN",
                     result.stdout, re.MULTILINE)
    assert gold, result.stdout
    assert (int(gold[1].replace(",", "")), int(gold[2].replace(",", ""))) == \
        (len(truth), sum(truth.values()))
    assert re.search(r"^dashboard: exact, ", result.stdout, re.MULTILINE), result.stdout
    assert "run --once" in result.stdout
    assert temporary_slots(source_db) == []

    # --json: one document with the fields.
    code, out, err = verify("--json")
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    assert doc["exact"] is True
    assert int(Lsn.parse(doc["marker"])) > int(Lsn.parse(doc["lsn"]))
    assert doc["truth"]["total"] == sum(truth.values())
    assert doc["truth"]["purged_from_history"] == sum(populated.purged.values())
    for layer in ("gold", "dashboard"):
        assert doc[layer]["exact"] is True and doc[layer]["differences"] == []
        assert (doc[layer]["keys"], doc[layer]["total"]) == (len(truth), sum(truth.values()))
        Lsn.parse(doc[layer]["watermark"])
    assert isinstance(doc["gold"]["version"], int)
    assert temporary_slots(source_db) == []


@pytest.mark.integration
@pytest.mark.spark
def test_what_verify_cannot_judge_is_one_sentence_and_exit_2(config, populated, verify,
                                                             source_db):
    from core.locks import gold_writer_lock

    # Someone holds the gold lock (as `lakecdc run` would) but nothing ships: verify must
    # wait for them, not drive the pipeline, and give up with one sentence.
    with gold_writer_lock(config.dashboard, config.table_path(GOLD)):
        started = time.monotonic()
        code, out, err = verify("--timeout", "2")
    assert code == 2, err[-3000:]
    assert time.monotonic() - started < 120
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "bronze is at LSN" in lines[0] and "short of verify's marker" in lines[0]
    assert "--timeout" in lines[0]
    assert temporary_slots(source_db) == []

    # A TRUNCATE of history after gold's baseline: gold passes it (count-neutral), but the
    # purged rows' services are unknown, so the truth is too.
    source_db.execute("TRUNCATE notification_history")
    code, out, err = verify()
    assert code == 2, err[-3000:]
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "notification_history was truncated" in lines[0] and "rebuild-gold" in lines[0]


# --- drift and repair ----------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.long
def test_tampered_gold_or_dashboard_exit_1_naming_the_key_and_repair_restores(
        source_db, config, populated, spark, verify):
    truth = +source_truth(source_db.dsn, populated.purged)
    gold_path = config.table_path(GOLD)

    # Gold +1 on one key. The next push carries gold's change to the dashboard too.
    tampered = gold_key_with(spark, config, 2)
    spark.sql(f"UPDATE delta.`{gold_path}` SET count = count + 1 WHERE {where(tampered)}")
    code, out, err = verify()
    assert code == 1, err[-3000:]
    assert len(error_lines(err)) == 1 and error_lines(err)[0].startswith("lakecdc: drift: ")
    assert re.search(r"^gold: 1 key differs, ", out, re.MULTILINE), out
    rows = diff_rows(out)
    assert rows == {tampered: (truth[tampered], truth[tampered] + 1, truth[tampered] + 1)}, out
    assert re.search(r"^total\s", out, re.MULTILINE)

    # Dashboard -1 on another key: named under the dashboard column, gold right there.
    other = next(k for k in sorted(truth) if k != tampered and truth[k] >= 2)
    source_db.execute(f"UPDATE service_stats SET count = count - 1 WHERE {where(other)}")
    code, out, err = verify()
    assert code == 1, err[-3000:]
    assert re.search(r"^dashboard: 2 keys differ, ", out, re.MULTILINE), out
    rows = diff_rows(out)
    assert rows[other] == (truth[other], truth[other], truth[other] - 1), out
    assert rows[tampered] == (truth[tampered], truth[tampered] + 1, truth[tampered] + 1)

    # --repair, through the real rebuild: one document, after and before.
    code, out, err = verify("--repair", "--json")
    assert code == 0, (out[-3000:], err[-3000:])
    doc = json.loads(out)
    assert doc["repaired"] is True and doc["exact"] is True
    assert doc["before"]["exact"] is False
    assert doc["before"]["gold"]["differing_keys"] == 1
    assert doc["before"]["dashboard"]["differing_keys"] == 2
    assert Lsn.parse(doc["gold"]["floor"]) > Lsn.parse(doc["before"]["gold"]["floor"])
    code, out, err = verify()
    assert code == 0, err[-3000:]
    # A rebuild re-baselines: purges before its baseline are no longer counted, and none
    # happened after it.
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)


# --- concurrency ---------------------------------------------------------------------------

class Writer:
    """Small transactions in a loop: inserts, status changes, archival, purges."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn, self.rng = dsn, random.Random(seed)
        self.commits, self.purged = 0, Counter()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                i = 0
                while not self.stop.is_set():
                    i += 1
                    insert(conn, self.rng, 3)
                    if i % 3 == 0:
                        transition(conn, 0.02, "delivered")
                    if i % 5 == 0:
                        archive(conn, 0.01)
                    if i % 7 == 0:
                        self.purged += purge_history(conn, 0.005)
                    self.commits += 1
                    self.stop.wait(0.02)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> "Writer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert self.error is None, self.error


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.long
def test_verify_does_not_block_writers_and_stays_exact_under_traffic(
        source_db, config, populated, verify, monkeypatch):
    import pipelines.verify.reconcile as verify_module

    real_count_at = verify_module.count_at
    seen = {}

    def count_at_while_writers_commit(dsn, point, tables, label="counting"):
        # Inside the consistent point: the temporary slot and the exported snapshot exist.
        # Writers must keep committing now; the count must not see what they commit.
        seen["slots"] = temporary_slots(source_db)
        before = writer.commits
        wait_for(lambda: writer.commits >= before + 10, timeout=60, interval=0.05)
        seen["commits_during_point"] = writer.commits - before
        return real_count_at(dsn, point, tables, label)

    monkeypatch.setattr(verify_module, "count_at", count_at_while_writers_commit)
    with Writer(source_db.dsn, seed=71) as writer:
        wait_for(lambda: writer.commits >= 5, timeout=60)
        before = writer.commits
        code, out, err = verify()
        during = writer.commits - before
    assert code == 0, (out[-3000:], err[-3000:])
    assert len(seen["slots"]) == 1 and seen["commits_during_point"] >= 10
    assert during >= 20, during             # writers kept committing through the verify
    assert temporary_slots(source_db) == []
    assert re.search(r"^gold: exact, ", out, re.MULTILINE), out

    # And independently: drain, then gold = the source's GROUP BY.
    populated.pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn,
               populated.purged + writer.purged)


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.long
def test_verify_waits_for_a_running_pipeline(source_db, config, populated, verify):
    """Also the suite's test of a continuous ``lakecdc run`` in its own process: it takes
    both locks, drives gold and the dashboard past verify's marker under traffic, and stops
    cleanly (exit 0) on SIGTERM, leaving everything exact."""
    import psycopg

    from core.locks import gold_lock_name, is_held, ship_lock_name

    env = cli_env(config)
    proc = subprocess.Popen([sys.executable, "-m", "pipelines", "run"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with Writer(source_db.dsn, seed=81) as writer:
            with psycopg.connect(source_db.dsn, autocommit=True) as conn:
                wait_for(lambda: is_held(conn, ship_lock_name(config.slot)) and is_held(
                    conn, gold_lock_name(config.table_path(GOLD))),
                    timeout=300, interval=0.5)
            code, out, err = verify("--timeout", "400")
        if code != 0:       # the whole report: an assertion's message would be cut short
            pytest.fail(f"verify exited {code}:\n{out}\n{err[-5000:]}", pytrace=False)
        assert "a running pipeline passed the marker" in out, out
        assert re.search(r"^gold: exact, ", out, re.MULTILINE), out
        assert re.search(r"^dashboard: exact, ", out, re.MULTILINE), out
    finally:
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=300)
    assert returncode == 0, proc.stderr.read()[-3000:]
    populated.pipeline.run_once()
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn,
               populated.purged + writer.purged)


# --- people's mistakes ---------------------------------------------------------------------

@pytest.mark.integration
def test_a_source_it_cannot_reach_is_one_sentence_and_exit_2(tmp_path):
    config = Config.load(env={}, source_dsn="postgresql://lakecdc:s3cret@127.0.0.1:1/notify",
                         lakehouse=str(tmp_path / "lakehouse"), slot="lakecdc")
    result = run_cli(["verify"], cli_env(config), timeout=120)
    line = error_line(result)
    assert line.startswith("lakecdc: error: cannot connect to the source database"), line
    assert "s3cret" not in result.stderr
    assert result.stdout == ""


# --- the report, pure ----------------------------------------------------------------------

def test_the_report_shows_each_layer_and_the_differing_keys():
    a = ("a" * 8 + "-0000-0000-0000-" + "0" * 12, "b" * 8 + "-0000-0000-0000-" + "0" * 12,
         "sms", "delivered")
    b = (a[0], a[1], "email", "created")
    truth = {a: 5, b: 2}
    verdict = Verdict(0x1A2B3C, 0x1A2B90, truth, 1, (
        LayerCounts("gold", {a: 6, b: 2}, {"version": 7}),
        LayerCounts("dashboard", {a: 5}, {"gold_version": 7})))
    text = render(verdict)
    assert "gold: 1 key differs, 2 keys, 8 notifications as of LSN 0/1A2B3C (version 7)" in text
    assert "dashboard: 1 key differs, 1 key, 5 notifications as of LSN 0/1A2B3C " \
        "(gold version 7)" in text
    assert diff_rows(text) == {a: (5, 6, 5), b: (2, 2, 0)}
    assert re.search(r"^total\s+7\s+8\s+5$", text, re.MULTILINE), text
    assert not verdict.exact
    doc = document(verdict)
    assert doc["gold"]["differences"] == [{"service_id": a[0], "template_id": a[1],
                                           "notification_type": "sms",
                                           "notification_status": "delivered",
                                           "truth": 5, "gold": 6}]
    assert doc["dashboard"]["differing_keys"] == 1 and doc["exact"] is False
    assert doc["dashboard"]["gold_version"] == 7
    assert drift_sentence(verdict).startswith(
        "gold on 1 key and dashboard on 1 key differ from the source at LSN 0/1A2B3C")
    exact = Verdict(1, 2, truth, 0, (LayerCounts("gold", dict(truth)),))
    assert exact.exact and "gold: exact, 2 keys, 7 notifications" in render(exact)
    assert render(exact).count("\n") == 2          # no diff table when exact


# --- silver read only once it holds what gold and the dashboard hold -----------------------

@pytest.mark.spark
def test_silver_holds_a_transaction_only_once_every_row_of_it_is_appended(spark, tmp_path):
    """The running stream commits gold (and pushes its step) beside silver's append of the
    same batch, so verify waits on ``silver_holds`` before reading silver's ranges; a split
    transaction must not count as held until its last row is in."""
    from gold.asof import silver_holds
    from silver.schema import SILVER_CHANGES
    from silver.writer import ensure_table

    path = str(tmp_path / "changes")
    ensure_table(spark, path, SILVER_CHANGES, "test")
    names = SILVER_CHANGES.fieldNames()

    def append(*rows):      # (commit_lsn, seq, tx_changes)
        spark.createDataFrame(
            [{**dict.fromkeys(names), "commit_lsn": c, "seq": s, "tx_changes": n, "lsn": c}
             for c, s, n in rows], SILVER_CHANGES).write.format("delta").mode(
            "append").save(path)

    assert not silver_holds(spark, path, 100)             # nothing yet
    append((100, 0, 1), (200, 0, 3), (200, 1, 3))          # 200 split across two batches
    assert silver_holds(spark, path, 100)
    assert not silver_holds(spark, path, 200)
    assert not silver_holds(spark, path, 250)
    append((200, 2, 3))
    assert silver_holds(spark, path, 200)
    append((300, 0, 2))                                    # a later commit, itself partial
    assert silver_holds(spark, path, 250) and silver_holds(spark, path, 200)
    assert not silver_holds(spark, path, 300)
