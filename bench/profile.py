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
