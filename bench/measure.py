"""The benchmark's measurements, each on its own database of one throw-away cluster.

``run_all(params)`` returns the result document (``bench.report`` renders it):

- ``backlog``: a deterministic backlog (``bench.workload.write_backlog``) in database
  ``bench``: raw decode on a witness slot (timed before and after the shipper),
  ``pg_recvlogical`` and psycopg's replication protocol on two more (``bench.decode``),
  against ``lakecdc ship --once`` on the same content; then the stream (bronze → silver and gold in
  one pass, ``once``: everything available) and the push, each timed alone, with the
  stream's per-batch account (``bench.profile.PassLog``); lakecdc's gold and dashboard
  against the source ``GROUP BY``. The PoC (``bench.poc``) drains its own slot, which saw
  the same WAL, and is compared with the same ``GROUP BY``; so is the PoC on a twin database
  that got the same backlog under the default replica identity (the primary key), as the
  PoC was deployed.
- ``freshness``: per rate, ``lakecdc run`` (continuous) on ``bench``; once its streaming
  query is up, ``SteadyTraffic`` writes at that steady rate, ``NeighbourTraffic`` changes
  three other captured tables (mirrored, not counted) at 100 rows/s each, and a
  ``pipelines.demo.traffic.FreshnessProbe`` commits a never-seen service every 0.5 s and times
  each until its row is on the dashboard. Then everything is drained and checked, the
  neighbours' mirrors against their tables too.
- ``catch_up``: ``lakecdc run`` as its own process, frozen (SIGSTOP) while a backlog of
  ``changes`` is committed then thawed, and started cold on one: from the thaw (the start)
  to an exact dashboard (``bench.catch_up``).
- ``writers``: freshness as in ``freshness``, with every write through Spark
  (``LAKECDC_WRITER=spark``) beside the delta-rs path, each on a database of its own.
- ``gold_scaling``: per gold size (10,000 to 1,000,000 keys), a database holding that many
  keys before ``setup`` (they reach gold through the baseline), then ``lakecdc run`` under
  2,000 changes/s spread over every service, probed (and 200/s at the largest): the gold
  half of each continuous batch, and the dashboard's freshness.
- ``big_transaction``: one transaction of ``big_tx_rows`` inserts, drained by
  ``lakecdc ship --once``; the child's peak RSS.
- ``big_table``: ``lakecdc tables add`` of a ``big_rows``-row table while ``lakecdc run``
  runs under ``big_rate`` changes/s, beside Postgres's own COPY of it, then its mirror
  kept under that traffic for ``big_kept_s`` (``bench.big_table``); the same on a
  ``big_compare_rows``-row table first, whose mirror's batches the big one's are set
  against.

Load averages are recorded at the start of every section: the machine is shared.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import psycopg
from deltalake import DeltaTable

from bench import big_table, catch_up, decode, numbers, poc, workload
from bench.counts import (
    exactness,
    gold_counts,
    mirror_is_source,
    truth,
)
from bench.drive import Drive, DriveProcess
from bench.profile import PassLog, ProgressLog
from bench.stages import StageClock
from core.config import Config
from core.layout import GOLD, mirror_path
from infra.localpg import LocalPostgres
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup

SCHEMA = (Path(__file__).resolve().parents[1] / "infra" / "postgres" /
          "source_schema.sql").read_text()
NEIGHBOUR_RATE = 100.0         # rows/s on each neighbour table during the freshness runs


@dataclass(frozen=True)
class Params:
    changes: int = 300_000            # backlog size (at least this many changes)
    tx_size: int = 1000               # rows per insert transaction in the backlog
    rates: tuple[float, ...] = (2000.0, 200.0)   # freshness: changes per second, one run each
    freshness_s: float = 120.0        # freshness: seconds of steady traffic
    scale_keys: tuple[int, ...] = (10_000, 100_000, 1_000_000)    # gold scaling: gold keys
    scale_rates: tuple[float, ...] = (2000.0, 200.0)   # the second at the largest gold only
    scale_s: float = 90.0             # gold scaling: seconds of traffic per run
    big_tx_rows: int = 1_000_000
    big_rows: int = 10_000_000        # the big table: rows of ``public.big`` (bench.big_table)
    big_rate: float = 2000.0          # its traffic: changes/s, half on it, half counted
    big_kept_s: float = 300.0         # its mirror kept under the traffic, probed
    big_compare_rows: int = 1_000_000   # the same first on a table this big (0: not)
    shape_changes: int = 300_000      # catch-up: each shape's backlog (workload.shapes)
    quick: bool = False


def _merges_since(path: str, version: int) -> int:
    """Gold's MERGEs (its folds, in the background or with their batch) after ``version``,
    read from its history: the stream's end folds once more."""
    return sum(1 for commit in DeltaTable(path).history()
               if commit.get("version", -1) > version and commit.get("operation") == "MERGE")


