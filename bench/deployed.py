"""What the bundle deploys, measured as deployed (``python -m bench.deployed``).

The bundle's continuous job is read from ``resources/lakecdc_run.job.yml``: each of its
tasks' command lines is started as the real CLI (``python -m pipelines ARGS``, a process
group of its own, its own JVM), on a fresh database, **before** setup, as a deployment
starts it; then setup runs, as an operator runs the setup job. Once the pipeline has put a
warm-up round on the dashboard, the traffic runs at each rate for ``seconds`` with the
freshness probe (``bench.drive``: a never-seen service every 0.5 s, timed until its row is
on the dashboard; the same probes are looked for in ``service_stats`` read by path, as a SQL
reader of gold sees it), then the dashboard is compared with the source's ``GROUP BY``.

Beside it, the same job with the stream's trigger at 1 s (``LAKECDC_TRIGGER_INTERVAL=1``):
what a shorter wait for the stream's micro-batch does for gold read by path. And for
comparison, the stages as separate processes (``ship``; ``stream``, ``push`` and
``mirrors`` with ``--wait-for-input``), the topology the bundle deployed before it ran
``lakecdc run``: the same database size, traffic and probe, started after setup.

Targets (the ones ``run`` meets): the probe's p95 at most 1 s at 2,000 changes/s and 0.5 s
at 200/s on the dashboard, and 2 s on gold read by path at either rate. Writes
``docs/benchmarks/deployed.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
import yaml

from bench import numbers, workload
from bench.catch_up import RunProcess, until_exact
from bench.counts import exactness, truth
from bench.drive import DriveProcess
from bench.measure import SCHEMA
from core.config import Config
from core.layout import GOLD
from infra.localpg import LocalPostgres
from pipelines.setup.prepare import setup

ROOT = Path(__file__).resolve().parents[1]
RUN_JOB = ROOT / "resources" / "lakecdc_run.job.yml"
# The bundle's topology before it ran `lakecdc run`: four processes.
STAGES = (("ship",), ("stream", "--wait-for-input", "1800"),
          ("push", "--wait-for-input", "1800"), ("mirrors", "--wait-for-input", "1800"))
# The bundle's job with the stream's trigger at 1 s (LAKECDC_TRIGGER_INTERVAL): what a
# faster trigger buys readers of gold, beside the default's 2 s.
FAST_TRIGGER = {"LAKECDC_TRIGGER_INTERVAL": "1"}
TARGET_P95_S = {2000.0: 1.0, 200.0: 0.5}
LABELS = {"bundle": "the bundle (as deployed)",
          "bundle_trigger_1s": "the bundle, `LAKECDC_TRIGGER_INTERVAL=1`",
          "stages": "stages as separate jobs (before)"}
GOLD_TARGET_P95_S = 2.0


@dataclass(frozen=True)
class Params:
    rates: tuple[float, ...] = (2000.0, 200.0)
    seconds: float = 90.0
    warm_changes: int = 2_000
    stages: bool = True                  # the separate stages too


def deployed_commands() -> list[tuple[str, ...]]:
    """The command line of each task of the bundle's continuous job(s)."""
    jobs = yaml.safe_load(RUN_JOB.read_text())["resources"]["jobs"]
    return [tuple(t["python_wheel_task"]["parameters"])
            for job in jobs.values() if "continuous" in job for t in job["tasks"]]


def _database(pg: LocalPostgres, work: Path, name: str) -> Config:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')          # names are ours: [a-z0-9_]
    with psycopg.connect(pg.dsn(name), autocommit=True) as conn:
        conn.execute(SCHEMA)
    return Config.load(env={}, source_dsn=pg.dsn(name), lakehouse=str(work / name), slot=name)


def _one(pg: LocalPostgres, work: Path, topology: str, rate: float, params: Params) -> dict:
    name = f"{topology}_{int(rate)}"
    config = _database(pg, work, name)
    bundle = topology != "stages"
    env = FAST_TRIGGER if topology == "bundle_trigger_1s" else {}
    commands = deployed_commands() if bundle else list(STAGES)
    out: dict = {"topology": topology, "rate": rate, "commands": [" ".join(c) for c in commands],
                 "load_before": numbers.load()}
    procs: list[RunProcess] = []
    try:
        if bundle:                          # deployed running, before the setup job ran
            procs = [RunProcess(config, work / f"{name}-{i}.log", env, args=c)
                     for i, c in enumerate(commands)]
            out["waited_for_setup"] = _said_waiting(procs)
        started = time.perf_counter()
        setup(config)
        if not bundle:
            procs = [RunProcess(config, work / f"{name}-{i}.log", args=c)
                     for i, c in enumerate(commands)]
        workload.write_backlog(config.source_dsn, params.warm_changes, 1000, round_rows=1000,
                               tag="w")
        expected = truth(config.source_dsn)
        until_exact(procs[0], config, expected, timeout=600,
                     each_poll=lambda: [p.check() for p in procs])
        out["setup_to_exact_s"] = round(time.perf_counter() - started, 1)
        drove = DriveProcess(source_dsn=config.source_dsn, dashboard_dsn=config.dashboard,
                             rate=rate, neighbour_rate=0.0, neighbour_first_id=0,
                             seconds=params.seconds, tag=f"{name}-",
                             services=8, gold_uri=config.table_path(GOLD),
                             ).result(timeout=params.seconds + 300)
        if drove.errors:
            raise RuntimeError(f"the benchmark's traffic failed: {'; '.join(drove.errors)}")
        for p in procs:
            p.check()
        expected = truth(config.source_dsn)
        for layer in ("dashboard", "gold"):    # the dashboard can be exact before gold
            until_exact(procs[0], config, expected, timeout=600, layer=layer,
                         each_poll=lambda: [p.check() for p in procs])
        out["lakecdc"] = exactness(config)
        out["achieved_rate"] = round(drove.written["changes"]
                                     / max(drove.traffic_elapsed_s, 1e-9))
        out["probes"] = {"committed": drove.probes_committed, "seen": len(drove.latencies)}
        out["latency_s"] = numbers.percentiles([lat for _, lat in drove.latencies])
        out["gold_latency_s"] = numbers.percentiles([lat for _, lat in drove.gold_latencies])
        out["load_after"] = numbers.load()
    finally:
        for p in procs:
            p.stop()
    target = TARGET_P95_S.get(rate)
    out["target_p95_s"] = target
    out["met"] = target is not None and out["latency_s"].get("p95", 1e9) <= target
    out["gold_met"] = out["gold_latency_s"].get("p95", 1e9) <= GOLD_TARGET_P95_S
    return out


