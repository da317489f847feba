"""Installed without the ``spark`` extra (``pip install lakecdc``, as on a machine that only
ships), the JVM-free commands work and the Spark commands say what to install, exit 2.

The environment is a real virtual environment whose site-packages holds every package of
the test run's own environment except pyspark, delta-spark and py4j (linked, not copied:
the same versions, made in a second instead of a minutes-long ``pip install``), so
``import pyspark`` fails there exactly as it does after ``pip install lakecdc``.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest

from pipelines.run.pipeline import Pipeline
from tests.tests_support import ROOT, cli_env, error_line, free_port, listening, wait_for
from tests.truth import check_gold
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration]

SPARK_PACKAGES = ("pyspark", "delta_spark", "delta", "py4j")


@pytest.fixture(scope="module")
def no_spark_python(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("no-spark") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        top = entry.name.lower().split("-")[0].split(".")[0]
        if top in SPARK_PACKAGES or entry.name.startswith("__editable__"):
            continue
        (site / entry.name).symlink_to(entry.resolve())
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import pyspark"], capture_output=True)
    assert probe.returncode != 0, "pyspark is still importable in the no-spark venv"
    return python


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
                    ["quality"], ["sql", "SELECT 1"], ["backfill", "rebuild-gold"],
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
    importable = subprocess.run(
        [str(no_spark_python), "-c", "import bronze.backfill, pipelines.observe.metrics"],
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
