"""Running the real CLI from tests, and waiting on conditions without fixed sleeps."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from pipelines.config import Config

ROOT = Path(__file__).resolve().parents[1]


def cli_env(config: Config) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECDC_")}
    env.update({"LAKECDC_SOURCE_DSN": config.source_dsn, "LAKECDC_LAKEHOUSE": config.lakehouse,
                "LAKECDC_SLOT": config.slot, "PYTHONPATH": str(ROOT)})
    if config.dashboard_dsn:
        env["LAKECDC_DASHBOARD_DSN"] = config.dashboard_dsn
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def wait_for(condition, timeout: float, interval: float = 0.05) -> None:
    """Poll ``condition`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@contextmanager
def tmpfs(mount: Path, size: str, read_only: bool = False):
    """A small tmpfs mounted at ``mount`` (a full disk, a read-only one), unmounted after.
    Mounting needs root, as the suite runs in CI (Postgres runs via ``runuser``)."""
    assert os.geteuid() == 0, "the full- and read-only-disk tests mount a tmpfs: run as root"
    mount.mkdir()
    options = f"size={size}" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)
