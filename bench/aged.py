"""``python -m bench.aged`` (part of ``make bench``): ``lakecdc run`` on an aged lakehouse
beside a fresh one, in one run (the target: aged ≤ 1.2× fresh).

1. **Age.** One source database (the benchmark's schema, ``populate``d), one lakehouse,
   ``setup``; then ``lakecdc run`` itself ages it, under the benchmark's steady traffic, with
   nothing waiting between batches: the stream's trigger is 0 and every batch folds its
   gold step (fold share 1: a gold MERGE a batch), until
   bronze, ``silver/changes`` and gold each hold ``commits`` commits. Maintenance runs as
   the pipeline runs it, on a clock scaled to the faster commits so the tables hold what
   they hold in production between maintenances (``AGING_CONFIG``). The mirrors are off
   on both lakehouses: their query commits at most once per ``LAKECDC_MIRROR_INTERVAL``,
   so 20,000 mirror commits through it would take hours beside the rest; ``bench.aging``
   ages one through its write path.
2. **Fresh.** A second lakehouse on the same database (its own slot and dashboard),
   ``setup`` after the aging: the same source rows, none of the history. The aged one
   pushes into the source database, as every section of ``bench.measure`` does; the fresh
   one cannot share that dashboard and pushes into a database of its own. So the aged
   shipper's decoding also passes over its own pushes' changes, and the fresh one's does
   not: the comparison leans against the aged lakehouse, if anything.
3. **Rounds**, aged and fresh in turn: each lakehouse first drained (``run --once``: the
   other's traffic), then ``lakecdc run`` at the defaults under 2,000 changes/s for
   ``seconds`` with the freshness probe (``bench.measure``'s continuous run), then drained
   and compared with the source.

Per round: the per-batch seconds (lakecdc's pass, and Spark's whole trigger, which
includes reading bronze's log), the probe's latencies and the counts. The verdict compares
the medians over the rounds: aged against fresh.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import psycopg
from deltalake import DeltaTable

from bench import numbers, workload
from bench.aging import table_sizes
from bench.measure import Bench, Params
from core.config import (
    BRONZE_LOG_RETENTION_MINUTES,
    LOG_RETENTION_MINUTES,
    MAINTAIN_INTERVAL_S,
    Config,
)
from core.layout import STREAM_QUERY
from pipelines.run.pipeline import Locations
from pipelines.setup.prepare import setup

TARGET = 1.2
# Commits a second at 2,000 changes/s in production (docs/benchmarks.md): the shipper's
# (a poll every 0.25 s) and the stream's batches. The aging's maintenance clock and log
# retention are scaled by the fastest of its tables against these.
PRODUCTION_COMMITS_PER_S = {"bronze": 4.0, "silver": 2.3, "gold": 2.3}


@dataclass(frozen=True)
class AgedParams:
    commits: int = 20_000         # each on bronze, silver/changes and gold
    rows: int = 200_000           # notifications in the source before setup
    aging_rate: float = 300.0     # the aging traffic's changes/s: small batches
    rate: float = 2_000.0         # the rounds' traffic
    seconds: float = 90.0         # per round
    rounds: int = 3               # per lakehouse


def aging_config(config: Config, commits_per_s: dict[str, float] | None) -> Config:
    """The aging pipeline: nothing waits between batches, gold folds every batch, and
    maintenance runs after as many commits as in production (``PRODUCTION_COMMITS_PER_S``,
    for the table whose commits come fastest against it), with each log keeping as many
    commits as production's retention of it (10 minutes; the tables others read a day)."""
    scale = min([1.0, *(PRODUCTION_COMMITS_PER_S[n] / max(r, 1e-9)
                        for n, r in (commits_per_s or {}).items())])
    return config.with_(gold_fold_share=1.0,
                        maintain_interval_s=max(10.0, MAINTAIN_INTERVAL_S * scale),
                        log_retention_minutes=max(1, round(LOG_RETENTION_MINUTES * scale)),
                        reader_retention=tuple((g, max(1, round(m * scale)))
                                               for g, m in config.reader_retention))