def _said_waiting(procs: list[RunProcess], timeout: float = 120.0) -> bool:
    """Wait until every process has said it waits for setup (its log's one line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            p.check()
        if all("waiting for `lakecdc setup`" in p.log.read_text(errors="replace")
               for p in procs):
            return True
        time.sleep(0.2)
    return False


def measure(params: Params, say=print) -> dict:
    doc: dict = {"started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "params": asdict(params), "machine": numbers.machine(),
                 "load_start": numbers.load(),
                 "deployed": [" ".join(c) for c in deployed_commands()], "runs": []}
    work = Path(tempfile.mkdtemp(prefix="lakecdc-deployed-"))
    pg = LocalPostgres(Path(tempfile.mkdtemp(prefix="lakecdc-deployed-pg-"))).start()
    try:
        for topology in ("bundle", "bundle_trigger_1s", *(("stages",) if params.stages else ())):
            for rate in params.rates:
                say(f"{topology} at {rate:g} changes/s (load {numbers.load()}) ...")
                run = _one(pg, work, topology, rate, params)
                say(f"  p95 {run['latency_s'].get('p95')} s, {run['lakecdc']}")
                doc["runs"].append(run)
    finally:
        pg.destroy()
        shutil.rmtree(work, ignore_errors=True)
    doc["load_end"] = numbers.load()
    return doc


def _exact(run: dict) -> bool:
    return all(layer.get("exact") for layer in run["lakecdc"].values())


def render(doc: dict) -> str:
    lines = ["# The bundle's topology, as deployed (`bench/deployed.py`)", "",
             f"Generated by `python -m bench.deployed` ({doc['started_at']}); load "
             f"{doc['load_start']} at the start, {doc['load_end']} at the end; "
             f"{doc['machine'].get('cpus')} CPUs. What it runs and why: the module's "
             "docstring.", "",
             "The bundle's continuous job runs: "
             + ", ".join(f"`lakecdc {c}`" for c in doc["deployed"]) + ".", "",
             "| topology | commands | rate (achieved) | probes seen | dashboard p50 / p95 / max s "
             "| target p95 | verdict | gold by path p50 / p95 / max s "
             f"(target p95 {GOLD_TARGET_P95_S:g} s) | gold, dashboard = source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        lat = r["latency_s"]
        label = LABELS.get(r["topology"], r["topology"])
        commands = "; ".join(f"`{c}`" for c in r["commands"])
        verdict = "met" if r["met"] else "**missed**"
        gold = r.get("gold_latency_s")
        gold_cell = (f"{gold.get('p50')} / {gold.get('p95')} / {gold.get('max')}: "
                     + ("met" if r["gold_met"] else "**missed**")) if gold else "not measured"
        lines.append(f"| {label} | {commands} | {r['rate']:,.0f}/s ({r['achieved_rate']:,}) "
                     f"| {r['probes']['seen']} of {r['probes']['committed']} | "
                     f"{lat.get('p50')} / {lat.get('p95')} / {lat.get('max')} | "
                     f"{r['target_p95_s']} s | {verdict} | {gold_cell} | "
                     f"{'yes' if _exact(r) else '**no**'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deployed",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=Params.seconds,
                        help=f"of traffic per run ({Params.seconds:g})")
    parser.add_argument("--bundle-only", action="store_true",
                        help="not the separate stages")
    parser.add_argument("--render", action="store_true",
                        help="only write deployed.md again from --out's deployed.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args = parser.parse_args(argv)
    if args.render:
        doc = json.loads((args.out / "deployed.json").read_text())
    else:
        doc = measure(Params(seconds=args.seconds, stages=not args.bundle_only))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "deployed.json").write_text(json.dumps(doc, indent=2))
    (args.out / "deployed.md").write_text(render(doc))
    print(render(doc))
    return 0 if all(_exact(r) for r in doc["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
