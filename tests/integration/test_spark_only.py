"""Where only Spark can reach storage (``LAKECDC_WRITER=spark``): every table written by
Spark alone, and exact.

The lakehouse is on moto's S3, which checks keys (``tests.cloud_servers.guarded_s3``). The
keys are in Spark's own settings only (a ``spark-defaults.conf``-style file that
``spark-submit`` reads), as a Databricks cluster's Unity Catalog external location holds
them: the CLI's environment has none, so delta-rs and pyarrow cannot reach the bucket, and
anything lakecdc wrote without Spark would fail.

- ``setup`` on a populated database, traffic, a shipper killed after its bronze commit,
  ``run --once``: bronze equals what a second slot witnessed, gold equals a ``GROUP BY`` of
  the source, the dashboard equals gold, every mirror equals its table, ``status`` reads
  every layer and table size, and every commit of every table in the bucket was made by
  Spark.
- (``soak``, in ``make bench``) the same, then ``verify`` and ``maintain --once``: still
  exact (in-process, on local disk, ``test_spark_writes_mirrors`` runs them in CI).
- (``soak``) the continuous ``run`` under traffic, killed with ``kill -9`` once gold has
  moved, then restarted and drained: exact.

This test holds the keys itself, to read the tables (delta-rs) as an independent witness.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable
from psycopg import sql

from core.commits import parse_commit_metadata
from core.layout import mirror_path
from tests.cloud_servers import guarded_s3
from tests.tests_support import ROOT, cli_env, run_cli, wait_for
from tests.truth import Witness, check_bronze, dashboard_counts, source_truth
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with guarded_s3(tmp_path_factory.mktemp("guarded-s3")) as server:
        yield server


@pytest.fixture
def lakehouse(s3):
    bucket = f"lakecdc-{uuid.uuid4().hex[:12]}"
    s3.make_bucket(bucket)
    return bucket, f"s3://{bucket}/lakehouse"


def _env(config, s3, lakehouse: str, properties) -> dict[str, str]:
    """The CLI's environment: the endpoint and region, no keys; Spark's settings hold them."""
    env = {k: v for k, v in cli_env(config).items() if not k.startswith("AWS_")}
    env.update(**s3.env(), **s3.spark_keys(properties), LAKECDC_LAKEHOUSE=lakehouse,
               LAKECDC_WRITER="spark", LAKECDC_MIRRORS="all")
    return env


def _options(s3) -> dict[str, str]:
    """This test's own keys, for its delta-rs reads."""
    return {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": s3.key_id,
            "AWS_SECRET_ACCESS_KEY": s3.secret}


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr[-4000:]
    return result


