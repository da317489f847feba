"""Soak: ``lakecdc run`` under load, ``kill -9``-ed at random moments, must end exact.

    .venv/bin/python -m tests.soak --cycles 100            # about an hour on 2 cores
    .venv/bin/python -m tests.soak --cycles 5 --max-kill-s 20 --keep /tmp/soak

What one run does:

1. starts its own throw-away Postgres 15 + wal2json (``infra.localpg``), the Notify-like
   schema and ``lakecdc setup``, and a *witness* slot (``tests/truth.py``) that sees the
   same WAL and is never advanced;
2. runs ``pipelines.demo.traffic.Traffic`` in a thread for the whole soak (inserts, status
   transitions, archival moves, hard deletes, rollbacks);
3. ``--cycles`` times: starts ``lakecdc run`` (the real CLI, continuous) in its own process
   group and sends SIGKILL to the whole group - the Python driver, the Spark JVM and its
   Python workers at once - either a random 0.5-``--max-kill-s`` seconds after the start or,
   for a ``--streaming-fraction`` of the cycles, a random 0-15 s after silver (or
   ``--streaming-layer gold``) committed in that cycle (so kills also land inside the
   streams, gold and the push, not only in the JVM's start-up); waits until no process of
   the group is left and Postgres has let go of the dead sessions (their advisory locks and
   the slot), then restarts it;
4. stops the traffic, drains with ``lakecdc run --once`` and checks docs/reliability.md's
   I1-I5 exactly (``tests/invariants.py``); prints a summary and exits 0 only if exact.

Not collected by pytest (the file name does not match ``test_*.py``); CI runs a short,
condition-driven version of the same cycle (``tests/integration/test_faults.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:           # python tests/soak.py as well as python -m tests.soak
    sys.path.insert(0, str(ROOT))

from deltalake import DeltaTable  # noqa: E402

from core.config import Config  # noqa: E402
from core.layout import GOLD, SILVER  # noqa: E402

SCHEMA_SQL = ROOT / "infra" / "postgres" / "source_schema.sql"


def cli_env(config: Config, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECDC_")}
    env.update({"LAKECDC_SOURCE_DSN": config.source_dsn, "LAKECDC_LAKEHOUSE": config.lakehouse,
                "LAKECDC_SLOT": config.slot, "PYTHONPATH": str(ROOT), **extra})
    if config.dashboard_dsn:
        env["LAKECDC_DASHBOARD_DSN"] = config.dashboard_dsn
    return env


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (read from /proc: no ps parsing)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def _name(pid: int) -> str:
    """The process's name; ``java-launcher`` for the short-lived JVM Spark's ``spark-class``
    runs first to build the driver's command line (only the driver's JVM is ``java``)."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        if name == "java" and b"org.apache.spark.launcher.Main" in \
                Path(f"/proc/{pid}/cmdline").read_bytes():
            return "java-launcher"
        return name
    except OSError:
        return "?"


def wait_until(condition, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s")
        time.sleep(interval)


class RunProcess:
    """``lakecdc run`` (or any lakecdc command) in a new session: its own process group,
    so one ``killpg`` reaches the Spark JVM and its workers too."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines", *args], env=env,
                                     cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pgid = self.proc.pid

    def members(self) -> list[str]:
        """Names of the processes alive in the group (``python3``, ``java``, ...)."""
        return [_name(pid) for pid in group_members(self.pgid)]

    def kill_group(self, timeout: float = 60) -> list[str]:
        """SIGKILL every process of the group; returns the names of those that were alive
        (``python3``, ``java``, ...). Waits until none is left."""
        alive = self.members()
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=timeout)
        wait_until(lambda: not group_members(self.pgid), timeout,
                   f"process group {self.pgid} still has members after SIGKILL")
        self._log.close()
        return alive

    def tail(self, chars: int = 3000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]


def sessions_released(dsn: str, slot: str) -> bool:
    """No advisory lock held and the slot inactive in the source database: every session
    of a killed run is gone (a backend notices a dead client when it next talks to it,
    e.g. only after a long peek), so a restart will not be refused as a second shipper."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        locks = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                             "granted AND database = (SELECT oid FROM pg_database WHERE "
                             "datname = current_database())").fetchone()[0]
        active = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s "
                              "AND active_pid IS NOT NULL", [slot]).fetchone()[0]
    return locks == 0 and active == 0


def table_version(path: str) -> int:
    try:
        return DeltaTable(path).version()
    except Exception:          # not created yet
        return -1


@dataclass
class Positions:
    """Delta versions of each layer and the pushed gold version: where a kill landed."""

    bronze: int
    silver: int
    gold: int
    pushed: int

    @classmethod
    def read(cls, config: Config) -> "Positions":
        with psycopg.connect(config.dashboard, autocommit=True) as conn:
            row = conn.execute("SELECT max(gold_version) FROM lakecdc_push_progress"
                               ).fetchone() if _has_progress(conn) else (None,)
        return cls(table_version(config.bronze_path),
                   table_version(config.table_path(SILVER)),
                   table_version(config.table_path(GOLD)),
                   -1 if row[0] is None else int(row[0]))


