"""Early-kill soak (F22): a pipeline's first start, ``kill -9``-ed at a random moment, must
restart by itself and end exact.

    .venv/bin/python -m tests.soak_first_start --cycles 15     # ~2 min a cycle on 2 cores

Every cycle, on one throw-away Postgres 15 + wal2json:

1. a new database with the Notify-like schema and rows in it *before* ``lakecdc setup``
   (they reach gold only through the baseline), a new slot, an empty lakehouse, a witness
   slot (``tests/truth.py``);
2. traffic in a thread (``pipelines.demo.traffic.Traffic``) while ``lakecdc run`` (the real CLI)
   starts in its own process group, which is SIGKILL-ed whole a random 0-``--max-kill-s``
   seconds after the start: in the JVM's start-up, the seeding of gold, a query's first
   batch, the write of a first offset or commit file;
3. the traffic stops, ``lakecdc run --once`` must exit 0 by itself, and I1-I5
   (``tests/invariants.py``) must hold against the source.

Prints one line a cycle and a summary (cycles, failures); exits 0 only if every cycle was
exact. Not collected by pytest; ``tests/integration/test_first_start.py`` runs the
deterministic versions of the same faults.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from tests.soak import SCHEMA_SQL, RunProcess, cli_env, sessions_released, wait_until


def one_cycle(pg, number: int, rng: random.Random, max_kill_s: float, logs: Path,
              work: Path) -> tuple[float, str]:
    """One fresh start killed at random, then the restart; returns (kill time, verdict)."""
    from tests.invariants import check_invariants
    from core.config import Config
    from pipelines.setup.prepare import setup
    from pipelines.demo.traffic import Traffic
    from tests.truth import Witness

    db = f"notify_{number}"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    with psycopg.connect(pg.dsn(db), autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text())
    config = Config.load(env={}, source_dsn=pg.dsn(db), slot=f"lakecdc_{number}",
                         lakehouse=str(work / f"lakehouse-{number}"))
    traffic = Traffic(config.source_dsn, seed=number)
    stop = threading.Event()
    with psycopg.connect(config.source_dsn, autocommit=True) as conn:
        for _ in range(rng.randint(5, 40)):          # rows that exist before the slot
            traffic.step(conn, 20)
    setup(config)
    witness = Witness(config.source_dsn, f"lakecdc_{number}_w")
    writer = threading.Thread(target=traffic.run, args=(stop, 0.3, 20))
    writer.start()
    kill_at = rng.uniform(0, max_kill_s)
    try:
        run = RunProcess(["run"], cli_env(config), logs / f"run-{number:03d}.log")
        deadline = time.monotonic() + kill_at
        while time.monotonic() < deadline and run.proc.poll() is None:
            time.sleep(0.05)
        if run.proc.poll() is not None:
            return kill_at, f"run exited {run.proc.returncode} by itself:\n{run.tail()}"
        run.kill_group()
        stop.set()
        writer.join()
        wait_until(lambda: sessions_released(config.source_dsn, config.slot), 300,
                   "sessions of the killed run released")
        again = RunProcess(["run", "--once"], cli_env(config),
                           logs / f"once-{number:03d}.log")
        code = again.proc.wait(timeout=1800)
        again.kill_group()
        if code != 0:
            return kill_at, f"run --once exited {code}:\n{again.tail()}"
        verdict = check_invariants(config, witness)
        return kill_at, f"EXACT ({verdict.summary()})"
    except AssertionError as exc:
        return kill_at, f"NOT EXACT: {exc}"
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        witness.drop()
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                         "pg_replication_slots WHERE database = %s", [db])
            conn.execute(f'DROP DATABASE "{db}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak_first_start",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=15)
    parser.add_argument("--max-kill-s", type=float, default=25.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="work here and keep the logs afterwards")
    args = parser.parse_args(argv)

    from infra.localpg import LocalPostgres

    base = args.keep or Path(tempfile.mkdtemp(prefix="lakecdc-soak-first-"))
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)                 # the cluster below runs as the postgres user
    logs = base / "logs"
    logs.mkdir(exist_ok=True)
    pg = LocalPostgres(base / "pg").start()
    rng = random.Random(args.seed)
    failures = 0
    started = time.monotonic()
    try:
        for number in range(1, args.cycles + 1):
            kill_at, verdict = one_cycle(pg, number, rng, args.max_kill_s, logs, base)
            failures += not verdict.startswith("EXACT")
            print(f"cycle {number:3d}: killed {kill_at:5.1f}s after start: {verdict}",
                  flush=True)
    finally:
        pg.destroy()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\nearly-kill soak: {args.cycles} cycles, {failures} failures, "
          f"{time.monotonic() - started:.0f}s", flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