def _traffic(dsn: str, rate: float, tag: str, stop) -> None:
    """The aging's traffic, in a child process (``bench.drive``: why)."""
    workload.SteadyTraffic(dsn, rate, tag=tag).run(stop)


def _commits(config: Config) -> dict[str, int]:
    where = config_paths(config)
    return {name: DeltaTable(path).version() for name, path in where.items()}


def config_paths(config: Config) -> dict[str, str]:
    where = Locations.from_config(config)
    return {"bronze": where.silver.bronze_path, "silver": where.silver.silver_path,
            "gold": where.gold}


def tables_state(config: Config) -> dict:
    out = {}
    for name, path in config_paths(config).items():
        files, log, on_disk = table_sizes(path)
        out[name] = {"commits": DeltaTable(path).version(), "live_files": files,
                     "log_entries": log, "bytes": on_disk}
    return out


def age(bench: Bench, config: Config, params: AgedParams, say=print) -> dict:
    """``lakecdc run`` on ``config``'s lakehouse until every table holds ``commits``."""
    started = time.monotonic()
    before = _commits(config)
    # A first minute at the production maintenance clock measures the commit rates; the
    # rest runs at the clock scaled to them.
    rate: dict[str, float] | None = None
    stages = []
    ctx = multiprocessing.get_context("spawn")
    stop_traffic = ctx.Event()
    traffic = ctx.Process(target=_traffic, args=(config.source_dsn, params.aging_rate, "age-",
                                                 stop_traffic), daemon=True)
    traffic.start()
    try:
        for until_s in (60.0, None):
            aging = aging_config(config, rate)
            at_start = _commits(config)
            seconds = _run_until(bench.pipeline(aging, trigger_interval="0 seconds"), config,
                                 before, params.commits, until_s, started, say)
            now = _commits(config)
            stages.append({"seconds": round(seconds),
                           "commits": {n: now[n] - at_start[n] for n in now},
                           "maintain_interval_s": round(aging.maintain_interval_s, 1),
                           "log_retention_minutes": aging.log_retention_minutes,
                           "bronze_log_retention_minutes": min(
                               aging.log_retention_minutes, BRONZE_LOG_RETENTION_MINUTES)})
            if rate is None:
                rate = {n: (now[n] - at_start[n]) / seconds for n in now}
                say(f"aging: commits a second in the first minute: {rate}")
    finally:
        stop_traffic.set()
        traffic.join(timeout=60)
    return {"seconds": round(time.monotonic() - started),
            "commits_per_s": {n: round(r, 2) for n, r in rate.items()}, "stages": stages}