def _has_progress(conn) -> bool:
    return conn.execute("SELECT to_regclass('lakecdc_push_progress') IS NOT NULL").fetchone()[0]


@dataclass
class Cycle:
    number: int
    ran_s: float
    exit_code: int | None          # None: killed while running (the normal case)
    killed: list[str]              # names of the processes the SIGKILL found alive
    moved: list[str]               # layers whose version moved during the cycle
    fault: str = ""


@dataclass
class Soak:
    """Cycles of start → SIGKILL of the group → wait → restart, on one configuration."""

    config: Config
    log_dir: Path
    cycles: list[Cycle] = field(default_factory=list)
    current: RunProcess | None = None          # the run of the cycle in progress
    done_before: int = 0                       # cycles of an earlier, interrupted soak
    on_start: Callable[[RunProcess], None] | None = None
    env: dict[str, str] = field(default_factory=dict)      # more LAKECDC_* for every run

    def start(self, fault: str = "", args: tuple[str, ...] = ("run",)) -> RunProcess:
        wait_until(lambda: sessions_released(self.config.require_source(), self.config.slot),
                   timeout=300, what="sessions of the killed run released")
        extra = {**self.env, **({"LAKECDC_FAULT": fault} if fault else {})}
        number = self.done_before + len(self.cycles)
        self.current = RunProcess(list(args), cli_env(self.config, **extra),
                                  self.log_dir / f"run-{number:03d}.log")
        if self.on_start is not None:
            self.on_start(self.current)
        return self.current

    def cycle(self, run_for_s: float | None = None, fault: str = "",
              until=None, then_s: float = 0.0, timeout: float = 600) -> Cycle:
        """One cycle. Kill after ``run_for_s`` seconds, or ``then_s`` seconds after
        ``until()`` became true, or - with a ``fault`` point - once the process ended itself
        there (then the rest of its group is killed). A run that exits on its own otherwise
        is a failure."""
        before = Positions.read(self.config)
        started = time.monotonic()
        run = self.start(fault)
        exit_code = None
        if fault:
            exit_code = run.proc.wait(timeout=timeout)
            if exit_code != 137:
                raise AssertionError(f"run with {fault} ended {exit_code}, not at the fault "
                                     f"point:\n{run.tail()}")
        elif until is not None:
            wait_until(lambda: until() or run.proc.poll() is not None, timeout,
                       "the run made the expected progress", interval=0.2)
            deadline = time.monotonic() + then_s
        else:
            deadline = started + (run_for_s or 0)
        if not fault:
            while time.monotonic() < deadline and run.proc.poll() is None:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if fault == "" and run.proc.poll() is not None:
            raise AssertionError(f"lakecdc run exited {run.proc.returncode} by itself:\n"
                                 f"{run.tail()}")
        alive = run.kill_group()
        after = Positions.read(self.config)
        moved = [name for name in ("bronze", "silver", "gold", "pushed")
                 if getattr(after, name) != getattr(before, name)]
        result = Cycle(self.done_before + len(self.cycles) + 1, time.monotonic() - started,
                       exit_code, alive, moved, fault)
        self.cycles.append(result)
        return result

    def drain(self, timeout: float = 1800) -> str:
        """``lakecdc run --once`` (the real CLI) after the last kill; returns its output."""
        run = self.start(args=("run", "--once"))
        code = run.proc.wait(timeout=timeout)
        run.kill_group()
        if code != 0:
            raise AssertionError(f"the draining run --once ended {code}:\n{run.tail()}")
        return run.tail(400)


# --- the command ------------------------------------------------------------------------

STATE_FILE = "soak.json"        # port, seed, cycles done: lets --resume continue a soak
WITNESS = "lakecdc_soak_witness"


def _source(base: Path, port: int, fresh: bool) -> tuple[object, Config]:
    from infra.localpg import LocalPostgres

    pg = LocalPostgres(base / "pg", port=port)
    if not fresh:
        pg.stop()           # a soak killed outright leaves its server running
    pg.start()
    if fresh:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE notify")
        with psycopg.connect(pg.dsn("notify"), autocommit=True) as conn:
            conn.execute(SCHEMA_SQL.read_text())
    config = Config.load(env={}, source_dsn=pg.dsn("notify"), slot="lakecdc",
                         lakehouse=str(base / "lakehouse"))
    return pg, config


