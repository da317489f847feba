"""Running the real CLI from tests, and waiting on conditions without fixed sleeps."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from core.config import Config

ROOT = Path(__file__).resolve().parents[1]


# What a Databricks workspace's spark-defaults.conf may turn on for every new table.
WORKSPACE_DEFAULTS = {f"spark.databricks.delta.properties.defaults.{key}": value
                      for key, value in {"enableDeletionVectors": "true",
                                         "columnMapping.mode": "name",
                                         "enableRowTracking": "true"}.items()}


def cli_env(config: Config) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECDC_")}
    env.update({"LAKECDC_SOURCE_DSN": config.source_dsn, "LAKECDC_LAKEHOUSE": config.lakehouse,
                "LAKECDC_SLOT": config.slot, "PYTHONPATH": str(ROOT)})
    if config.dashboard_dsn:
        env["LAKECDC_DASHBOARD_DSN"] = config.dashboard_dsn
    env["LAKECDC_MIRRORS"] = "all" if config.mirrors is None else \
        (",".join(config.mirrors) or "none")
    env["LAKECDC_MIRROR_INTERVAL"] = f"{config.mirror_interval_s:g}"
    return env


def spark_properties(path: Path, settings: dict[str, str]) -> dict[str, str]:
    """Spark settings for a CLI child's JVM alone, written to ``path`` as a properties file
    (``spark-defaults.conf``'s format): the environment that makes ``spark-submit`` read it
    (``--properties-file``), holding its path, not the settings.

    Not a ``SPARK_CONF_DIR``: Spark puts that directory first on the JVM's classpath, so the
    test JVMs' class archive (Makefile, ``tests/jvm_warmup.py``), made for pyspark's own
    classpath, no longer maps (``setup`` of an S3 lakehouse through Spark alone, a JVM's
    start and first writes: 26.5 -> 23.9 s on an idle machine, 43.6 -> 35.9 s at load 5)."""
    path.write_text("".join(f"{key} {value}\n" for key, value in settings.items()))
    return {"PYSPARK_SUBMIT_ARGS": f"--properties-file {shlex.quote(str(path))} pyspark-shell"}


def run_cli(args: list[str], env: dict[str, str],
            timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def one_sentence(code: int, err: str, *phrases: str) -> str:
    """Bad input's contract: exit 2 with exactly one ``lakecdc: error:`` line and no
    traceback, each of ``phrases`` in that line; returns the line."""
    lines = [ln for ln in err.splitlines() if ln.startswith("lakecdc: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def error_line(result: subprocess.CompletedProcess, *phrases: str) -> str:
    """``one_sentence`` for a finished ``run_cli``."""
    return one_sentence(result.returncode, result.stderr, *phrases)


def wait_for(condition, timeout: float, interval: float = 0.05) -> None:
    """Poll ``condition`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@contextmanager
def running_shipper(config: Config, engine=None):
    """A shipper (``bronze.ship.Shipper``; with ``engine``, a ``core.engine`` one, when given)
    in a thread of this process, from the moment it holds its slot's lock (what ``tables
    add`` asks for) until the block ends; then stopped and joined."""
    import threading

    import psycopg

    from bronze.ship import Shipper
    from core.locks import is_held, ship_lock_name

    stop = threading.Event()
    thread = threading.Thread(target=Shipper(config, engine=engine).run, kwargs={"stop": stop},
                              daemon=True)
    thread.start()
    try:
        with psycopg.connect(config.source_dsn, autocommit=True) as conn:
            wait_for(lambda: not thread.is_alive()
                     or is_held(conn, ship_lock_name(config.slot)), timeout=120)
        assert thread.is_alive(), "the shipper stopped as it started"
        yield
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive(), "the shipper did not stop"


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


def stream_paths(lakehouse: Path):
    """The one-pass stream's tables under a bare lakehouse directory (no Config)."""
    from gold.gold_tables import GoldPaths
    from pipelines.run.stream import StreamPaths

    return StreamPaths(bronze=str(lakehouse / "bronze" / "wal2json_changes"),
                       silver=str(lakehouse / "silver" / "changes"),
                       quarantine=str(lakehouse / "silver" / "quarantine"),
                       gold=GoldPaths.beside(str(lakehouse / "gold" / "service_stats")),
                       checkpoint=str(lakehouse / "_checkpoints" / "stream"))


def start_bare_stream(spark, paths, known_tables, once: bool = True, *, counted=None,
                      accept_errors_upto: int = 0, switches=None, **start):
    """The one-pass stream on bare paths, as ``Pipeline.start_stream`` wires it, without a
    source (no baseline seed): returns (query, writer). ``switches``: the fault points and
    guards switched off every stage is handed (None: none, every guard on)."""
    from core.captured import COUNTED
    from core.switches import NONE
    from gold.start import gold_writer
    from pipelines.run.stream import SilverGoldWriter, prepare, start_stream
    from silver.writer import SilverWriter

    switches = switches or NONE
    silver = SilverWriter(paths.silver, paths.quarantine, known_tables, switches=switches,
                          counted_tables=(counted or COUNTED).names)
    prepare(spark, paths, silver)
    gold = gold_writer(spark, paths.gold, tables=counted or COUNTED,
                       accept_errors_upto=accept_errors_upto, switches=switches)
    writer = SilverGoldWriter(silver, gold, switches)
    return start_stream(spark, paths, writer, once, **start), writer


def run_bare_stream(spark, paths, known_tables, **kw):
    """``start_bare_stream`` with ``once``, awaited: the ``StreamRun``."""
    from pipelines.run.stream import await_stream

    return await_stream(*start_bare_stream(spark, paths, known_tables, True, **kw))


def run_gold_over_silver(spark, silver: str, gold: str, checkpoint: str, *,
                         max_files_per_trigger: int | None = None, **writer) -> list:
    """The gold half of the stream's batches, fed by a stream over a silver table that a
    test wrote directly (``availableNow``): ``gold.apply`` across real micro-batches, with
    transactions split between them. Returns the batches' ``GoldBatch``es; a batch's own
    error is raised as itself."""
    from pyspark.errors import StreamingQueryException

    from gold.gold_tables import GoldPaths
    from gold.start import gold_writer, prepare_gold

    paths = GoldPaths.beside(gold)
    prepare_gold(spark, paths)
    gold = gold_writer(spark, paths, **writer)
    results, failures = [], []

    def batch(frame, batch_id: int) -> None:
        try:
            results.append(gold.apply(frame.sparkSession, frame.toArrow(), batch_id))
        except BaseException as exc:
            failures.append(exc)
            raise

    reader = spark.readStream.format("delta")
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    query = (reader.load(silver).writeStream.option("checkpointLocation", checkpoint)
             .foreachBatch(batch).trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except StreamingQueryException:
        if failures:
            raise failures[-1] from None
        raise
    gold.fold()                     # as the stream's end does (``SilverGoldWriter.finish``)
    return results


def free_port() -> int:
    """A TCP port nothing listens on now, for a server a test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on ``port`` of this machine."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Crash(Exception):
    """A process ending at one of lakecdc's fault points, as an exception in the test's own
    process (its JVM goes on): what ``LAKECDC_FAULT``'s ``os._exit`` does to a CLI
    subprocess, for code run in-process."""


def crash_once_at(monkeypatch, point: str) -> None:
    """The next pass through fault point ``point`` raises ``Crash``; later ones pass."""
    from core.switches import Switches

    original = Switches.hit

    def hit(self, name: str) -> None:
        if name == point:
            monkeypatch.setattr(Switches, "hit", original)
            raise Crash(name)
        original(self, name)
    monkeypatch.setattr(Switches, "hit", hit)
