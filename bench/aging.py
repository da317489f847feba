"""``python -m bench.aging`` (part of ``make bench``): a month in the benchmark.

Ages a scratch lakehouse by driving the pipeline's own write paths back to back, without
waiting between batches, ``commits`` times each:

- **bronze**: the shipper's commit (``BronzeTable.append``: Parquet written by pyarrow, one
  delta-rs commit with the slot's progress) of a batch of wal2json status changes;
- **silver/changes**: the stream's parse of those rows (``silver.parse``) and its append
  (``SilverWriter.append``, the batch id as a Delta app transaction);
- **gold**: the stream's gold step on the same rows (``GoldBatchWriter.apply``: lines,
  plan, the delta-rs MERGE of the key deltas);
- **one mirror** (of ``notifications``): the mirrors' delta-rs MERGE (``merge_changes``) of
  the batch's final rows. Its Spark half, which builds those rows, does not touch the table,
  so it is left out: the rows are built in Arrow.

Each writer is maintained as the running pipeline maintains it (``maintain_table``, the
pipeline's default retentions: bronze's log 2 minutes, the others' a day) every
``maintain_every`` commits: 300 s at the stream's ``commit_rate``; and between two
maintenances its expired log is cleaned every ``clean_every`` commits (``clean_log``: 30 s
of them). The clock is simulated for the log: before each cleaning every log entry is
dated as if the commits had come ``commit_rate`` a second, so the log keeps what its
retention of the pipeline would leave, not what that long of this faster loop makes.
(Tombstones carry the real time of their commit: they are kept longer than the pipeline
would keep them, which only makes checkpoints larger here.)

It prints and writes (``--out``/aging.json) per table and per ``window`` commits: the
median commit seconds, live files, log entries and bytes; the trend of the commit's cost
(a least-squares line through the medians), and that line at 30 days of the pipeline's
commits; then, after a maintenance at retention 0 (everything no version needs is deleted),
each table's bytes against its data compacted; and the bytes a day at 2,000 changes/s
leaves on storage at the default 24 h retention, gold's rewrites apart.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from bronze.records import BRONZE_SCHEMA
from bronze.table import BronzeTable, Progress, SourceIdentity
from core.captured import COUNTED, DIMS
from core.commits import commit_metadata
from core.config import (
    BRONZE_LOG_RETENTION_MINUTES,
    LOG_CLEAN_INTERVAL_S,
    LOG_RETENTION_MINUTES,
    MIRROR_INTERVAL_S,
    READER_RETENTION_MINUTES,
    RETENTION_HOURS,
)
from core.engine.delta_rs import rs_commit
from core.handle import WriterHandle
from core.maintenance import clean_log, maintain_table
from gold.apply import GoldBatchWriter
from gold.gold_tables import GoldPaths, ensure_gold_tables
from silver.mirrors.mirror_table import COMMIT_LSN, COMMIT_TS, TableSpec
from silver.mirrors.store_rs import merge_changes
from silver.mirrors.typed_rows import create_mirror
from silver.parse import parse_table
from silver.writer import ParsedBatch, SilverWriter

TABLE = "public.notifications"
COLUMNS = ("id", *DIMS)
SLOT = "aging"
DAY_S = 86_400
# Each table's log retention, as ``pipelines.maintain.owners`` gives the pipeline's tables:
# silver, gold and a mirror are read by others (a day by default).
LOG_MINUTES = {"bronze": min(LOG_RETENTION_MINUTES, BRONZE_LOG_RETENTION_MINUTES),
               "silver": READER_RETENTION_MINUTES, "gold": READER_RETENTION_MINUTES,
               "mirror": READER_RETENTION_MINUTES}


@dataclass(frozen=True)
class AgingParams:
    commits: int = 20_000          # per table
    rows: int = 900                # changes per batch: the continuous batch at 2,000/s
    services: int = 100            # gold keys: services × 9 templates × 2 types × 2 statuses
    notifications: int = 30_000    # rows of the source table (and of its mirror)
    commit_rate: float = 2.3       # the stream's batches a second at 2,000 changes/s
    maintain_every: int = 690      # 300 s (Config.maintain_interval_s) of those
    clean_every: int = round(LOG_CLEAN_INTERVAL_S * 2.3)   # 30 s of those
    window: int = 1_000            # commits per reported median


@dataclass
class Series:
    """One table's account, per window."""
    table: str
    commit_ms: list[float] = field(default_factory=list)      # median per window
    live_files: list[int] = field(default_factory=list)
    log_entries: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    maintain_s: list[float] = field(default_factory=list)


