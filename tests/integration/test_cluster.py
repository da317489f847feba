"""A real cluster: a Spark standalone master and worker, each its own JVM, started with
pyspark's ``bin/spark-class``; lakecdc's commands connect to it (``LAKECDC_SPARK_MASTER``)
and their tasks run in executors the worker launches, JVMs of their own with Python workers
of their own (``silver.parse``'s ``mapInArrow``, the scans, the quality suites' reads).

``stream --once``, ``backfill reprocess-silver`` and ``quality`` on the cluster, then gold
and the dashboard against a ``GROUP BY`` of the source; with the lakehouse on the S3 API
(moto, reached by the executors through s3a with the driver's settings), and in the soaks
(``make bench``) on local disk too (which every JVM here shares, as a cluster's shared
storage). A master that does
not answer is one sentence and exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pyspark
import pytest

from tests.integration.test_s3 import _aws_env, bucket, s3_endpoint  # noqa: F401
from tests.integration.workload import mixed
from tests.tests_support import (ROOT, cli_env, error_line, free_port, run_cli,
                                 spark_properties, wait_for)
from tests.truth import check_gold

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.long]

SPARK_HOME = Path(pyspark.__file__).parent


class Cluster:
    """A master and one worker (2 cores, 2 GB for executors) on 127.0.0.1."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port, self.ui = free_port(), free_port()
        self.work = base / "work"
        self.work.mkdir(parents=True)
        # lakecdc importable by the executors' Python workers, as where it is installed on
        # every node.
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYTHONPATH": str(ROOT)}
        self.procs: list[subprocess.Popen] = []
        # The executors' JVMs start with the test JVMs' options (Makefile's TEST_JVM: the C1
        # compiler alone, the class archive), as the drivers do: short-lived, as they are.
        # Through a properties file of the drivers' own, as a cluster's admin would set
        # them. (The drivers' own -D settings are refused there: Spark's, not the JVM's.)
        jvm = [o for o in os.environ.get("SPARK_SUBMIT_OPTS", "").split()
               if o.startswith("-XX:")] or ["-XX:TieredStopAtLevel=1"]
        self.driver_env = spark_properties(base / "spark.conf", {
            "spark.executor.extraJavaOptions": " ".join(jvm)})

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._daemon("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui))
        wait_for(lambda: self._state() is not None, timeout=120, interval=0.5)
        self._daemon("worker", "org.apache.spark.deploy.worker.Worker", self.url,
                     "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
                     "--work-dir", str(self.work), "--webui-port", str(free_port()))
        wait_for(lambda: any(w["state"] == "ALIVE" for w in self._state()["workers"]),
                 timeout=120, interval=0.5)

    def _daemon(self, name: str, cls: str, *args: str) -> None:
        log = open(self.base / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), cls, *args],
                                           env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def _state(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as r:
                return json.load(r)
        except OSError:
            return None

    def apps(self) -> dict[str, dict]:
        """The applications the master has seen, by id (running and completed)."""
        state = self._state() or {}
        return {a["id"]: a for a in state.get("activeapps", []) + state.get("completedapps", [])}

    def executor_logs(self, app_id: str) -> str:
        """What the app's executors wrote (Spark's own log lines, on stderr)."""
        return "".join(p.read_text(errors="replace")
                       for p in (self.work / app_id).glob("*/stderr"))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        started.start()
        yield started
    finally:
        started.stop()


def _on_cluster(cluster: Cluster, env: dict[str, str], args: list[str]) -> dict:
    """Run a lakecdc command on the cluster; the application it ran as."""
    before = set(cluster.apps())
    result = run_cli(args, env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    new = [a for i, a in cluster.apps().items() if i not in before]
    assert len(new) == 1, f"{' '.join(args)} ran as {len(new)} applications on the cluster"
    return new[0]


def _ran_tasks(cluster: Cluster, app: dict) -> int:
    """Tasks the app's executors ran, from their own logs: proof that the work left the
    driver's JVM."""
    return cluster.executor_logs(app["id"]).count("Running task")


# On local disk in the soaks (`make bench`): the S3 run has every step and more.
@pytest.mark.parametrize("storage", [pytest.param("local", marks=pytest.mark.soak), "s3"])
def test_stream_reprocess_and_quality_on_a_standalone_cluster_are_exact(
        source_db, config, cluster, storage, request, monkeypatch):
    env = {**cli_env(config), "LAKECDC_SPARK_MASTER": cluster.url, "SPARK_LOCAL_IP": "127.0.0.1",
           **cluster.driver_env}
    if storage == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        _, name = request.getfixturevalue("bucket")
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
        env.update(_aws_env(endpoint), LAKECDC_LAKEHOUSE=f"s3://{name}/lakehouse")
        for key, value in _aws_env(endpoint).items():    # delta-rs's reads of gold, below
            monkeypatch.setenv(key, value)
    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    # Purged history rows: gold counts them until reprocess-silver rebuilds it from a fresh
    # baseline (the source's rows now), after which the source's GROUP BY is the truth.
    mixed(source_db.dsn, seed=91)
    shipped = run_cli(["ship", "--once"], env)
    assert shipped.returncode == 0, shipped.stderr[-3000:]

    stream = _on_cluster(cluster, env, ["stream", "--once"])
    reprocess = _on_cluster(cluster, env, ["backfill", "reprocess-silver",
                                           "--since", "2000-01-01T00:00:00"])
    quality = _on_cluster(cluster, env, ["quality"])
    pushed = run_cli(["push", "--once"], env)
    assert pushed.returncode == 0, pushed.stderr[-3000:]

    for app in (stream, reprocess, quality):
        assert _ran_tasks(cluster, app) > 0, f"{app['name']}: no task ran in an executor"
    # reprocess-silver's parse is Python (mapInArrow): Python workers of the executors ran it.
    assert "PythonRunner" in cluster.executor_logs(reprocess["id"])

    check_gold(env["LAKECDC_LAKEHOUSE"], source_db.dsn, config.dashboard)


def test_a_master_that_does_not_answer_is_one_sentence_and_exit_2(config):
    env = {**cli_env(config), "LAKECDC_SPARK_MASTER": f"spark://127.0.0.1:{free_port()}"}
    assert run_cli(["setup"], env).returncode == 0          # setup itself needs no Spark
    error_line(run_cli(["stream", "--once"], env), "LAKECDC_SPARK_MASTER", "does not answer")
    env["LAKECDC_SPARK_MASTER"] = "yarn"
    error_line(run_cli(["stream", "--once"], env), "LAKECDC_SPARK_MASTER", "spark://host:port")
