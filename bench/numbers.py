"""The figures a benchmark run reports, and the machine and load it ran under: shared by
every section (``bench.measure``, ``bench.catch_up``, ``bench.big_table``, ``bench.deployed``,
``bench.aged``)."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import version
from pathlib import Path

from bench.stages import percentile
from infra.localpg import bin_dir


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text()
                          .splitlines() if ln.startswith("MemTotal")))
    except (OSError, StopIteration, ValueError):
        mem_kb = 0
    pg = subprocess.run([str(bin_dir() / "postgres"), "--version"],
                        capture_output=True, text=True).stdout.strip()
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory_gb": round(mem_kb / 1024 ** 2, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "postgres": pg, "pyspark": version("pyspark"),
            "deltalake": version("deltalake")}


def rate(n: int, seconds: float) -> float:
    return round(n / seconds) if seconds > 0 else 0.0


def percentiles(values: list[float], digits: int = 2) -> dict:
    if not values:
        return {"n": 0}
    s = sorted(values)
    return {"n": len(s), **{f"p{round(q * 100)}": round(percentile(s, q), digits)
                            for q in (0.5, 0.9, 0.95)}, "max": round(s[-1], digits)}