class Source:
    """The status changes of a notifications table, as wal2json v2 lines in bronze rows:
    first an insert of every row, then status changes of random rows (each row's current
    status is kept, so the old values are right)."""

    def __init__(self, params: AgingParams, seed: int = 36) -> None:
        self.p = params
        self.rng = random.Random(seed)
        self.status = ["created"] * params.notifications
        self.inserted = 0
        self.lsn = 1 << 32

    def _dims(self, n: int) -> dict:
        return {"id": f"00000000-0000-4000-8000-{n:012d}",
                "service_id": f"00000000-0000-4000-9000-{n % self.p.services:012d}",
                "template_id": f"00000000-0000-4000-a000-{n % 9:012d}",
                "notification_type": "email" if n % 2 else "sms",
                "notification_status": self.status[n]}

    @staticmethod
    def _w2j(action: str, new: dict, old: dict | None = None) -> str:
        doc = {"action": action, "schema": "public", "table": "notifications",
               "columns": [{"name": k, "type": "text", "value": v} for k, v in new.items()]}
        if old is not None:
            doc["identity"] = [{"name": k, "type": "text", "value": v} for k, v in old.items()]
        return json.dumps(doc, separators=(",", ":"))

    def batch(self) -> pa.Table:
        """One transaction of ``rows`` changes, as bronze rows."""
        lines = []
        for _ in range(self.p.rows):
            if self.inserted < self.p.notifications:
                n, self.inserted = self.inserted, self.inserted + 1
                lines.append(("I", self._w2j("I", self._dims(n))))
            else:
                n = self.rng.randrange(self.p.notifications)
                old = self._dims(n)
                self.status[n] = "sending" if self.status[n] == "created" else "created"
                lines.append(("U", self._w2j("U", self._dims(n), old)))
        self.lsn += 1 << 16
        now = datetime.now(timezone.utc)
        size = len(lines)
        return pa.Table.from_pylist([
            dict(slot=SLOT, commit_lsn=self.lsn, seq=i, tx_changes=size, xid=self.lsn >> 16,
                 lsn=self.lsn - size + i, commit_ts=now, action=a, shipped_at=now, data=d)
            for i, (a, d) in enumerate(lines)], schema=BRONZE_SCHEMA)


def mirror_source(silver: pa.Table) -> pa.Table:
    """The batch's final row per id (``merge_source``'s columns, all set), in Arrow."""
    last: dict[str, int] = {}
    ids = silver.column("id").to_pylist()
    for i, k in enumerate(ids):
        last[k] = i
    picked = silver.take(sorted(last.values()))
    cols = {"id": picked.column("id")}
    for i, d in enumerate(DIMS):
        cols[d] = picked.column(d)
        cols[f"__lakecdc_has_{i}"] = pa.repeat(True, picked.num_rows)
    cols["__lakecdc_exists"] = pa.repeat(True, picked.num_rows)
    cols[COMMIT_LSN] = picked.column("commit_lsn")
    cols[COMMIT_TS] = picked.column("commit_ts")
    return pa.table(cols)


def _date_log(path: str, newest: int, rate: float) -> None:
    """Date the table's log entries as the pipeline would have left them by commit
    ``newest``: entry ``v`` written ``(newest - v) / rate`` seconds ago (the simulated clock,
    set before each maintenance, the only reader of the dates)."""
    now = time.time()
    for entry in Path(path, "_delta_log").iterdir():
        head = entry.name.split(".", 1)[0]
        if head.isdigit():
            at = now - max(newest - int(head), 0) / rate
            os.utime(entry, (at, at))


