"""The dependency rule (pyproject.toml, ``[tool.importlinter]``) holds, and the check fails
when a package imports one above it, or a room of ``pipelines`` one above it or beside it:
``lint-imports`` on copies of the packages, pristine and with one forbidden import planted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "bronze", "silver", "gold", "pipelines")
LINT = Path(sys.executable).with_name("lint-imports")


@pytest.fixture
def house(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def lint(root: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}     # the copies, not the installed tree
    done = subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def plant(root: Path, module: str, line: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_house_keeps_its_dependency_rule(house):
    code, out = lint(house)
    assert code == 0, out
    assert "3 kept, 0 broken" in out, out


@pytest.mark.parametrize("module, line, broken", [
    ("silver.parse", "import pipelines.cli  # noqa", "silver.parse -> pipelines.cli"),
    ("core.lsn", "import bronze.records  # noqa", "core.lsn -> bronze.records"),
    ("silver.writer", "import gold.plan  # noqa", "silver.writer -> gold.plan"),
    ("gold.plan", "import bronze.records  # noqa", "gold.plan -> bronze.records"),
    # pipelines' rooms (docs/layout.md): run never reads verify, setup never reads run,
    # the source's consistent point never reads setup, demo and verify stay apart.
    ("pipelines.run.pipeline", "import pipelines.verify.mirror_check  # noqa",
     "pipelines.run.pipeline -> pipelines.verify.mirror_check"),
    ("pipelines.setup.prepare", "import pipelines.run.stream  # noqa",
     "pipelines.setup.prepare -> pipelines.run.stream"),
    ("pipelines.source.consistent", "import pipelines.setup.capture  # noqa",
     "pipelines.source.consistent -> pipelines.setup.capture"),
    ("pipelines.demo.run_demo", "import pipelines.verify.report  # noqa",
     "pipelines.demo.run_demo -> pipelines.verify.report"),
    ("pipelines.observe.status", "import pipelines.cli.context  # noqa",
     "pipelines.observe.status -> pipelines.cli.context"),
])
def test_a_layer_importing_above_itself_breaks_the_check(house, module, line, broken):
    plant(house, module, line)
    code, out = lint(house)
    assert code != 0 and "BROKEN" in out and broken in out, out
