"""``python -m bench`` (``make bench``): every benchmark in one run, and its report.

Starts its own throw-away Postgres 15 with wal2json and a local Spark session, runs the
sections of ``bench.measure`` (backlog: decode vs ship, stream and push throughput, the PoC
baseline and exactness; freshness at a steady rate; the gold half of continuous batches as
gold's keys grow; the shipper's peak RSS through one big transaction; ``tables add`` of a
big table under traffic beside its COPY, ``bench.big_table``), writes the result
document ``results.json`` and PNG plots into ``--out`` and regenerates ``--report`` from
``bench.report``'s template (``bench/report.md.tmpl``). Everything it started is stopped
and removed again.

``--sections freshness,writers`` measures those sections again on their own and puts them
into the ``results.json`` already in ``--out``, each stamped with when it was measured (the
report says so), the rest of the page kept.

``--quick`` is the smoke size (``tests/integration/test_bench_smoke.py``, run with
``pytest -m bench`` outside the default run), writing to ``bench-output/quick`` unless
told otherwise.
Exit 0 when lakecdc's counts were exact everywhere, 1 if any differed (the numbers are
written either way).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from bench import report
from bench.measure import SECTIONS, Params, run_all

ROOT = Path(__file__).resolve().parents[1]
QUICK = Params(changes=6_000, tx_size=500, rates=(300.0,), freshness_s=10.0,
               scale_keys=(2_000, 20_000), scale_rates=(300.0,), scale_s=10.0,
               big_tx_rows=20_000, big_rows=100_000, big_rate=300.0, big_kept_s=30.0,
               big_compare_rows=10_000, shape_changes=3_000, quick=True)


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _rates(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def parse(argv: list[str] | None) -> tuple[Params, argparse.Namespace]:
    full = Params()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke sizes (defaults below are the full run's)")
    parser.add_argument("--changes", type=int, help=f"backlog changes ({full.changes})")
    parser.add_argument("--tx-size", type=int, help=f"rows per backlog insert ({full.tx_size})")
    parser.add_argument("--rates", type=_rates,
                        help="freshness: changes/s, one continuous run each, comma-separated "
                             f"({','.join(f'{r:g}' for r in full.rates)})")
    parser.add_argument("--freshness-seconds", type=float, dest="freshness_s",
                        help=f"freshness: seconds of traffic ({full.freshness_s:g})")
    parser.add_argument("--scale-keys", type=_sizes,
                        help="gold scaling: gold keys, one database each, comma-separated "
                             f"({','.join(map(str, full.scale_keys))})")
    parser.add_argument("--scale-rates", type=_rates,
                        help="gold scaling: changes/s, comma-separated; the first at every "
                             "size, the others at the largest only "
                             f"({','.join(f'{r:g}' for r in full.scale_rates)})")
    parser.add_argument("--scale-seconds", type=float, dest="scale_s",
                        help=f"gold scaling: seconds of traffic per run ({full.scale_s:g})")
    parser.add_argument("--big-tx-rows", type=int,
                        help=f"rows of the one big transaction ({full.big_tx_rows})")
    parser.add_argument("--big-rows", type=int,
                        help=f"rows of the big table added under traffic ({full.big_rows})")
    parser.add_argument("--sections", type=lambda text: tuple(text.split(",")), default=None,
                        help="measure only these sections again (comma-separated, of "
                             f"{', '.join(SECTIONS)}) into the results.json in --out")
    parser.add_argument("--out", type=Path, default=None,
                        help="results.json and PNGs (docs/benchmarks; --quick: "
                             "bench-output/quick)")
    parser.add_argument("--report", type=Path, default=None,
                        help="the Markdown report (docs/benchmarks.md; --quick: "
                             "<out>/benchmarks.md)")
    args = parser.parse_args(argv)
    if args.sections is not None and not set(args.sections) <= set(SECTIONS):
        parser.error(f"--sections takes {', '.join(SECTIONS)}")
    params = QUICK if args.quick else full
    given = {k: v for k, v in vars(args).items()
             if k in Params.__dataclass_fields__ and v is not None and k != "quick"}
    params = replace(params, **given)
    if args.out is None:
        args.out = ROOT / ("bench-output/quick" if args.quick else "docs/benchmarks")
    if args.report is None:
        args.report = args.out / "benchmarks.md" if args.quick else ROOT / "docs/benchmarks.md"
    if args.sections is not None and not (args.out / "results.json").is_file():
        parser.error(f"--sections measures into an earlier run's results: there is no "
                     f"{args.out / 'results.json'} (--out)")
    return params, args


def main(argv: list[str] | None = None) -> int:
    params, args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    print(f"lakecdc bench{' --quick' if params.quick else ''}: {params}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "results.partial.json"

    def save(doc: dict) -> None:
        partial.write_text(json.dumps(doc, indent=1, default=str) + "\n")

    command = " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)])
    earlier = None
    if args.sections is not None:
        earlier = json.loads((args.out / "results.json").read_text())
    doc = run_all(params, say=lambda text: print(text, flush=True), save=save,
                  sections=args.sections or SECTIONS)
    doc["command"] = command
    if earlier is not None:
        for name in args.sections:
            earlier[name] = {**doc[name], "measured_at": doc["started_at"],
                             "load_start": doc["load_start"], "command": command}
        doc = earlier
    partial.unlink(missing_ok=True)
    doc["exact"] = report.all_exact(doc)
    (args.out / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    report.write(doc, args.out, args.report)
    print(report.summary(doc))
    print(f"results: {args.out / 'results.json'}; report: {args.report}")
    return 0 if doc["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