def table_sizes(path: str) -> tuple[int, int, int]:
    """(live files, log entries, bytes on storage) of the table at ``path``."""
    table = DeltaTable(path)
    on_disk = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    return len(table.file_uris()), len(os.listdir(Path(path, "_delta_log"))), on_disk


def _trend(medians: list[float], window: int, rate: float) -> dict:
    """A least-squares line through the windows' medians (ms against commits) after the
    first maintenance cycles (the second half: the log and the files at their bound), with
    two standard errors; and the most the cost reaches after 30 days of the pipeline's
    commits at ``rate`` a second if it grows along that line's upper edge."""
    half = medians[len(medians) // 2:]
    xs = [window * (len(medians) - len(half) + i + 0.5) for i in range(len(half))]
    if len(xs) < 3:
        return {}
    mx, my = statistics.fmean(xs), statistics.fmean(half)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, half)) / sxx
    resid = [y - (my + slope * (x - mx)) for x, y in zip(xs, half)]
    se = (sum(r * r for r in resid) / (len(xs) - 2) / sxx) ** 0.5
    month = 30 * DAY_S * rate
    # The line's slope at two standard errors up, and at least 0: a cost that does not
    # grow is bounded by today's; one that grows reaches this at 30 days, if linear.
    upper = max(slope + 2 * se, 0.0)
    return {"from_commit": int(xs[0] - window / 2), "mean_ms": round(my, 2),
            "ms_per_1000_commits": round(slope * 1000, 3),
            "two_se_per_1000": round(2 * se * 1000, 3),
            "commits_in_30_days": int(month),
            "ms_at_30_days_at_most": round(my + upper * (month - mx), 1)}


