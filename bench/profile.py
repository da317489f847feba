"""Spark's own account of where streaming time goes: query progress, summed per query.

A ``StreamingQueryListener`` on the session collects, per query name, the micro-batches,
input rows and the ``durationMs`` phases Spark reports (``addBatch`` = the sink's work,
``latestOffset``/``getBatch`` = reading the Delta log, ``queryPlanning``, ``walCommit`` /
``commitOffsets`` = the checkpoint, ``triggerExecution`` = the whole trigger). ``window``
takes a snapshot of what was recorded between two points of the benchmark.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from contextlib import contextmanager

from core.layout import STREAM_QUERY


class ProgressLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def listener(self):
        from pyspark.sql.streaming import StreamingQueryListener

        log = self

        class _Listener(StreamingQueryListener):
            def onQueryStarted(self, event) -> None:
                return None

            def onQueryProgress(self, event) -> None:
                log.record(event.progress)

            def onQueryIdle(self, event) -> None:
                return None

            def onQueryTerminated(self, event) -> None:
                return None

        return _Listener()

    def record(self, progress) -> None:
        name = progress.name or str(progress.id)
        with self._lock:
            totals = self._totals[name]
            totals["batches"] += 1
            totals["input_rows"] += int(progress.numInputRows or 0)
            for phase, ms in (progress.durationMs or {}).items():
                totals[f"{phase}_ms"] += float(ms)

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {name: dict(totals) for name, totals in self._totals.items()}

    @contextmanager
    def window(self, into: dict):
        """Fill ``into`` with the per-query totals recorded inside the ``with`` block."""
        before = self.snapshot()
        try:
            yield into
        finally:
            # Progress events reach Python asynchronously; what arrives after the block is
            # left out (the totals are a profile, not the measurement).
            for name, totals in self.snapshot().items():
                old = before.get(name, {})
                delta = {k: round(v - old.get(k, 0.0)) for k, v in totals.items()}
                if delta.get("batches"):
                    into[name] = delta


class PassLog:
    """lakecdc's own account of each stream batch (``pipelines.run.stream.PassResult``): rows,
    seconds per step (parse + silver appends, gold, of which the MERGE) and the Spark jobs
    the batch ran: the jobs of the query's job group (Spark runs a micro-batch's jobs under
    the run id of its query) newer than the newest counted before.

    It runs inside the batch (``on_pass``), so its cost must not grow with the run. It
    once did: every finished job kept (``spark.ui.retainedJobs``) and the group's job ids
    fetched one Py4J call each, so after 4,000 batches the count took most of a 0.8 s
    batch. Now the ids come in one call, from the jobs Spark keeps by default (the last
    1,000: a batch runs fewer than ten), and only the new ones are counted.
    """

    def __init__(self, spark) -> None:
        self.spark = spark
        self._lock = threading.Lock()
        self.passes: list[dict] = []
        self._newest: dict[str, int] = {}

    def _job_ids(self, group: str) -> list[int]:
        sc = self.spark.sparkContext
        text = sc._jvm.java.util.Arrays.toString(sc._jsc.statusTracker().getJobIdsForGroup(group))
        return [int(x) for x in text.strip("[]").split(",") if x.strip()]

    def on_pass(self, result) -> None:
        jobs = 0
        for query in self.spark.streams.active:
            if query.name != STREAM_QUERY:      # not the mirrors' query, which runs beside
                continue
            run = str(query.runId)
            newest = self._newest.get(run, -1)
            ids = self._job_ids(run)
            jobs += sum(1 for i in ids if i > newest)
            self._newest[run] = max([newest, *ids])
        with self._lock:
            self.passes.append({"rows": result.silver.rows, "seconds": result.seconds,
                                "silver_s": result.silver_seconds,
                                "parse_s": result.parse_seconds,
                                "gold_s": result.gold.seconds,
                                "ahead_s": result.ahead_seconds,
                                "merge_s": result.gold.merge_seconds,
                                "merged_keys": result.gold.merged_keys,
                                "step_keys": result.gold.step_keys,
                                "jobs": jobs})

    def mark(self) -> int:
        with self._lock:
            return len(self.passes)

    def summary(self, since: int = 0) -> dict:
        """Per-batch means over the batches since ``mark()`` returned ``since``."""
        with self._lock:
            passes = self.passes[since:]
        if not passes:
            return {"batches": 0}
        n = len(passes)
        out = {"batches": n}
        for key in ("rows", "seconds", "parse_s", "silver_s", "gold_s", "merge_s", "ahead_s",
                    "jobs"):
            out[key] = round(sum(p[key] for p in passes) / n, 3)
        return out
