"""``make demo`` is the first thing a new user runs: ``lakecdc demo`` (short) ends exact, says
so, and leaves its summary and picture behind."""

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
