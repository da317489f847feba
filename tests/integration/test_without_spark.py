"""Installed without its extras (``pip install lakecdc``, as on a machine that only ships),
the JVM-free commands work and every other command names the extra to install, exit 2.

The environment is a real virtual environment whose site-packages holds every package of
the test run's own environment except those of the extras (``core.extras``: pyspark,
delta-spark and py4j; Great Expectations and pandas; boto3; matplotlib), linked, not
copied: the same versions, made in a second instead of a minutes-long ``pip install``, so
``import pyspark`` fails there exactly as it does after ``pip install lakecdc``. A second
one keeps Spark and leaves out the other extras: each command that needs one names it.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import sysconfig
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from pipelines.run.pipeline import Pipeline
from tests.tests_support import ROOT, cli_env, error_line, free_port, listening, wait_for
from tests.truth import check_gold, source_truth
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration]

SPARK_PACKAGES = ("pyspark", "delta_spark", "delta", "py4j")
OTHER_EXTRAS = ("great_expectations", "pandas", "boto3", "botocore", "s3transfer",
                "matplotlib")


def _venv_without(tmp_path_factory, name: str, left_out: tuple[str, ...]) -> Path:
    venv = tmp_path_factory.mktemp(name) / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        top = entry.name.lower().split("-")[0].split(".")[0]
        if top in left_out or entry.name.startswith("__editable__"):
            continue
        (site / entry.name).symlink_to(entry.resolve())
    python = venv / "bin" / "python"
    for module in left_out:
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True)
        assert probe.returncode != 0, f"{module} is still importable in the {name} venv"
    return python


@pytest.fixture(scope="module")
def no_spark_python(tmp_path_factory) -> Path:
    """``pip install lakecdc``: no extra at all."""
    return _venv_without(tmp_path_factory, "no-extras", SPARK_PACKAGES + OTHER_EXTRAS)


def test_each_command_names_the_extra_it_needs(tmp_path_factory, source_db, config):
    """``pip install 'lakecdc[spark]'`` alone: the quality gates, the demo and an s3://
    lakehouse each say which extra to install, before a JVM starts or anything is written."""
    python = _venv_without(tmp_path_factory, "spark-only", OTHER_EXTRAS)
    env = cli_env(config)
    for command, extra in ((["quality"], "quality"), (["demo", "--seconds", "1"], "demo"),
                           (["--lakehouse", "s3://bucket/lakecdc", "setup"], "s3")):
        error_line(lakecdc(python, command, env), f"pip install 'lakecdc[{extra}]'")
    with source_db.connect() as conn:           # the s3 sentence came before setup began
        assert conn.execute("SELECT count(*) FROM pg_replication_slots "
                            "WHERE database = current_database()").fetchone()[0] == 0


def lakecdc(python: Path, args: list[str], env: dict[str, str]):
    return subprocess.run([str(python), "-m", "pipelines", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.spark
def test_jvm_free_commands_work_and_spark_commands_name_the_extra(
        no_spark_python, source_db, config, spark):
    env = cli_env(config)
    setup = lakecdc(no_spark_python, ["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    purged = mixed(source_db.dsn, seed=41)
    shipped = lakecdc(no_spark_python, ["ship", "--once"], env)
    assert shipped.returncode == 0 and "shipped" in shipped.stdout, shipped.stderr[-3000:]

    for command in (["run", "--once"], ["stream", "--once"], ["verify"],
                    ["quality"], ["backfill", "rebuild-gold"],
                    ["demo", "--seconds", "1"]):
        result = lakecdc(no_spark_python, command, env)
        error_line(result, "pip install 'lakecdc[spark]'")

    # Silver and gold by Spark (here, in the test's own environment), then the push and
    # status without it.
    Pipeline(config, spark_factory=lambda: spark).stream(once=True)
    pushed = lakecdc(no_spark_python, ["push", "--once"], env)
    assert pushed.returncode == 0 and "push: gold version" in pushed.stdout, \
        pushed.stderr[-3000:]
    status = lakecdc(no_spark_python, ["status"], env)
    assert status.returncode == 0 and "dashboard" in status.stdout, status.stderr[-3000:]
    for command, said in ((["tables"], "public.notifications"),
                          (["maintain", "--once"], "gold: ")):
        result = lakecdc(no_spark_python, command, env)
        assert result.returncode == 0 and said in result.stdout, result.stderr[-3000:]
    # SQL on gold without a JVM (delta-rs's DataFusion), against the source; a query in
    # Spark's dialect is turned to Spark, saying so, and here that names the extra.
    by_status = Counter()
    for (_service, _template, _kind, status), n in source_truth(source_db.dsn, purged).items():
        by_status[status] += n
    query = lakecdc(no_spark_python, [
        "sql", "SELECT notification_status, SUM(count) AS n FROM gold_service_stats "
        "GROUP BY notification_status", "--format", "csv"], env)
    assert query.returncode == 0, query.stderr[-3000:]
    got = {r["notification_status"]: int(r["n"]) for r in csv.DictReader(io.StringIO(query.stdout))}
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in by_status.items() if v}
    spark_only = lakecdc(no_spark_python, ["sql", "SELECT unix_micros(current_timestamp())"],
                         env)
    assert "running it on Spark" in spark_only.stderr, spark_only.stderr[-2000:]
    error_line(spark_only, "pip install 'lakecdc[spark]'")
    importable = subprocess.run(
        [str(no_spark_python), "-c", "import bronze.snapshot_backfill, pipelines.observe.metrics"],
        env=env, cwd=ROOT, capture_output=True, text=True)
    assert importable.returncode == 0, importable.stderr[-2000:]
    port = free_port()                  # the exporter serves, and reads the layers, too
    served = subprocess.Popen([str(no_spark_python), "-m", "pipelines", "metrics", "--port",
                               f"127.0.0.1:{port}"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: served.poll() is not None or listening(port), timeout=60)
        assert served.poll() is None, served.stderr.read()[-2000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            scraped = r.read().decode()
        assert 'lakecdc_state_up{part="gold"} 1.0' in scraped, scraped[-3000:]
    finally:
        served.terminate()
        served.wait(timeout=30)
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)
