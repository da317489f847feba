"""Catch-up, end to end: from the moment ``lakecdc run`` can work on a backlog to the moment
the dashboard equals the source.

``lakecdc run`` is the real CLI in a process group of its own (Spark's JVM inside it),
with its defaults: shipping, the one pass, the push and the mirrors share the machine.

- **warm**: a running ``lakecdc run``, caught up on a warm-up round in every layer (its
  mirrors too: their first batch, JIT and the changes held while they loaded, is not part
  of the catch-up), is frozen (SIGSTOP to its group); the backlog is committed
  (``bench.workload.write_backlog``: about ``changes`` changes in transactions of
  ``tx_size`` rows); the group is thawed (SIGCONT). Timed from the thaw.
- **cold**: ``lakecdc run`` started on such a backlog, in a pipeline that ran before (a
  ``run --once`` over a small round: gold and the dashboard hold counts), as after any
  stop. Timed from the process's start. Its start-up is shown apart: from the start to
  the stream's first batch (a new entry in the stream checkpoint's ``offsets``: Python,
  the JVM, the Delta jars, the query). The dashboard follows the shipper from its first
  batch, so it can be exact before that.
- **first**: the same, on a pipeline's very first run: set up, never run. Gold and the
  dashboard's first push come with the stream, so the dashboard waits for it.

The dashboard is read every 50 ms, on one session, and compared with the source's ``GROUP
BY``, taken once the backlog is committed (nothing else writes the source meanwhile). The
dashboard can be exact before gold is (docs/gold.md, "Ahead of the stream": in a catch-up
the stream waits while the dashboard follows the shipper), so ``lakecdc run`` is stopped
only once gold is exact too, and the bench's exactness check finds every layer caught up;
when gold was exact is reported too (``gold_seconds``, from the same start). So is where
the CPU went until the dashboard was exact (``cpu_s``, ``bench.cpu``: the source's Postgres,
the run's Python and JVM, the bench's poll), the budget the two cores set.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench import numbers, workload
from bench.cpu import CpuAccount, parent_pid
from core.config import Config
from core.layout import GOLD, STREAM_CHECKPOINT

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.05
WARM_CHANGES = 20_000


def lakecdc_env(config: Config) -> dict[str, str]:
    """The whole environment of a ``python -m pipelines`` child for ``config`` (and the
    bench's own ``LAKECDC_MIRROR_MERGE_S``: a big mirror MERGEd every batch, to compare)."""
    return {"LAKECDC_SOURCE_DSN": config.source_dsn, "LAKECDC_LAKEHOUSE": config.lakehouse,
            "LAKECDC_SLOT": config.slot, "LAKECDC_DASHBOARD_DSN": config.dashboard,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            **{k: v for k, v in os.environ.items()
               if k in ("SPARK_SUBMIT_OPTS", "JAVA_HOME", "LAKECDC_SPARK_LOG",
                        "LAKECDC_MIRROR_MERGE_S")}}


class RunProcess:
    """``python -m pipelines run`` (or another command line, ``args``) for ``config``, in a
    process group of its own."""

    def __init__(self, config: Config, log: Path, extra: dict[str, str] | None = None,
                 args: tuple[str, ...] = ("run",)) -> None:
        env = {**lakecdc_env(config), **(extra or {})}
        self.log = log
        self._sink = open(log, "ab")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines", *args], env=env,
                                     cwd=ROOT, stdout=self._sink, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"lakecdc {self.proc.args[3]} exited ({self.proc.returncode}): "
                               f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        """SIGTERM to lakecdc's own process (a clean stop: it stops its JVM itself, as
        docs/operations.md, "Stopping", tells users to signal it), then SIGKILL to the
        group if it has not ended within a minute; whatever of the group is left after it
        ended is killed too."""
        try:
            if self.proc.poll() is None:
                self.signal(signal.SIGCONT)
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.signal(signal.SIGKILL)
                    self.proc.wait(timeout=60)
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGKILL)
        finally:
            self._sink.close()


def until_exact(run: RunProcess, config: Config, expected: dict, timeout: float,
                 layer: str = "dashboard", each_poll=lambda: None) -> float:
    """Wait until ``layer`` (the dashboard, or gold) equals ``expected``; returns when
    (``perf_counter``). ``each_poll`` is called before each read."""
    from bench.counts import dashboard_rows, gold_counts

    want = {k: v for k, v in expected.items() if v}
    deadline = time.perf_counter() + timeout
    with (psycopg.connect(config.dashboard, autocommit=True) if layer == "dashboard"
          else contextlib.nullcontext()) as conn:
        read = {"dashboard": lambda: dashboard_rows(conn),
                "gold": lambda: gold_counts(config)}[layer]
        while True:
            each_poll()
            got = {k: v for k, v in read().items() if v}
            if got == want:
                return time.perf_counter()
            run.check()
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the {layer} was not exact within {timeout:.0f} s")
            time.sleep(POLL_S)