def _seen(drove: Drive, clock: StageClock, neighbours: bool) -> dict:
    """What the probes saw in a continuous run: the dashboard's latencies (and their stages
    and series), gold's read by path, the mirror's; the traffic written."""
    latencies = drove.latencies
    out = {"probes": {"committed": drove.probes_committed, "seen": len(latencies)},
           "written": drove.written,
           "achieved_rate": round(drove.written["changes"] / max(drove.traffic_elapsed_s, 1e-9)),
           "latency_s": numbers.percentiles([lat for _, lat in latencies]),
           "stages": clock.breakdown(latencies),
           # The same probes seen in service_stats read by path, as a SQL reader sees gold.
           "gold_latency_s": numbers.percentiles([lat for _, lat in drove.gold_latencies]),
           # Freshness over time: each probe's latency against when it was committed.
           "series": [(round(t - drove.started_at, 2), round(lat, 2)) for t, lat in latencies]}
    if neighbours:
        out["mirror_probes"] = {"committed": drove.mirror_probes_committed,
                                "seen": len(drove.mirror_latencies)}
        out["mirror_latency_s"] = numbers.percentiles([lat for _, lat in drove.mirror_latencies])
    return out


class Bench:
    """One throw-away Postgres cluster, one Spark session, one work directory."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self.work = Path(tempfile.mkdtemp(prefix="lakecdc-bench-"))
        self.pg = LocalPostgres(Path(tempfile.mkdtemp(prefix="lakecdc-bench-pg-")))
        self.progress = ProgressLog()
        self.spark = None
        self._runs = 0                   # freshness runs so far (their neighbours' ids)
        self._bench: tuple[Config, Pipeline] | None = None    # the backlog's database

    def __enter__(self) -> "Bench":
        self.pg.start()
        from core.spark import get_or_create
        self.spark = get_or_create("lakecdc-bench")
        self.spark.streams.addListener(self.progress.listener())
        self.passes = PassLog(self.spark)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.spark is not None:
                self.spark.stop()
        finally:
            self.pg.destroy()
            shutil.rmtree(self.work, ignore_errors=True)

    def database(self, name: str, identity: bool = True,
                 neighbours: bool = False) -> Config:
        """A fresh database with the source schema; its config (slot = database name).
        ``neighbours``: with ``workload.NEIGHBOURS`` too, captured beside the counted two."""
        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')      # names are ours: [a-z0-9_]
        dsn = self.pg.dsn(name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            if neighbours:
                conn.execute(workload.NEIGHBOURS_SQL)
        config = Config.load(env={}, source_dsn=dsn, lakehouse=str(self.work / name),
                             slot=name)
        return config.with_(tables=(*config.tables, *workload.NEIGHBOURS)) if neighbours \
            else config

    def pipeline(self, config: Config, **kw) -> Pipeline:
        pipeline = Pipeline(config, spark_factory=lambda: self.spark, **kw)
        pipeline.on_pass.append(self.passes.on_pass)
        return pipeline

    # --- sections -----------------------------------------------------------------------

    def backlog(self) -> dict:
        p = self.params
        out: dict = {"load_before": numbers.load()}
        config = self.database("bench", neighbours=True)
        twin = self.database("bench_twin")
        poc.create(config.source_dsn, "poc_bench")
        poc.create(twin.source_dsn, "poc_twin")
        setup(config)
        pipeline = self.pipeline(config)
        # Warm-up (JVM, tables, first plans), not timed: a small round through every layer.
        warm = min(20_000, max(2_000, p.changes // 20))
        for dsn in (config.source_dsn, twin.source_dsn):
            workload.write_backlog(dsn, warm, p.tx_size, round_rows=1000, tag="w")
        pipeline.run_once()
        decode.create_witness(config.source_dsn, "witness")
        decode.create_witness(config.source_dsn, "witness_recv")
        decode.create_witness(config.source_dsn, "witness_repl")
        started = time.perf_counter()
        written = workload.write_backlog(config.source_dsn, p.changes, p.tx_size)
        out["write_s"] = round(time.perf_counter() - started, 2)
        endpos = decode.current_lsn(config.source_dsn)
        workload.write_backlog(twin.source_dsn, p.changes, p.tx_size)
        out["workload"] = written.as_dict()

        out["decode"] = decode.against_postgres(config, written.changes, endpos)
        out["layers"], out["spark_progress"] = self._layers(pipeline, written.changes)
        out["lakecdc"] = exactness(config)
        for name, cfg, slot in (("poc_same_wal", config, "poc_bench"),
                                ("poc_pk_identity", twin, "poc_twin")):
            out[name] = poc.measured(cfg, slot)
        out["twin_identical"] = truth(config.source_dsn) == truth(twin.source_dsn)
        self._bench = (config, pipeline)
        return out

    def _layers(self, pipeline: Pipeline, changes: int) -> tuple[dict, dict]:
        """The backlog through each layer of ``pipeline`` in turn, timed: (layers, the
        stream's Spark progress)."""
        layers: dict = {}
        profile: dict = {}
        with self.progress.window(profile):
            mark = self.passes.mark()
            t = time.perf_counter()
            run = pipeline.stream(once=True)
            layers["stream"] = {"seconds": round(time.perf_counter() - t, 2),
                                "rows": run.silver_rows,
                                "transactions": run.applied_transactions,
                                "batches": run.batches,
                                "per_batch": self.passes.summary(mark)}
        t = time.perf_counter()
        push = pipeline.push(once=True)
        layers["push"] = {"seconds": round(time.perf_counter() - t, 2),
                          "keys": push.upserted + push.deleted}
        for layer in layers.values():
            layer["changes_per_s"] = numbers.rate(changes, layer["seconds"])
        catch_up = sum(layer["seconds"] for layer in layers.values())
        layers["stream_push"] = {"seconds": round(catch_up, 2),
                                 "changes_per_s": numbers.rate(changes, catch_up)}
        # The mirrors of the captured tables, after the gold path: timed on their own, and
        # caught up before the freshness runs (a `run` that starts behind on them spends its
        # first minutes catching them up beside the stream).
        t = time.perf_counter()
        pipeline.mirrors(once=True)
        seconds = time.perf_counter() - t
        layers["mirrors"] = {"seconds": round(seconds, 2),
                             "changes_per_s": numbers.rate(changes, seconds)}
        return layers, profile

    def freshness(self) -> dict:
        """One continuous run per rate in ``rates``, each on the caught-up ``bench``."""
        p = self.params
        return {"load_before": numbers.load(), "seconds": p.freshness_s,
                "runs": [self._freshness_at(rate) for rate in p.rates]}

    def _warmed(self, config: Config) -> Pipeline:
        """``config``'s database set up, and its pipeline caught up in every layer on a
        round of 2,000 changes."""
        setup(config)
        pipeline = self.pipeline(config)
        workload.write_backlog(config.source_dsn, 2_000, self.params.tx_size, round_rows=1000,
                               tag="w")
        pipeline.run_once()
        return pipeline

    def _caught_up(self) -> tuple[Config, Pipeline]:
        """The backlog section's database, caught up in every layer; without that section
        (``--sections``), one of its own, warmed as the writers section's are."""
        if self._bench is None:
            config = self.database("bench", neighbours=True)
            self._bench = (config, self._warmed(config))
        return self._bench

    def _freshness_at(self, rate: float) -> dict:
        config, pipeline = self._caught_up()
        out, drove = self.continuous(config, pipeline, rate, self.params.freshness_s)
        out["neighbours"] = {
            "tables": len(workload.NEIGHBOURS), "rate_per_table": NEIGHBOUR_RATE,
            "changes": drove.neighbour_changes,
            "achieved_per_table": round(drove.neighbour_changes / len(workload.NEIGHBOURS)
                                        / max(drove.neighbour_elapsed_s, 1e-9)),
            "mirrors_equal_source": all(mirror_is_source(config, t)
                                        for t in workload.NEIGHBOURS)}
        return out

    def continuous(self, config: Config, pipeline: Pipeline, rate: float, seconds: float,
                    services: int = 8, neighbours: bool = True,
                    watch_gold: bool = True) -> tuple[dict, Drive]:
        """``lakecdc run`` under traffic at ``rate`` for ``seconds`` (inserts over
        ``services`` services; the neighbour tables too with ``neighbours``), the probe's
        latencies, per-batch seconds; then drained and checked against the source. Returns
        the measurement and what the traffic did. ``watch_gold``: the probes are looked for
        in gold read by path too (a read of gold every 0.2 s: not for a large gold, where
        the reads would take the cores the run needs)."""
        out: dict = {"load_before": numbers.load(), "rate": rate, "seconds": seconds}
        stop_pipeline = threading.Event()
        self._runs += 1
        errors: list[BaseException] = []

        def run_pipeline():
            try:
                pipeline.run_continuous(stop_pipeline)
            except BaseException as exc:         # reported below, with the measurement
                errors.append(exc)

        runner = threading.Thread(target=run_pipeline, name="bench-pipeline", daemon=True)
        gold_path = config.table_path(GOLD)
        gold_before = DeltaTable(gold_path).version()
        out["spark_progress"] = {}
        mark = self.passes.mark()
        clock = StageClock()
        pipeline.on_ship.append(clock.on_ship)
        pipeline.on_pass.append(clock.on_pass)
        with self.progress.window(out["spark_progress"]):
            runner.start()
            # Traffic starts once the continuous pipeline runs (its streaming query is
            # active): its start-up is not part of a change's path in production.
            ready_by = time.monotonic() + 300
            while not pipeline.started.wait(0.2) and not errors:
                if time.monotonic() > ready_by:
                    raise RuntimeError("the continuous pipeline did not start within 300 s")
            if not errors:
                # The clients in a process of their own (``bench.drive``: why).
                client = DriveProcess(
                    source_dsn=config.source_dsn, dashboard_dsn=config.dashboard, rate=rate,
                    neighbour_rate=NEIGHBOUR_RATE if neighbours else 0.0,
                    neighbour_first_id=self._runs * 1_000_000_000,
                    seconds=seconds, tag=f"r{rate:g}-{self._runs}", services=services,
                    mirror_uri=mirror_path(config.lakehouse, "public.services")
                    if neighbours else None, gold_uri=gold_path if watch_gold else None)
                drove = client.result(timeout=seconds + 300)
        stop_pipeline.set()
        runner.join(timeout=300)
        pipeline.on_ship.remove(clock.on_ship)
        pipeline.on_pass.remove(clock.on_pass)
        if errors:
            raise errors[0]
        if drove.errors:
            raise RuntimeError(f"the benchmark's traffic failed: {'; '.join(drove.errors)}")
        out["per_batch"] = self.passes.summary(mark)
        out["gold_half_s"] = self._gold_half(mark, gold_path, gold_before)
        out.update(_seen(drove, clock, neighbours))
        out["load_after"] = numbers.load()
        pipeline.run_once()
        out["lakecdc"] = exactness(config)
        return out, drove

    def _gold_half(self, mark: int, gold_path: str, gold_before: int) -> dict:
        """The gold half of the passes since ``mark``, and gold's folds since its version
        ``gold_before``."""
        passes = self.passes.passes[mark:]
        gold = [b["gold_s"] for b in passes]
        if not gold:
            return {"median": None, "mean": None, "p90": None,
                    "folds": _merges_since(gold_path, gold_before), "ahead_median": None,
                    "step_keys_median": None}
        return {"median": round(statistics.median(gold), 4),
                "mean": round(statistics.fmean(gold), 4),
                "p90": numbers.percentiles(gold, 3).get("p90"),
                "folds": _merges_since(gold_path, gold_before),
                "ahead_median": round(statistics.median(b.get("ahead_s", 0.0) for b in passes),
                                      4),
                "step_keys_median": statistics.median(b.get("step_keys", 0) for b in passes)}

    def writers(self, seconds: float | None = None) -> dict:
        """Freshness with every write through Spark (``LAKECDC_WRITER=spark``, the path of
        workspaces where only Spark reaches storage) beside the delta-rs path's, at each of
        ``rates``, each writer on a database and lakehouse of its own, set up and warmed the
        same way (``continuous``)."""
        p = self.params
        out: dict = {"load_before": numbers.load(), "runs": []}
        for writer in ("delta-rs", "spark"):
            config = self.database(f"writer_{writer.replace('-', '_')}", neighbours=True
                                   ).with_(writer=writer)
            pipeline = self._warmed(config)
            for rate in p.rates:
                run, _ = self.continuous(config, pipeline, rate, seconds or p.freshness_s)
                out["runs"].append({"writer": writer, **run})
        return out

    def catch_up(self) -> dict:
        """The end-to-end catch-up of a ``lakecdc run`` process, warm (frozen while the
        backlog is committed, then thawed), cold (started again on the backlog) and first
        (its very first run, on the backlog), then warm on backlogs of other shapes
        (``workload.shapes``), each on a database of its own (``bench.catch_up``)."""
        p = self.params
        out: dict = {"load_before": numbers.load()}
        for name, measure in (("warm", catch_up.warm), ("cold", catch_up.cold),
                              ("first", partial(catch_up.cold, restart=False))):
            config = self.database(f"catchup_{name}")
            setup(config)
            out[name] = measure(config, self.work, p.changes, p.tx_size)
            out[name]["lakecdc"] = exactness(config)
        out["shapes"] = []
        for i, shape in enumerate(workload.shapes(p.shape_changes)):
            config = self.database(f"catchup_shape{i}")
            setup(config)
            run = catch_up.warm(config, self.work, p.changes, p.tx_size, shape)
            out["shapes"].append({"shape": asdict(shape), **run,
                                  "lakecdc": exactness(config)})
        return out

    def gold_scaling(self) -> dict:
        """Per gold size (``scale_keys``): a database holding that many keys before
        ``setup`` (``workload.populate_keys``: gold seeded with them), then ``lakecdc run``
        under traffic at 2,000 changes/s spread over all its services, probed; at the
        largest also at 200/s. The gold half of each continuous batch, and freshness."""
        p = self.params
        out: dict = {"load_before": numbers.load(), "points": []}
        for i, keys in enumerate(p.scale_keys):
            config = self.database(f"scale{i}").with_(mirrors=())     # gold's path only
            services = workload.populate_keys(config.source_dsn, keys)
            setup(config)
            pipeline = self.pipeline(config)
            pipeline.run_once()                        # seeds gold with the baseline
            point = {"gold_keys": len(gold_counts(config)), "services": services, "runs": []}
            for rate in p.scale_rates if keys == p.scale_keys[-1] else p.scale_rates[:1]:
                run, _ = self.continuous(config, pipeline, rate, p.scale_s,
                                          services=services, neighbours=False,
                                          watch_gold=False)
                point["runs"].append({k: run[k] for k in (
                    "rate", "achieved_rate", "load_before", "load_after", "latency_s",
                    "per_batch", "gold_half_s", "lakecdc")})
            out["points"].append(point)
        first, last = (pt["runs"][0]["gold_half_s"] for pt in
                       (out["points"][0], out["points"][-1]))
        out["key_growth"] = round(out["points"][-1]["gold_keys"]
                                  / out["points"][0]["gold_keys"], 1)
        out["batch_growth"] = round(last["median"] / first["median"], 2)
        out["batch_growth_mean"] = round(last["mean"] / first["mean"], 2)
        return out

    def big_table(self) -> dict:
        """``tables add`` of a ``big_rows``-row table under traffic, its mirror kept
        (``bench.big_table``); first the same with ``big_compare_rows`` rows: how the
        mirrors' batches grow with the table (``kept_growth``)."""
        p = self.params
        smaller = self._big_table("bigsmall", p.big_compare_rows) \
            if p.big_compare_rows else None
        out = self._big_table("big", p.big_rows)
        if smaller is not None:
            out["smaller"] = smaller
            mean = [d["kept"]["mirrors_batch_mean_s"] for d in (smaller, out)]
            out["kept_growth"] = round(mean[1] / mean[0], 2) if all(mean) else None
        return out

    def _big_table(self, name: str, rows: int) -> dict:
        p = self.params
        config = self.database(name)
        big_table.create_big(config.source_dsn, rows)
        setup(config)
        return big_table.measure(config, self.work, rows, p.big_rate, p.big_kept_s)

    def big_transaction(self) -> dict:
        p = self.params
        out: dict = {"load_before": numbers.load(), "rows": p.big_tx_rows}
        config = self.database("bigtx")
        setup(config)
        with psycopg.connect(config.source_dsn, autocommit=True) as conn:
            workload.insert_rows(conn, "big", p.big_tx_rows)
        ship = decode.ship_once(config)
        out.update(ship_s=round(ship.seconds, 2), peak_rss_mb=round(ship.peak_rss_mb),
                   changes_per_s=numbers.rate(p.big_tx_rows, ship.seconds))
        out["bronze_rows"] = DeltaTable(config.bronze_path).to_pyarrow_table(
            columns=["seq"]).num_rows
        return out


SECTIONS = ("backlog", "freshness", "catch_up", "writers", "gold_scaling", "big_transaction",
            "big_table")


def run_all(params: Params, say=lambda text: None, save=lambda doc: None,
            sections: tuple[str, ...] = SECTIONS) -> dict:
    """Every section of ``sections`` in order; ``save(doc)`` after each, so a failure keeps
    what was measured before it."""
    started = datetime.now(timezone.utc)
    doc: dict = {"started_at": started.isoformat(timespec="seconds"), "params": asdict(params),
                 "machine": numbers.machine(), "load_start": numbers.load()}
    with Bench(params) as bench:
        t = time.perf_counter()
        for name in (n for n in SECTIONS if n in sections):
            section = getattr(bench, name)
            say(f"{name} (load {numbers.load()}) ...")
            begun = time.perf_counter()
            doc[name] = section()
            doc[name]["section_s"] = round(time.perf_counter() - begun, 1)
            say(f"{name}: {doc[name]['section_s']} s")
            save(doc)
        doc["seconds"] = round(time.perf_counter() - t)
    doc["load_end"] = numbers.load()
    return doc
