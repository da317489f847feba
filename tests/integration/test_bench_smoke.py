"""``python -m bench --quick`` end to end: its own Postgres and Spark, tiny sizes.

The full benchmark (``make bench``) stays out of the default run; this proves the command
works, that the result document carries every metric the report needs, and that lakecdc's
counts were exact in every section while the PoC baseline on the primary-key replica
identity drifts (the comparison the report exists to show).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.stages import STAGE_LABELS, STAGES
from tests.tests_support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.bench]

METRICS = {
    "backlog": ["workload", "decode", "layers", "lakecdc", "poc_same_wal", "poc_pk_identity",
                "twin_identical", "spark_progress", "load_before"],
    "freshness": ["runs", "load_before"],
    "catch_up": ["warm", "cold", "load_before"],
    "writers": ["runs", "load_before"],
    "gold_scaling": ["points", "key_growth", "batch_growth", "batch_growth_mean",
                     "load_before"],
    "big_transaction": ["peak_rss_mb", "ship_s", "bronze_rows", "load_before"],
    "big_table": ["copy", "load", "traffic", "mirror", "lakecdc", "load_before"],
}


def test_quick_bench_measures_everything_and_lakecdc_is_exact(tmp_path):
    report = tmp_path / "benchmarks.md"
    result = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path),
                             "--report", str(report)], cwd=ROOT, capture_output=True,
                            text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())

    for section, keys in METRICS.items():
        missing = [k for k in keys if k not in doc[section]]
        assert not missing, f"{section} lacks {missing}"
    assert len(doc["load_start"]) == 3 and len(doc["load_end"]) == 3
    decode = doc["backlog"]["decode"]
    assert decode["peek_rows"] > doc["backlog"]["workload"]["changes"] > 0
    assert decode["ratio"] > 0 and decode["ship_peak_rss_mb"] > 0
    assert decode["pg_recvlogical_s"] > 0 and decode["ship_vs_recvlogical"] > 0, decode
    assert decode["psycopg_replication"]["messages"] == decode["peek_rows"], decode
    layers = doc["backlog"]["layers"]
    for layer in ("stream", "push", "stream_push"):
        assert layers[layer]["changes_per_s"] > 0, layer
    assert layers["stream"]["rows"] == doc["backlog"]["workload"]["changes"]
    per_batch = layers["stream"]["per_batch"]
    assert per_batch["batches"] >= 1 and per_batch["jobs"] > 0, per_batch
    assert {"rows", "seconds", "silver_s", "gold_s", "merge_s"} <= set(per_batch)
    for start in ("warm", "cold", "first"):
        run = doc["catch_up"][start]
        assert run["changes_per_s"] > 0 and run["lakecdc"]["dashboard"]["exact"], run
    assert doc["catch_up"]["cold"]["restart"] and not doc["catch_up"]["first"]["restart"]
    assert doc["catch_up"]["first"]["start_up_s"] > 0
    # Where the CPU went: the shipper's Postgres session decoded the backlog; cold, the
    # JVM started meanwhile.
    cpus = [doc["catch_up"][start]["cpu_s"] for start in ("warm", "cold", "first")]
    for cpu in cpus:
        assert cpu["lakecdc_python"] > 0 and cpu["postgres"] > 0, cpu
    assert cpus[1]["jvm"] > 0 and cpus[2]["jvm"] > 0, cpus
    for cpu in cpus:
        assert abs(cpu["total"] - sum(v for k, v in cpu.items() if k != "total")) < 0.05
    assert {r["writer"] for r in doc["writers"]["runs"]} == {"delta-rs", "spark"}
    for run in doc["writers"]["runs"]:
        assert run["probes"]["seen"] > 0 and run["lakecdc"]["dashboard"]["exact"], run
    for run in doc["freshness"]["runs"]:
        missing = [k for k in ("latency_s", "series", "achieved_rate", "probes", "lakecdc",
                               "load_before") if k not in run]
        assert not missing, f"a freshness run lacks {missing}"
        assert {"p50", "p95", "max"} <= set(run["latency_s"])
        assert run["series"] and run["achieved_rate"] > 0 and run["probes"]["seen"] > 0
        # Each probe seen is placed on the batches' timeline, stage by stage.
        stages = run["stages"]
        assert 0 < stages["placed"] <= stages["probes"] == run["probes"]["seen"], stages
        assert all(stages[s]["p50"] >= 0 for s in STAGES if s != "seen"), stages
        # The dashboard took the shipper's batches ahead of the stream (gold.ahead).
        assert 0 < stages["shipped_ahead"] <= stages["placed"], stages
        # The three other captured tables changed beside the Notify traffic, and their
        # mirrors ended equal to them.
        assert run["neighbours"]["changes"] > 0, run["neighbours"]
        assert run["neighbours"]["mirrors_equal_source"] is True
    assert len(doc["gold_scaling"]["points"]) >= 2
    for point in doc["gold_scaling"]["points"]:
        assert point["gold_keys"] > 0 and point["runs"], point
        for run in point["runs"]:
            assert run["gold_half_s"]["median"] > 0 and run["latency_s"]["n"] > 0, run
    assert doc["big_transaction"]["bronze_rows"] == doc["params"]["big_tx_rows"]
    big = doc["big_table"]
    assert big["mirror"]["rows"] == doc["params"]["big_rows"]
    assert big["mirror"]["sample_rows"] > 0 and big["mirror"]["sample_differing"] == 0, big
    assert big["traffic"]["big_changes"] > 0 and big["load"]["of_copy"] > 0, big

    # lakecdc exact everywhere, gold and dashboard alike; the PoC on the same WAL is exact
    # too here (no crash, no purge), on the primary-key identity it loses every delete.
    checks = [doc["backlog"]["lakecdc"], *[r["lakecdc"] for r in doc["freshness"]["runs"]],
              *[r["lakecdc"] for p in doc["gold_scaling"]["points"] for r in p["runs"]],
              big["lakecdc"]]
    for check in checks:
        assert check["gold"]["exact"] and check["dashboard"]["exact"], check
    assert doc["exact"] is True
    assert doc["backlog"]["twin_identical"]
    pk = doc["backlog"]["poc_pk_identity"]
    assert not pk["exact"] and pk["total_error_pct"] > 0

    for png in ("throughput.png", "freshness.png", "gold_scaling.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")
    text = report.read_text()
    assert "$" not in text.replace("$$", "") and "results.json" in text
    assert STAGE_LABELS["stream_trigger"] in text and "pg_recvlogical" in text


def test_quick_aged_bench_ages_a_lakehouse_and_measures_it_beside_a_fresh_one(tmp_path):
    """``python -m bench.aged --quick``: ``lakecdc run`` ages one lakehouse, a second is set
    up fresh on the same database, and both are measured in turn, exact."""
    result = subprocess.run([sys.executable, "-m", "bench.aged", "--quick", "--out",
                             str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=1200, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((tmp_path / "aged.json").read_text())
    commits = doc["params"]["commits"]
    aged, fresh = doc["state_before"]["aged"], doc["state_before"]["fresh"]
    assert all(aged[t]["commits"] >= commits for t in ("bronze", "silver", "gold")), aged
    assert all(fresh[t]["commits"] < commits for t in ("bronze", "silver", "gold")), fresh
    for name in ("aged", "fresh"):
        for run in doc["rounds"][name]:
            assert run["batches"] > 0 and run["latency_s"]["n"] > 0, run
            assert run["lakecdc"]["gold"]["exact"] and run["lakecdc"]["dashboard"]["exact"]
    assert set(doc["ratios"]) == {"pass_median_s", "trigger_ms_mean", "probe_p95_s"}
    assert all(r["ratio"] > 0 for r in doc["ratios"].values()), doc["ratios"]
    assert "aged over fresh" in (tmp_path / "aged.md").read_text().lower()