def _until_mirrored(run: RunProcess, config: Config, timeout: float) -> None:
    """Wait until the mirrors hold what the dashboard holds (their row of
    ``lakecdc_layer_progress``): a warm run has every layer caught up, its mirrors' first
    batch (their JIT, the changes held while they loaded) done."""
    from core.storage import gold_key
    from gold.push import MIRRORS_LAYER, read_layer

    key = gold_key(config.table_path(GOLD))
    deadline = time.perf_counter() + timeout
    while True:
        dashboard = read_layer(config.dashboard, key, "dashboard")
        mirrors = read_layer(config.dashboard, key, MIRRORS_LAYER)
        if dashboard and mirrors and mirrors[0] >= dashboard[0]:
            return
        run.check()
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the mirrors did not catch up within {timeout:.0f} s")
        time.sleep(POLL_S)


def _postmaster_pid(config: Config) -> int:
    """The source cluster's postmaster: the parent of a session's process, read while the
    session is open."""
    with psycopg.connect(config.source_dsn) as conn:
        return parent_pid(conn.execute("SELECT pg_backend_pid()").fetchone()[0])


def _newest_batch(config: Config) -> int:
    """The stream's newest batch id in its checkpoint's ``offsets`` (-1: none yet)."""
    offsets = Path(config.table_path(STREAM_CHECKPOINT)) / "offsets"
    ids = [int(f.name) for f in offsets.iterdir() if f.name.isdigit()] \
        if offsets.is_dir() else []
    return max(ids, default=-1)


def warm(config: Config, work: Path, changes: int, tx_size: int,
         shape: workload.Shape | None = None) -> dict:
    """The warm figure on ``config``'s database (set up, empty): a backlog like the
    benchmark's (``workload.write_backlog``), or of ``shape`` (``workload.write_shape``;
    the rows it updates are written before the warm-up, and caught up with it)."""
    from bench.counts import truth

    slug = "" if shape is None else "-" + "".join(c if c.isalnum() else "-" for c in shape.name)
    run = RunProcess(config, work / f"catch-up-warm{slug}.log")
    try:
        workload.write_backlog(config.source_dsn, WARM_CHANGES, tx_size, round_rows=1000,
                               tag="w")
        if shape is not None:           # after the warm-up's own updates, which pick any row
            workload.prepare_shape(config.source_dsn, shape)
        warmed = truth(config.source_dsn)
        until_exact(run, config, warmed, timeout=600)
        until_exact(run, config, warmed, timeout=600, layer="gold")    # every layer
        if config.mirrored:
            _until_mirrored(run, config, timeout=600)
        run.signal(signal.SIGSTOP)
        load = numbers.load()
        written = workload.write_backlog(config.source_dsn, changes, tx_size) \
            if shape is None else workload.write_shape(config.source_dsn, shape)
        expected = truth(config.source_dsn)
        account = CpuAccount(run.proc.pid, _postmaster_pid(config))
        account.start()
        thawed = time.perf_counter()
        run.signal(signal.SIGCONT)
        exact = until_exact(run, config, expected, timeout=1800)
        cpu = account.stop()
        gold = until_exact(run, config, expected, timeout=600, layer="gold")
    finally:
        run.stop()
    seconds = exact - thawed
    return {"load_before": load, "workload": written.as_dict(), "seconds": round(seconds, 2),
            "changes_per_s": numbers.rate(written.changes, seconds),
            "gold_seconds": round(gold - thawed, 2), "cpu_s": cpu}


def cold(config: Config, work: Path, changes: int, tx_size: int, restart: bool = True) -> dict:
    """The cold figure on ``config``'s database (set up, empty). ``restart``: a pipeline
    that has run before (``lakecdc run --once`` over a small round: gold and the dashboard
    hold its counts), as after any stop; else its very first run."""
    from bench.counts import truth

    if restart:
        workload.write_backlog(config.source_dsn, WARM_CHANGES, tx_size, round_rows=1000,
                               tag="w")
        done = subprocess.run([sys.executable, "-m", "pipelines", "run", "--once"],
                              env=lakecdc_env(config), cwd=ROOT, capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"lakecdc run --once failed: {done.stderr[-2000:]!r}")
    written = workload.write_backlog(config.source_dsn, changes, tx_size)
    expected = truth(config.source_dsn)
    load = numbers.load()
    run = RunProcess(config, work / f"catch-up-{'cold' if restart else 'first'}.log")
    before, up = _newest_batch(config), []

    def stream_started() -> None:
        if not up and _newest_batch(config) > before:
            up.append(time.perf_counter())
    try:
        account = CpuAccount(run.proc.pid, _postmaster_pid(config))
        account.start()
        exact = until_exact(run, config, expected, timeout=1800, each_poll=stream_started)
        cpu = account.stop()
        gold = until_exact(run, config, expected, timeout=600, layer="gold",
                            each_poll=stream_started)
        stream_started()
    finally:
        run.stop()
    total = exact - run.started
    return {"load_before": load, "workload": written.as_dict(), "restart": restart,
            "seconds": round(total, 2), "changes_per_s": numbers.rate(written.changes, total),
            "gold_seconds": round(gold - run.started, 2),
            "start_up_s": round(up[0] - run.started, 2) if up else None, "cpu_s": cpu}