def _witness(dsn: str):
    """The witness slot: created by a fresh soak, taken over by a resumed one."""
    from tests.truth import CAPTURED, Witness

    try:
        return Witness(dsn, WITNESS)
    except psycopg.errors.DuplicateObject:
        witness = Witness.__new__(Witness)           # the slot exists: take it over
        witness.dsn, witness.name, witness.tables = dsn, WITNESS, CAPTURED
        return witness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--min-kill-s", type=float, default=0.5)
    parser.add_argument("--max-kill-s", type=float, default=40.0,
                        help="upper bound of the random run time before the kill (JVM "
                             "start-up and the first batches take ~20-40 s here)")
    parser.add_argument("--streaming-fraction", type=float, default=0.5,
                        help="share of cycles killed a random 0-15 s after silver committed "
                             "in that cycle (the streams and gold running), instead of at a "
                             "random time from the start")
    parser.add_argument("--streaming-layer", choices=("silver", "gold", "pushed"),
                        default="silver",
                        help="the layer whose commit starts the 0-15 s countdown of those "
                             "cycles (gold: kills land in gold batches and pushes)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--traffic-interval", type=float, default=0.3,
                        help="seconds between traffic steps (20 inserts + updates each)")
    parser.add_argument("--keep", type=Path, help="work here and keep everything afterwards")
    parser.add_argument("--resume", action="store_true",
                        help="continue the interrupted soak kept in --keep (its cluster, "
                             "lakehouse, witness and cycle count)")
    args = parser.parse_args(argv)
    if args.resume and not args.keep:
        parser.error("--resume needs --keep DIR")

    from tests.invariants import check_invariants
    from pipelines.setup.prepare import setup
    from pipelines.demo.traffic import Traffic

    base = args.keep or Path(tempfile.mkdtemp(prefix="lakecdc-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)              # the cluster below runs as the postgres user
    (base / "logs").mkdir(exist_ok=True)
    state_path = base / STATE_FILE
    if args.resume:
        state = json.loads(state_path.read_text())
    elif state_path.exists():
        parser.error(f"{base} holds a soak already: --resume it or choose another --keep")
    else:
        state = {"port": 0, "moved": [], "run_pgid": None, "seconds": 0.0}

    def save() -> None:
        state_path.write_text(json.dumps(state))

    started = time.monotonic()
    pg, config = _source(base, state["port"], fresh=not args.resume)
    state["port"] = pg.port
    save()
    if state["run_pgid"] and group_members(state["run_pgid"]):
        os.killpg(state["run_pgid"], signal.SIGKILL)       # the interrupted soak's last run
    done = len(state["moved"])
    rng = random.Random(args.seed * 1000 + done)
    stop = threading.Event()
    traffic = Traffic(config.source_dsn, seed=args.seed * 1000 + done)
    writer = threading.Thread(target=traffic.run, args=(stop, args.traffic_interval, 20))

    def started_run(run: RunProcess) -> None:
        state["run_pgid"] = run.pgid
        save()

    soak = Soak(config, base / "logs", done_before=done, on_start=started_run)
    exact = False
    try:
        if not args.resume:
            setup(config)
        witness = _witness(config.source_dsn)
        writer.start()
        for _ in range(done, args.cycles):
            if rng.random() < args.streaming_fraction:
                layer = args.streaming_layer
                mark = getattr(Positions.read(config), layer)
                c = soak.cycle(until=lambda: getattr(Positions.read(config), layer) > mark,
                               then_s=rng.uniform(0, 15))
            else:
                c = soak.cycle(run_for_s=rng.uniform(args.min_kill_s, args.max_kill_s))
            state["moved"].append(c.moved)
            state["run_pgid"] = None
            save()
            print(f"cycle {c.number:3d}: killed after {c.ran_s:5.1f}s "
                  f"({', '.join(sorted(set(c.killed)))}); moved: {', '.join(c.moved) or '-'}",
                  flush=True)
        stop.set()
        writer.join()
        print("traffic stopped; draining with lakecdc run --once ...", flush=True)
        drain_started = time.monotonic()
        print(soak.drain().strip().splitlines()[-1], flush=True)
        drained_s = time.monotonic() - drain_started
        verdict = check_invariants(config, witness)
        exact = True
        moved = {layer: sum(layer in m for m in state["moved"])
                 for layer in ("bronze", "silver", "gold", "pushed")}
        print(f"\nsoak: {len(state['moved'])} kill -9 cycles"
              + (f" ({done} before a resume)" if done else "")
              + f"; this run {time.monotonic() - started:.0f}s (drain {drained_s:.0f}s), "
              f"{traffic.steps} traffic steps")
        print("cycles in which each layer moved before the kill: "
              + ", ".join(f"{k} {v}" for k, v in moved.items()))
        print(f"EXACT: {verdict.summary()}", flush=True)
    except AssertionError as exc:
        print(f"\nsoak: NOT EXACT after {len(state['moved'])} cycles: {exc}", flush=True)
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        if args.keep:
            pg.stop()
            print(f"kept in {base} (logs in {base / 'logs'})", flush=True)
        else:
            pg.destroy()
            shutil.rmtree(base, ignore_errors=True)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
