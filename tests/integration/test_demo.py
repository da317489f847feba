"""``make demo`` is the first thing a new user runs: ``lakecdc demo`` (short) ends exact, says
so, and leaves its summary and picture behind; the terminal shows lakecdc's own lines, and
Spark's (Ivy's report, log4j's banner and hints) go to the file the output names."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.tests_support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.mark.long
def test_the_demo_runs_end_to_end_and_prints_exact(tmp_path):
    out = tmp_path / "demo-output"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECDC_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "pipelines", "demo", "--seconds", "15",
                             "--out", str(out)], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "gold      vs source GROUP BY: EXACT" in result.stdout, result.stdout[-3000:]
    assert "dashboard vs gold           : EXACT" in result.stdout
    picture = out / "service_stats.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    assert "EXACT" in (out / "summary.txt").read_text()
    terminal = result.stdout + result.stderr
    banner = "Using Spark's default log4j profile"
    for spark_line in (banner, "sc.setLogLevel", ":: resolving dependencies ::",
                       ":: resolution report ::", "NativeCodeLoader"):
        assert spark_line not in terminal, terminal[-3000:]
    spark_log = out / "spark.log"
    assert str(spark_log) in result.stdout
    assert banner in spark_log.read_text()      # the JVM's lines went there instead
