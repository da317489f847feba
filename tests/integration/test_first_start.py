"""F22: a pipeline killed during its first start - before gold's baseline is seeded, or while
Spark writes a checkpoint file - recovers by itself on the next start, exactly.

Every scenario starts from an empty lakehouse on a source that already holds rows (so gold's
baseline matters), and ends with ``tests/invariants.py`` (I1-I5 against a witness slot and a
GROUP BY of the source). The randomized version is ``python -m tests.soak_first_start``.
"""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path

import pytest

from tests.invariants import check_invariants
from pipelines.setup.prepare import setup
from tests.tests_support import cli_env, run_cli
from tests.truth import Witness
from tests.integration.workload import insert, mixed, transition

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def populated(source_db, config):
    """Rows in the source before ``setup`` (they reach gold only through the baseline), then
    setup and a witness slot."""
    with source_db.connect() as conn:
        rng = random.Random(22)
        insert(conn, rng, 300)
        transition(conn, 0.5, "sending")
    setup(config)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    yield config, witness
    witness.drop()


def plant_incomplete_writes(checkpoint: Path, batch: int) -> list[Path]:
    """What a kill while Spark writes ``offsets/<batch>`` and ``commits/<batch>`` leaves: the
    0-byte temporary file and Hadoop's checksum of it."""
    planted = []
    umask = os.umask(0o077)                   # as the CLI that would have left them
    try:
        for folder in ("offsets", "commits"):
            (checkpoint / folder).mkdir(parents=True, exist_ok=True)
            name = f".{batch}.{uuid.uuid4()}.tmp"
            for path in (checkpoint / folder / name, checkpoint / folder / f".{name}.crc"):
                path.write_bytes(b"")
                planted.append(path)
    finally:
        os.umask(umask)
    return planted


def assert_owner_only(root: Path) -> None:
    """Everything the CLI and its Spark JVM created is its owner's alone (umask 077): bronze
    holds personal data."""
    opened = [p for p in [root, *root.rglob("*")] if p.stat().st_mode & 0o077]
    assert not opened, [(str(p), oct(p.stat().st_mode)) for p in opened[:5]]


def test_kill_after_gold_is_created_before_its_seed_restarts_exact(populated, source_db,
                                                                  cli_here):
    """The kill lands between creating gold's table and writing the baseline into it; the
    restart must still seed (decided by what gold records, not by the table existing)."""
    config, witness = populated
    env = cli_env(config)
    killed = run_cli(["run", "--once"], {**env, "LAKECDC_FAULT": "after_gold_create:1"})
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert (Path(config.lakehouse) / "gold" / "service_stats" / "_delta_log").is_dir()
    purged = mixed(source_db.dsn, seed=5)
    done = cli_here(["run", "--once"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    check_invariants(config, witness, purged)


def test_leftovers_of_killed_checkpoint_writes_are_removed_and_restarts_are_exact(
        populated, source_db, cli_here):
    """Spark refuses a checkpoint whose ``offsets/`` is not empty on batch 0; a kill while
    it wrote the first offset file leaves exactly that. Planted in the stream's checkpoint
    on a first start, then - after a run - at the next batch beside committed files: each
    restart removes only the leftovers, keeps the query's id, and ends exact."""
    config, witness = populated
    env = cli_env(config)
    checkpoints = Path(config.lakehouse) / "_checkpoints"
    queries = [checkpoints / "stream"]
    planted = [p for q in queries for p in plant_incomplete_writes(q, 0)]
    first = run_cli(["run", "--once"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not [p for p in planted if p.exists()]
    check_invariants(config, witness)
    lakehouse = Path(config.lakehouse)         # what `run` made (setup ran in this process)
    for made in ("silver", "_checkpoints", "gold/service_stats", "gold/_pending"):
        assert_owner_only(lakehouse / made)

    ids = {q: (q / "metadata").read_text() for q in queries}
    planted = [p for q in queries for p in plant_incomplete_writes(
        q, 1 + max(int(f.name) for f in (q / "offsets").iterdir() if f.name.isdigit()))]
    purged = mixed(source_db.dsn, seed=6)
    again = cli_here(["run", "--once"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not [p for p in planted if p.exists()]
    assert {q: (q / "metadata").read_text() for q in queries} == ids
    check_invariants(config, witness, purged)
