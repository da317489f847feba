"""``python -m bench.kept_log`` (part of ``make bench``): what a day of kept log costs.

The tables others read keep their log and removed files a day by default
(``core.config.READER_GROUPS``). What that costs depends on two counts a day of commits
leaves, whatever the rows: the log's entries (every delta-rs commit and every Spark
snapshot update lists the log, and on a local disk a listing reads the whole folder) and
the tombstones each checkpoint carries (one per file a compaction or a MERGE removed). So
this builds, for each log length, a table whose log holds that many entries and whose
newest checkpoint carries as many tombstones (entries written as commits of no rows, and
one commit removing that many files: the counts, not a day of waiting), then measures on
it:

- **commit**: the median of ``appends`` appends of a stream batch's size (900 rows)
  through a kept delta-rs handle, as silver's writer commits (``core.handle``);
- **open**: a snapshot load (status, verify, a handle opened again);
- **Spark**: a Spark read of the table after an append, the median of five after a first
  (its snapshot update and a one-row read: what each trigger of a Spark stream reading
  the table, such as the mirrors' query of silver, pays for the log);
- **checkpoint**: writing one, and its bytes.

Log lengths: 1,200 (10 minutes at 2 commits a second: lakecdc's own tables), and a day at
0.5 and at 2 commits a second (the stream's 2 s trigger under traffic; a table committed
by every batch of a faster trigger).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from core.maintenance import log_properties

LENGTHS = (1_200, 43_200, 172_800)
ROWS = 900


def _batch(i: int) -> pa.Table:
    return pa.table({"commit_lsn": pa.array(range(i * ROWS, (i + 1) * ROWS), pa.int64()),
                     "payload": pa.array(["x" * 120] * ROWS)})


def build(path: Path, entries: int) -> None:
    """A table of ``entries`` log entries whose newest checkpoint carries as many
    tombstones (see the module's text)."""
    write_deltalake(str(path), _batch(0), configuration=log_properties(24 * 60))
    log, now = path / "_delta_log", int(time.time() * 1000)
    info = json.dumps({"commitInfo": {"timestamp": now, "operation": "WRITE"}})
    for v in range(1, entries - 1):
        (log / f"{v:020d}.json").write_text(info + "\n")
    removes = (json.dumps({"remove": {"path": f"part-{i:08d}-0000-c000.snappy.parquet",
                                      "deletionTimestamp": now, "dataChange": False,
                                      "size": 50_000}}) for i in range(entries))
    (log / f"{entries - 1:020d}.json").write_text(
        "\n".join([info, *removes]) + "\n")
    DeltaTable(str(path)).create_checkpoint()


def measure(path: Path, appends: int, spark) -> dict:
    table = DeltaTable(str(path))
    commit = []
    for i in range(appends):
        t = time.perf_counter()
        write_deltalake(table, _batch(i + 1), mode="append")
        commit.append(time.perf_counter() - t)
    t = time.perf_counter()
    table = DeltaTable(str(path))
    opened = time.perf_counter() - t
    spark_s = []
    if spark is not None:                          # its first read loads Delta's classes
        spark.read.format("delta").load(str(path)).limit(1).collect()
    for i in range(5 if spark is not None else 0):
        write_deltalake(table, _batch(appends + i + 1), mode="append")
        t = time.perf_counter()
        spark.read.format("delta").load(str(path)).limit(1).collect()
        spark_s.append(time.perf_counter() - t)
    t = time.perf_counter()
    table.create_checkpoint()
    checkpointed = time.perf_counter() - t
    newest = max((p for p in (path / "_delta_log").glob("*.checkpoint.parquet")),
                 key=lambda p: int(p.name[:20]))
    return {"commit_ms": round(statistics.median(commit) * 1000, 1),
            "open_ms": round(opened * 1000, 1),
            "spark_ms": round(statistics.median(spark_s) * 1000) if spark_s else None,
            "checkpoint_s": round(checkpointed, 2),
            "checkpoint_mb": round(newest.stat().st_size / 1e6, 1)}


def run(lengths=LENGTHS, appends: int = 40, with_spark: bool = True, say=print) -> dict:
    spark = None
    if with_spark:
        from core.spark import get_or_create

        spark = get_or_create("lakecdc-bench-kept-log")
        spark.range(1).collect()                       # the JVM warm before the first read
    root = Path(tempfile.mkdtemp(prefix="lakecdc-kept-log-"))
    rows, load = [], [round(x, 2) for x in os.getloadavg()]
    try:
        for entries in lengths:
            path = root / f"t{entries}"
            build(path, entries)
            rows.append({"entries": entries, **measure(path, appends, spark)})
            say(json.dumps(rows[-1]))
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_at_start": load, "load_at_end": [round(x, 2) for x in os.getloadavg()],
            "appends": appends, "rows": rows}


def render(doc: dict) -> str:
    lines = ["# What a day of kept log costs (`bench/kept_log.py`)", "",
             f"Generated by `python -m bench.kept_log` ({doc['generated']}); load "
             f"{doc['load_at_start']} at the start, {doc['load_at_end']} at the end. "
             "What it builds and measures: the module's docstring.", "",
             "| log entries (and tombstones) | commit, median ms | against the first | open ms "
             "| Spark read of one row (its snapshot update) ms | checkpoint s | checkpoint MB |",
             "|---|---|---|---|---|---|---|"]
    base = doc["rows"][0]["commit_ms"]
    for r in doc["rows"]:
        lines.append(f"| {r['entries']:,} | {r['commit_ms']} | {r['commit_ms'] / base:.2f}× "
                     f"| {r['open_ms']} | {r['spark_ms']} | {r['checkpoint_s']} "
                     f"| {r['checkpoint_mb']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kept_log",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "docs" / "benchmarks",
                        help="where kept_log.json and kept_log.md are written")
    parser.add_argument("--lengths", type=lambda t: tuple(int(x) for x in t.split(",")),
                        default=LENGTHS)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args(argv)
    doc = run(args.lengths, with_spark=not args.no_spark)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kept_log.json").write_text(json.dumps(doc, indent=2))
    (args.out / "kept_log.md").write_text(render(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