class OneProcess:
    """``lakecdc`` commands one after another in one child process, each as ``python -m
    pipelines ARGS`` runs it (``pipelines.cli.main``: its own output and exit code), all on
    one Spark JVM, as the tasks of a Databricks job share their cluster's. A fresh JVM's
    start, its S3 connector and its first Delta jobs cost each command 15-30 s here; commands
    that follow one another share them. The child's environment is ``env``; a command's own
    variables (``run``'s ``env``) are set for that command alone. A fault point's
    ``os._exit(137)`` ends the process, as it ends a command's own."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        results, theirs = os.pipe()
        with open(log, "ab") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from tests.integration.test_spark_only import serve; "
                 "serve()", str(theirs)], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                stdout=sink, stderr=subprocess.STDOUT, pass_fds=(theirs,), text=True)
        os.close(theirs)
        self.log = log
        self._results = os.fdopen(results)

    def run(self, args: list[str], env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
        self.proc.stdin.write(json.dumps({"args": args, "env": env or {}}) + "\n")
        self.proc.stdin.flush()
        if not select.select([self._results], [], [], timeout)[0]:
            self.proc.kill()
            raise AssertionError(f"lakecdc {' '.join(args)}: not done within {timeout}s")
        line = self._results.readline()
        if not line:                            # the process ended in the command
            code = self.proc.wait(timeout=60)
            return subprocess.CompletedProcess(args, code, "", self.log.read_text()[-4000:])
        done = json.loads(line)
        return subprocess.CompletedProcess(args, done["code"], done["stdout"], done["stderr"])

    def __enter__(self) -> "OneProcess":
        return self

    def __exit__(self, *_exc) -> None:
        if self.proc.poll() is None:            # its commands done: stdin closed, it ends
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._results.close()


def serve() -> None:
    """``OneProcess``'s child: a command per line on stdin, its result a line on the file
    descriptor given; the process ends as ``pipelines.cli.process_entry`` ends it."""
    import io

    from pipelines.cli.main import main

    results = os.fdopen(int(sys.argv[1]), "w")
    os.umask(0o077)
    for line in sys.stdin:
        request = json.loads(line)
        environ, streams = dict(os.environ), (sys.stdout, sys.stderr)
        os.environ.update(request["env"])
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        try:
            code = main(request["args"])
        finally:
            out, err = sys.stdout.getvalue(), sys.stderr.getvalue()
            sys.stdout, sys.stderr = streams
            os.environ.clear()
            os.environ.update(environ)
        results.write(json.dumps({"code": code, "stdout": out, "stderr": err}) + "\n")
        results.flush()
    os._exit(0)


def _writers(s3, bucket: str) -> dict[str, Counter]:
    """Per table in the bucket, how many of its commits each engine made (the commit's
    ``engineInfo`` for Spark; delta-rs writes ``clientVersion`` instead)."""
    client = s3.client()
    found: dict[str, Counter] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            key = item["Key"]
            if "/_delta_log/" not in key or not key.endswith(".json"):
                continue
            table = key.split("/_delta_log/")[0]
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
            for line in body.splitlines():
                info = json.loads(line).get("commitInfo")
                if info is not None:
                    engine = info.get("engineInfo") or info.get("clientVersion") or "unknown"
                    found.setdefault(table, Counter())[engine.split("/")[0]] += 1
    return found


def _gold(s3, lakehouse: str) -> dict:
    rows = DeltaTable(f"{lakehouse}/gold/service_stats",
                      storage_options=_options(s3)).to_pyarrow_table().to_pylist()
    return {(r["service_id"], r["template_id"], r["notification_type"],
             r["notification_status"]): r["count"] for r in rows if r["count"]}


def _check_exact(s3, lakehouse: str, source_dsn: str, purged: Counter) -> None:
    truth = {k: v for k, v in source_truth(source_dsn, purged).items() if v}
    assert sum(truth.values()) > 0
    gold = _gold(s3, lakehouse)
    assert gold == truth, f"gold differs from the source on {len(set(gold) ^ set(truth))} keys"
    assert {k: v for k, v in dashboard_counts(source_dsn).items() if v} == gold


def _mirror_equals_source(s3, lakehouse: str, dsn: str, table: str) -> bool:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(sql.SQL("SELECT * FROM {}").format(
            sql.Identifier(*table.split(".", 1))))
        columns = [d.name for d in cur.description]
        source = {tuple(_plain(v) for v in row) for row in cur}
    mirror = DeltaTable(mirror_path(lakehouse, table), storage_options=_options(s3)
                        ).to_pyarrow_table(columns=columns).to_pylist()
    return source == {tuple(_plain(r[c]) for c in columns) for r in mirror}


def _plain(value):
    """A value as both sides can hold it: timestamps in UTC, UUIDs as their text."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc)
    return str(value) if isinstance(value, uuid.UUID) else value


def _setup_and_run(source_db, config, s3, root: str, env) -> Counter:
    """``setup`` on a populated database, traffic, ``run --once``: exact. Returns the
    history rows purged after setup (still counted)."""
    mixed(source_db.dsn, seed=71)      # a populated database first (rows purged before
    _ok(run_cli(["setup"], env, timeout=600))       # setup were never counted)
    purged = mixed(source_db.dsn, seed=72)
    _ok(run_cli(["run", "--once"], env, timeout=900))
    _check_exact(s3, root, source_db.dsn, purged)
    for table in config.tables:
        assert _mirror_equals_source(s3, root, source_db.dsn, table), table
    return purged


def _all_by_spark(s3, bucket: str) -> None:
    writers = _writers(s3, bucket)
    for table in ("bronze/wal2json_changes", "silver/changes", "gold/service_stats"):
        assert f"lakehouse/{table}" in writers, f"{table} is not in the bucket"
    not_spark = {t: dict(c) for t, c in writers.items() if set(c) != {"Apache-Spark"}}
    assert not not_spark, f"commits not made by Spark: {not_spark}"