def _run_until(pipeline, config: Config, before: dict[str, int], commits: int,
               until_s: float | None, started: float, say) -> float:
    """``lakecdc run`` until every table holds ``commits`` more than ``before``, or for
    ``until_s`` seconds; returns the seconds it ran."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run():
        try:
            pipeline.run_continuous(stop)
        except BaseException as exc:       # raised below
            errors.append(exc)

    runner = threading.Thread(target=run, name="bench-aging", daemon=True)
    runner.start()
    stage_start = time.monotonic()
    next_say = stage_start + 300
    while not errors and not stop.wait(10):
        now = _commits(config)
        if until_s is not None and time.monotonic() - stage_start > until_s:
            break
        if min(now[n] - before[n] for n in now) >= commits:
            break
        if time.monotonic() > next_say:
            next_say += 300
            say(f"aging: {now} commits, {time.monotonic() - started:.0f} s")
    stop.set()
    runner.join(timeout=300)
    if errors:
        raise errors[0]
    return time.monotonic() - stage_start


def _round(bench: Bench, config: Config, params: AgedParams) -> dict:
    pipeline = bench.pipeline(config)
    pipeline.run_once()                    # the other lakehouse's traffic, drained
    mark = bench.passes.mark()
    out, _ = bench.continuous(config, pipeline, params.rate, params.seconds,
                               neighbours=False)
    passes = bench.passes.passes[mark:mark + out["per_batch"]["batches"]]
    seconds = [p["seconds"] for p in passes]
    spark = out["spark_progress"].get(STREAM_QUERY, {})
    triggers = spark.get("batches") or 0
    return {"load_before": out["load_before"], "load_after": out["load_after"],
            "achieved_rate": out["achieved_rate"], "batches": len(passes),
            "pass_s": {"median": round(statistics.median(seconds), 4),
                       "mean": round(statistics.fmean(seconds), 4),
                       **numbers.percentiles(seconds, 3)},
            "trigger_ms_mean": round(spark.get("triggerExecution_ms", 0) / triggers, 1)
            if triggers else None,
            "latest_offset_ms_mean": round(spark.get("latestOffset_ms", 0) / triggers, 1)
            if triggers else None,
            "latency_s": out["latency_s"], "lakecdc": out["lakecdc"]}


def measure(params: AgedParams, say=print) -> dict:
    doc: dict = {"generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "params": asdict(params), "load_at_start": numbers.load()}
    with Bench(Params()) as bench:
        aged = bench.database("aged").with_(mirrors=())
        workload.populate(aged.source_dsn, params.rows)
        setup(aged)
        bench.pipeline(aged).run_once()                 # gold seeded with the baseline
        doc["aging"] = age(bench, aged, params, say)
        with psycopg.connect(bench.pg.dsn(), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "fresh_dashboard"')
        fresh = aged.with_(lakehouse=str(bench.work / "fresh"), slot="fresh",
                           dashboard_dsn=bench.pg.dsn("fresh_dashboard"))
        setup(fresh)
        bench.pipeline(fresh).run_once()
        doc["state_before"] = {"aged": tables_state(aged), "fresh": tables_state(fresh)}
        rounds: dict[str, list] = {"aged": [], "fresh": []}
        for i in range(params.rounds):
            for name, config in (("aged", aged), ("fresh", fresh)):
                say(f"round {i + 1}: {name}")
                rounds[name].append(_round(bench, config, params))
        doc["rounds"] = rounds
        doc["state_after"] = {"aged": tables_state(aged), "fresh": tables_state(fresh)}
    doc["load_at_end"] = numbers.load()
    doc["ratios"] = ratios(rounds)
    return doc


def _exact(round_: dict) -> bool:
    return all(layer["exact"] for layer in round_["lakecdc"].values())


def _median_of(rounds: list[dict], pick) -> float:
    return statistics.median(pick(r) for r in rounds)


def ratios(rounds: dict[str, list]) -> dict:
    """Aged over fresh, each the median over its rounds."""
    picks = {"pass_median_s": lambda r: r["pass_s"]["median"],
             "trigger_ms_mean": lambda r: r["trigger_ms_mean"] or 0.0,
             "probe_p95_s": lambda r: r["latency_s"]["p95"]}
    out = {}
    for name, pick in picks.items():
        aged, fresh = _median_of(rounds["aged"], pick), _median_of(rounds["fresh"], pick)
        out[name] = {"aged": aged, "fresh": fresh,
                     "ratio": round(aged / fresh, 2) if fresh else None}
    return out


def render(doc: dict) -> str:
    p, aging = doc["params"], doc["aging"]
    last = aging["stages"][-1]
    bronze_log = (f", bronze's {last['bronze_log_retention_minutes']} min"
                  if "bronze_log_retention_minutes" in last else "")
    lines = [
        "# The pipeline aged against fresh (`bench/aged.py`)", "",
        f"Generated by `python -m bench.aged` ({doc['generated']}); load "
        f"{doc['load_at_start']} at the start, {doc['load_at_end']} at the end. What it "
        "runs and why: the module's docstring.", "",
        f"**Aging.** `lakecdc run` on a source of {p['rows']:,} notifications under "
        f"{p['aging_rate']:g} changes/s, nothing waiting between batches, until bronze, "
        f"`silver/changes` and gold each held {p['commits']:,} commits: "
        f"{aging['seconds']:,} s (commits a second in its first minute, which set the "
        f"clock below: {aging['commits_per_s']}). Maintenance every "
        f"{last['maintain_interval_s']} s and a log of {last['log_retention_minutes']} min "
        f"there{bronze_log} (production's 300 s and 10 min, at production's commits a "
        f"second: {PRODUCTION_COMMITS_PER_S}).", "",
        "| lakehouse | table | commits | live files | log entries | MB |",
        "|---|---|---|---|---|---|"]
    for name in ("aged", "fresh"):
        for table, s in doc["state_before"][name].items():
            lines.append(f"| {name} | {table} | {s['commits']:,} | {s['live_files']} | "
                         f"{s['log_entries']} | {s['bytes'] / 1e6:,.1f} |")
    lines += [
        "", f"**Rounds**, in turn, each {p['seconds']:g} s of `lakecdc run` at the defaults "
        f"under {p['rate']:,.0f} changes/s with the freshness probe:", "",
        "| round | lakehouse | load before → after | batches | pass median / p90 s | "
        "Spark trigger mean ms (of which reading bronze's log) | probe p50 / p95 / max s "
        "| counts |",
        "|---|---|---|---|---|---|---|---|"]
    for i in range(p["rounds"]):
        for name in ("aged", "fresh"):
            r = doc["rounds"][name][i]
            lat = r["latency_s"]
            exact = "exact" if _exact(r) else "**differ**"
            lines.append(
                f"| {i + 1} | {name} | {r['load_before'][0]} → {r['load_after'][0]} | "
                f"{r['batches']} | {r['pass_s']['median']} / {r['pass_s'].get('p90')} | "
                f"{r['trigger_ms_mean']} ({r['latest_offset_ms_mean']}) | "
                f"{lat.get('p50')} / {lat.get('p95')} / {lat.get('max')} | {exact} |")
    lines += ["", "Aged over fresh, the medians over the rounds (target ≤ "
              f"{TARGET}×):", "", "| measure | aged | fresh | ratio | verdict |",
              "|---|---|---|---|---|"]
    labels = {"pass_median_s": "a batch's pass, median s",
              "trigger_ms_mean": "Spark's whole trigger, mean ms",
              "probe_p95_s": "the probe's p95, s"}
    for key, r in doc["ratios"].items():
        verdict = "met" if r["ratio"] is not None and r["ratio"] <= TARGET else "**missed**"
        lines.append(f"| {labels[key]} | {r['aged']} | {r['fresh']} | {r['ratio']}× | "
                     f"{verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.aged",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=AgedParams.commits,
                        help=f"each on bronze, silver and gold ({AgedParams.commits:,})")
    parser.add_argument("--rounds", type=int, default=AgedParams.rounds,
                        help=f"per lakehouse ({AgedParams.rounds})")
    parser.add_argument("--quick", action="store_true",
                        help="500 commits, rounds of 30 s: a smoke run")
    parser.add_argument("--render", action="store_true",
                        help="only write aged.md again from --out's aged.json")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "docs" / "benchmarks")
    args = parser.parse_args(argv)
    if args.render:
        doc = json.loads((args.out / "aged.json").read_text())
    else:
        params = AgedParams(commits=500, rows=20_000, seconds=30.0, rounds=1) \
            if args.quick else AgedParams(commits=args.commits, rounds=args.rounds)
        doc = measure(params)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "aged.json").write_text(json.dumps(doc, indent=2))
    (args.out / "aged.md").write_text(render(doc))
    print(render(doc))
    exact = all(_exact(r) for rs in doc["rounds"].values() for r in rs)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
