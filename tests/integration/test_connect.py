"""Spark Connect: Databricks' standard (shared) access mode and serverless.

``stream``, ``mirrors`` and ``run`` refuse a Spark Connect session with one sentence naming
dedicated access mode, exit 2, before anything is touched: no lakehouse, no lock, no
connection to the source or the dashboard, no slot moved (``core.spark.require_classic``;
why, in docs/databricks.md).

The session is a real one: a Spark Connect server of pyspark's own (the ``spark-connect``
jar its package carries, started through ``spark-submit``, once per module), and each
command runs in a process of its own as a Databricks wheel task does on such a cluster:
``DATABRICKS_RUNTIME_VERSION`` set, so ``core.spark.get_or_create`` takes the runtime's
session from ``SparkSession.builder.getOrCreate()``, and ``SPARK_REMOTE`` naming the server,
so that session is a Connect one. A Connect session marks its whole process as remote
(pyspark's ``is_remote()``), so none is made in the test process, whose session is classic.
The DSNs name a port nothing listens on: a command that got past the refusal would end in
another sentence (cannot connect), or, given a database, in a traceback from the first JVM
handle or the pickling of its ``foreachBatch`` writer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from tests.tests_support import ROOT, error_line, free_port, listening, run_cli, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPARK_HOME = Path(pyspark.__file__).parent


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """``sc://127.0.0.1:<port>`` of a Spark Connect server (``local[1]``, its own JVM)."""
    base = tmp_path_factory.mktemp("connect")
    port = free_port()
    # The server's Python workers (foreachBatch's) run this interpreter, with lakecdc and
    # these tests importable: a pickled function names its module.
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    with open(base / "server.log", "wb") as log:
        server = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-submit"),
             "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--master", "local[1]", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", f"spark.connect.grpc.binding.port={port}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: server.poll() is not None or listening(port), timeout=180,
                 interval=0.2)
        assert server.poll() is None, (base / "server.log").read_text()[-3000:]
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.parametrize("args", [["stream", "--once"], ["mirrors", "--once"],
                                  ["run", "--once"]], ids=" ".join)
def test_a_connect_session_is_refused_before_anything_is_touched(connect_server, tmp_path,
                                                                  args):
    lakehouse = tmp_path / "lakehouse"
    nowhere = f"postgresql://lakecdc@127.0.0.1:{free_port()}/notify"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECDC_")}
    env.update({"DATABRICKS_RUNTIME_VERSION": "18.0", "SPARK_REMOTE": connect_server,
                "LAKECDC_SOURCE_DSN": nowhere, "LAKECDC_DASHBOARD_DSN": nowhere,
                "LAKECDC_LAKEHOUSE": str(lakehouse), "PYTHONPATH": str(ROOT)})
    result = run_cli(args, env, timeout=180)
    line = error_line(result, f"`lakecdc {' '.join(args) if args[0] == 'run' else args[0]}`",
                      "Spark Connect", "dedicated (single user) access mode")
    assert "cannot connect" not in line
    assert not lakehouse.exists()


def test_what_a_connect_session_does_with_the_stream_and_the_mirrors(connect_server):
    """Why the refusal, against the live server. Spark Connect pickles the ``foreachBatch``
    function to run it in a Python process of the server's (a function that pickles starts
    there): ``stream``'s ``SilverGoldWriter`` holds a lock and does not pickle. ``mirrors``'
    ``MirrorWriter`` pickles, but its query starts from the checkpoint read through the
    JVM's Hadoop file system (``core.checkpoints``), which a Connect session has not; and
    what either writer keeps for the driver (the batch's own error, the merged counts,
    gold's steps folded between batches) would stay in the server's process."""
    env = {**os.environ, "SPARK_REMOTE": connect_server, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", "from tests.integration.test_connect import _under_connect; "
                               "_under_connect()"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["count"] == 3, outcome                       # a live session
    assert outcome["plain"] == outcome["MirrorWriter"] == "started", outcome
    assert "STREAMING_CONNECT_SERIALIZATION_ERROR" in outcome["SilverGoldWriter"], outcome
    assert "JVM_ATTRIBUTE_NOT_SUPPORTED" in outcome["checkpoint"], outcome


def _batch_does_nothing(batch, batch_id) -> None:
    """A ``foreachBatch`` function that pickles (the control)."""


def _under_connect() -> None:
    """In a process of its own (``SPARK_REMOTE`` set): a Connect session; each writer handed
    to ``foreachBatch`` as ``pipelines.run.pipeline`` hands it; the mirrors' checkpoint
    read. Prints one JSON line."""
    from pyspark.sql import SparkSession

    from core.checkpoints import source_table_ids
    from core.config import Config
    from pipelines.run.mirror_query import mirror_discovery
    from pipelines.run.stream import SilverGoldWriter
    from silver.mirrors.mirror_writer import MirrorWriter

    spark = SparkSession.builder.getOrCreate()
    outcome = {"count": spark.range(3).count()}
    rate = spark.readStream.format("rate").option("rowsPerSecond", 1).load()
    config = Config(lakehouse="/nonexistent")
    writers = {"plain": _batch_does_nothing, "SilverGoldWriter": SilverGoldWriter(None, None),
               "MirrorWriter": MirrorWriter({}, discover=mirror_discovery(spark, config))}
    for name, writer in writers.items():
        try:
            rate.writeStream.foreachBatch(writer).trigger(processingTime="1 hour").start().stop()
            outcome[name] = "started"
        except Exception as exc:                   # what Connect says, for the assertion
            outcome[name] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        outcome["checkpoint"] = sorted(source_table_ids(spark, "/nonexistent/checkpoint"))
    except Exception as exc:
        outcome["checkpoint"] = f"{type(exc).__name__}: {exc}"[:500]
    print(json.dumps(outcome))