@pytest.mark.long
def test_every_table_is_written_by_spark_alone_and_exact(source_db, config, s3, lakehouse,
                                                         tmp_path):
    """With a shipper killed between its bronze commit and the slot advance first: bronze
    equals what a second slot witnessed, exactly once (the progress map in the commit's
    metadata decides what is new on restart); gold's baseline equals the source's GROUP BY
    at setup and the mirrors hold every row, loaded by setup. Two processes
    (``OneProcess``): ``setup`` and the shipper killed in it; ``run --once`` and ``status``."""
    bucket, root = lakehouse
    env = _env(config, s3, root, tmp_path / "spark.conf")
    options = _options(s3)
    mixed(source_db.dsn, seed=71)      # a populated database first (rows purged before
    truth_at_setup = source_truth(source_db.dsn)    # setup were never counted)
    with OneProcess(env, tmp_path / "setup-and-ship.log") as first:
        _ok(first.run(["setup"]))
        witness = Witness(source_db.dsn, source_db.slot + "_w")
        try:
            baseline = DeltaTable(f"{root}/gold/_baseline", storage_options=options
                                  ).to_pyarrow_table().to_pylist()
            counted = Counter({(r["service_id"], r["template_id"], r["notification_type"],
                                r["notification_status"]): r["count"] for r in baseline})
            assert +counted == +truth_at_setup and sum(counted.values()) > 0
            with psycopg.connect(source_db.dsn) as conn:
                rows = conn.execute("SELECT count(*) FROM notifications").fetchone()[0]
            assert DeltaTable(f"{root}/silver/tables/public/notifications",
                              storage_options=options).to_pyarrow_dataset().count_rows() == rows

            purged = mixed(source_db.dsn, seed=72)
            killed = first.run(["ship", "--once"], {"LAKECDC_FAULT": "after_bronze_commit:1"})
            assert killed.returncode == 137, killed.stderr[-3000:]
            with OneProcess(env, tmp_path / "run-and-status.log") as second:
                _ok(second.run(["run", "--once"]))
                status = json.loads(_ok(second.run(["status", "--json"])).stdout)
            bronze = f"{root}/bronze/wal2json_changes"
            check_bronze(bronze, witness.transactions(), options)
            # Each bronze commit: one app transaction, the whole progress map in its metadata.
            table = DeltaTable(bronze, storage_options=options)
            metas = [parse_commit_metadata(c.get("userMetadata"), "bronze")
                     for c in table.history()]
            newest = next(m for m in metas if m is not None)
            assert table.transaction_version(source_db.slot + ":end_lsn") == newest["end_lsn"]
            assert table.transaction_version(source_db.slot) is None
            assert newest["apps"][source_db.slot] == newest["commit_lsn"] == max(
                witness.transactions())
        finally:
            witness.drop()
    _check_exact(s3, root, source_db.dsn, purged)
    for table_name in config.tables:
        assert _mirror_equals_source(s3, root, source_db.dsn, table_name), table_name
    assert {layer["layer"]: layer["note"] for layer in status["layers"]
            if layer["layer"] in ("bronze", "silver", "gold")} == dict.fromkeys(
        ("bronze", "silver", "gold"), ""), status["layers"]
    sizes = {t["table"]: t["live_files"] for t in status["tables"]}
    assert sizes.get("gold", 0) > 0 and sizes.get("bronze", 0) > 0, sizes
    _all_by_spark(s3, bucket)


@pytest.mark.soak       # verify and maintain through Spark: test_spark_writes_mirrors
def test_verify_and_maintain_through_spark_alone_keep_it_exact(source_db, config, s3,
                                                                lakehouse, tmp_path):
    bucket, root = lakehouse
    env = _env(config, s3, root, tmp_path / "spark.conf")
    purged = _setup_and_run(source_db, config, s3, root, env)
    _ok(run_cli(["verify"], env, timeout=600))
    _ok(run_cli(["maintain", "--once"], env, timeout=600))
    _check_exact(s3, root, source_db.dsn, purged)
    _all_by_spark(s3, bucket)


@pytest.mark.soak       # the one pass's kill and replay through Spark: test_spark_writes_stream
def test_the_continuous_run_killed_once_gold_moved_ends_exact(source_db, config, s3,
                                                              lakehouse, traffic, tmp_path):
    _, root = lakehouse
    env = _env(config, s3, root, tmp_path / "spark.conf")
    _ok(run_cli(["setup"], env, timeout=600))
    purged = mixed(source_db.dsn, seed=74)
    gold = f"{root}/gold/service_stats"

    def gold_version() -> int:
        try:
            return DeltaTable(gold, storage_options=_options(s3)).version()
        except Exception:                   # not created yet
            return -1

    before = gold_version()
    with open(tmp_path / "run.log", "wb") as log:
        run = subprocess.Popen([sys.executable, "-m", "pipelines", "run"], env=env, cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: gold_version() > before + 1 or run.poll() is not None,
                     timeout=600, interval=0.5)
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-4000:]
        finally:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=60)
    assert traffic() > 0
    purged.update(mixed(source_db.dsn, seed=75))
    _ok(run_cli(["run", "--once"], env, timeout=900))
    _check_exact(s3, root, source_db.dsn, purged)