def age(root: Path, params: AgingParams, spark, say=print) -> dict:
    """Age the four tables under ``root``; the result document."""
    src = Source(params)
    bronze_path = str(root / "bronze")
    silver_path, quarantine_path = str(root / "silver"), str(root / "quarantine")
    paths = GoldPaths(str(root / "gold"), str(root / "gold_pending"),
                      str(root / "gold_deltas"))
    mirror_path = str(root / "mirror")

    bronze = BronzeTable(bronze_path)
    bronze.create(SourceIdentity(SLOT, "aging", "0"), 0)
    silver = SilverWriter(silver_path, quarantine_path, (TABLE,), counted_tables=(TABLE,))
    silver.prepare(spark)
    ensure_gold_tables(spark, paths)
    gold = GoldBatchWriter(paths, COUNTED, fold_share=1.0)     # every batch a MERGE
    create_mirror(spark, mirror_path, TableSpec("public", "notifications",
                                                tuple((c, "text") for c in COLUMNS), ("id",)))
    mirror = WriterHandle(mirror_path)
    types = {c: "text" for c in COLUMNS}

    tables = {"bronze": bronze_path, "silver": silver_path, "gold": paths.gold,
              "mirror": mirror_path}
    series = {name: Series(name) for name in tables}
    times = {name: [] for name in tables}
    started = time.monotonic()
    for i in range(params.commits):
        rows = src.batch()

        t = time.perf_counter()
        bronze.append(iter(rows.to_batches()), SLOT, Progress(src.lsn, src.lsn))
        times["bronze"].append(time.perf_counter() - t)

        parsed_rows = parse_table(rows, (TABLE,), (TABLE,))
        parsed = ParsedBatch(rows, parsed_rows, 0, src.lsn, None)
        t = time.perf_counter()
        silver.append(spark, parsed, i)
        times["silver"].append(time.perf_counter() - t)

        t = time.perf_counter()
        gold.apply(spark, parsed_rows, i)
        times["gold"].append(time.perf_counter() - t)

        source = mirror_source(parsed_rows)
        t = time.perf_counter()
        with mirror.use() as table:
            merge_changes(table, source, ("id",), types,
                          rs_commit(commit_metadata("mirror", batch_id=i), "aging", i))
        times["mirror"].append(time.perf_counter() - t)

        if (i + 1) % params.maintain_every == 0:
            for name, path in tables.items():
                _date_log(path, DeltaTable(path).version(), params.commit_rate)
                report = maintain_table(name, path, retention_hours=max(
                                            RETENTION_HOURS, LOG_MINUTES[name] // 60),
                                        log_retention_minutes=LOG_MINUTES[name])
                series[name].maintain_s.append(round(report.seconds, 3))
        elif (i + 1) % params.clean_every == 0:
            for name, path in tables.items():
                _date_log(path, DeltaTable(path).version(), params.commit_rate)
                clean_log(path, log_retention_minutes=LOG_MINUTES[name])
        if (i + 1) % params.window == 0:
            for name, path in tables.items():
                files, log, on_disk = table_sizes(path)
                s = series[name]
                s.commit_ms.append(round(statistics.median(times[name][-params.window:])
                                         * 1000, 2))
                s.live_files.append(files)
                s.log_entries.append(log)
                s.bytes.append(on_disk)
            say(f"aging: {i + 1:,} commits, {time.monotonic() - started:.0f}s; " + ", ".join(
                f"{n} {series[n].commit_ms[-1]:.1f} ms/{series[n].live_files[-1]} files/"
                f"{series[n].log_entries[-1]} log" for n in tables))
    return {"series": series, "tables": tables, "seconds": time.monotonic() - started}


def settle(tables: dict[str, str]) -> dict:
    """Bytes on storage after a maintenance at retention 0, against the data compacted
    (the live files' bytes)."""
    out = {}
    for name, path in tables.items():
        maintain_table(name, path, retention_hours=0, log_retention_minutes=1)
        live = int(sum(DeltaTable(path).get_add_actions(flatten=True)
                       .column("size_bytes").to_pylist()))
        out[name] = {"bytes": table_sizes(path)[2], "live_bytes": live,
                     "ratio": round(table_sizes(path)[2] / max(live, 1), 2)}
    return out


# Commits a second of each table at 2,000 changes/s: the stream's batches for silver and
# gold; one mirrors' batch per Config.mirror_interval_s; bronze's bytes follow its changes
# (the shipper commits more often, with fewer rows each), so it is counted at the stream's.
DAY_RATES = {"bronze": 2.3, "silver": 2.3, "gold": 2.3, "mirror": 1 / MIRROR_INTERVAL_S}


def day_bytes(name: str, series: dict, window: int) -> dict:
    """Bytes a day at 2,000 changes/s (``DAY_RATES``) leaves on storage at the default
    retention. Nothing the aging wrote was vacuumed (24 h), so the growth of the table's
    folder per commit, over the second half, is every byte a commit leaves for a day: its
    data, compaction's rewrites, gold's copies and change data, the log."""
    on_disk = series["bytes"]
    half = len(on_disk) // 2
    if len(on_disk) - half < 2:
        return {}
    per_commit = (on_disk[-1] - on_disk[half - 1 if half else 0]) / (
        (len(on_disk) - half) * window)
    return {"bytes_per_commit": round(per_commit),
            "bytes_per_day": round(per_commit * DAY_RATES[name] * DAY_S)}


def run(params: AgingParams, out: Path, say=print) -> dict:
    from core.spark import get_or_create

    out.mkdir(parents=True, exist_ok=True)
    spark = get_or_create(output=str(Path(tempfile.gettempdir()) / "lakecdc-aging-spark.log"))
    root = Path(tempfile.mkdtemp(prefix="lakecdc-aging-"))
    load = [round(x, 2) for x in os.getloadavg()]
    try:
        aged = age(root, params, spark, say)
        settled = settle(aged["tables"])
        doc = {"generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "params": asdict(params), "load_at_start": load,
               "load_at_end": [round(x, 2) for x in os.getloadavg()],
               "seconds": round(aged["seconds"]),
               "log_retention_minutes": READER_RETENTION_MINUTES,
               "bronze_log_retention_minutes": LOG_MINUTES["bronze"],
               "retention_hours": RETENTION_HOURS,
               "tables": {n: {**asdict(s), "settled": settled[n]}
                          for n, s in aged["series"].items()}}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    (out / "aging.json").write_text(json.dumps(doc, indent=2))
    (out / "aging.md").write_text(render(doc))
    return doc


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def render(doc: dict) -> str:
    """The section as Markdown (``aging.md`` beside ``aging.json``)."""
    p = doc["params"]
    bronze_log = (f", bronze's {doc['bronze_log_retention_minutes']}"
                  if "bronze_log_retention_minutes" in doc else "")
    lines = [
        "# A month in the benchmark (`bench/aging.py`)", "",
        f"Generated by `python -m bench.aging` ({doc['generated']}): {p['commits']:,} commits "
        f"on each table, {p['rows']} changes a batch, maintained every "
        f"{p['maintain_every']} commits at the defaults (log {doc['log_retention_minutes']} "
        f"min{bronze_log}, cleaned every {p.get('clean_every', p['maintain_every'])} commits; "
        f"files {doc['retention_hours']} h); {doc['seconds']:,} s; load "
        f"{doc['load_at_start']} at the start, {doc['load_at_end']} at the end. "
        "What it drives and why: the module's docstring.", "",
        "## The commit's cost as the tables age", "",
        "| table | ms, first window | ms, last window | trend (ms per 1,000 commits, ±2 SE) "
        "| at 30 days of its commits | live files (max) | log entries (max) |",
        "|---|---|---|---|---|---|---|"]
    for name, t in doc["tables"].items():
        tr = _trend(t["commit_ms"], p["window"], DAY_RATES[name])
        lines.append(
            f"| {name} | {t['commit_ms'][0]} | {t['commit_ms'][-1]} | "
            f"{tr.get('ms_per_1000_commits')} ± {tr.get('two_se_per_1000')} | "
            f"at most {tr.get('ms_at_30_days_at_most')} ms | "
            f"{max(t['live_files'])} | {max(t['log_entries'])} |")
    lines += ["", f"Per window of {p['window']:,} commits (median ms):", ""]
    names = list(doc["tables"])
    lines.append("| commits | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for i in range(len(doc["tables"][names[0]]["commit_ms"])):
        lines.append(f"| {(i + 1) * p['window']:,} | " + " | ".join(
            f"{doc['tables'][n]['commit_ms'][i]} ({doc['tables'][n]['log_entries'][i]} log)"
            for n in names) + " |")
    lines += ["", "## Bytes", "",
              "After a maintenance at retention 0 (log 1 min): each table's bytes on storage "
              "against its live data (the data compacted).", "",
              "| table | on storage | live | ratio | a day at 2,000 changes/s, kept 24 h "
              "(gold: its rewrites and change data) |",
              "|---|---|---|---|---|"]
    total = live = 0
    for name, t in doc["tables"].items():
        st = t["settled"]
        total, live = total + st["bytes"], live + st["live_bytes"]
        day = day_bytes(name, t, p["window"])
        lines.append(f"| {name} | {_mb(st['bytes'])} | {_mb(st['live_bytes'])} | "
                     f"{st['ratio']} | {_mb(day.get('bytes_per_day', 0))} |")
    lines.append(f"| all | {_mb(total)} | {_mb(live)} | {total / max(live, 1):.2f} | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.aging",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=AgingParams.commits,
                        help=f"per table ({AgingParams.commits:,})")
    parser.add_argument("--quick", action="store_true",
                        help="300 commits, maintained every 100: a smoke run")
    parser.add_argument("--render", action="store_true",
                        help="only write aging.md again from --out's aging.json")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "docs" / "benchmarks")
    args = parser.parse_args(argv)
    if args.render:
        doc = json.loads((args.out / "aging.json").read_text())
        (args.out / "aging.md").write_text(render(doc))
    else:
        params = AgingParams(commits=300, window=100, maintain_every=100,
                             clean_every=20) if args.quick \
            else AgingParams(commits=args.commits)
        doc = run(params, args.out)
    print(render(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
