"""Where the shipper (``bronze.ship``) hands each batch (``bronze.shipped.Downstream``).

- ``Reports``: ``lakecdc ship``'s, after each batch: the metrics, then bronze's maintenance
  between two of the shipper's commits.
- ``ToDashboard``: ``lakecdc run``'s. Each batch's bronze mark; its step to the dashboard's
  feeder as soon as bronze holds it (``gold.ahead``, ``gold.feeder``); in a catch-up the
  dashboard follows, the stream's and the mirrors' batches held (``pipelines.run.behind``);
  then the reports and the run's own observers (benchmarks).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from bronze.ship import Shipper
from bronze.shipped import FOLLOWED_PEEK, Downstream, ShipBatch
from bronze.table import Progress
from pipelines.maintain.schedule import Maintainer
from pipelines.run.behind import ShipperBehind

if TYPE_CHECKING:               # `lakecdc ship` needs no Spark: gold's plan imports it
    from gold.ahead import ShipAhead

log = logging.getLogger("lakecdc.run")


class Reports(Downstream):
    """After each batch: ``metrics`` (``pipelines.observe.metrics.PipelineMetrics``; None:
    none), then ``maintainer``'s turn."""

    def __init__(self, metrics, maintainer: Maintainer) -> None:
        self.metrics = metrics
        self.maintainer = maintainer

    def shipped(self, batch: ShipBatch, progress: Progress) -> None:
        if self.metrics is not None:
            self.metrics.on_ship_batch(batch, progress)
        self.maintainer.after_batch()       # bronze, between two of the shipper's commits


class ToDashboard(Reports):
    """``lakecdc run``'s hand-off (module docstring). With ``steps``, each batch's step goes
    to the dashboard as soon as bronze holds it, and the shipper waits for the feeder's
    answer, except, with ``behind``, in a catch-up the dashboard follows: a full peek,
    after one that was not (a catch-up's start) or whose step the dashboard took. The
    shipper then peeks on meanwhile, and ``behind`` holds the stream's and the mirrors'
    batches until a peek is not full or a step not taken."""

    def __init__(self, pipeline, steps: ShipAhead | None = None,
                 behind: ShipperBehind | None = None) -> None:
        super().__init__(pipeline.metrics, Maintainer(pipeline.config, "ship",
                                                      engine=pipeline.engine(),
                                                      switches=pipeline.switches))
        self.marks = pipeline.marks
        self.observers: list[Callable] = pipeline.on_ship
        self.steps = steps
        self.behind = behind
        self.takes_rows = steps is not None
        self._last_full = False         # the previous batch's peek was full

    def rows(self, after_lsn, rows, known) -> None:
        try:
            self.steps.prepare(after_lsn, rows, known)
        except Exception:               # then not ahead: the stream's step follows
            log.warning("a shipper batch's step was not prepared", exc_info=True)

    def stored(self, batch: ShipBatch) -> ShipBatch:
        self.marks.set("bronze", batch.commit_lsn, batch.commit_ts)
        if self.steps is None:
            return batch
        begun = time.monotonic()
        try:
            offered = self.steps(batch)
        except Exception:
            log.warning("a shipper batch was not handed on", exc_info=True)
            offered = None
        if offered is None:
            return batch
        behind = self.behind
        if behind is not None and batch.full and (self.steps.following or not self._last_full):
            behind.set(True)            # released when a step is not taken
            offered.add_done_callback(lambda done: _taken(done) or behind.set(False))
            return batch
        if behind is not None:
            behind.set(False)
        if _taken(offered):
            return replace(batch, ahead_seconds=time.monotonic() - begun)
        return batch

    def shipped(self, batch: ShipBatch, progress: Progress) -> None:
        self._last_full = batch.full
        if self.behind is not None and not batch.full:
            self.behind.set(False)
        self.marks.set("bronze", batch.commit_lsn, batch.commit_ts)
        for observer in self.observers:
            try:
                observer(batch, progress)
            except Exception:            # an observer never fails the shipper
                log.warning("a ship callback failed", exc_info=True)
        super().shipped(batch, progress)


def _taken(offered: Future) -> bool:
    """Whether the dashboard took the step (``gold.feeder.Offered``)."""
    return offered.result().taken


def run_shipper(pipeline, steps: ShipAhead | None = None,
                behind: ShipperBehind | None = None) -> Shipper:
    """``pipeline``'s shipper (a ``pipelines.run.pipeline.Pipeline``), handing each batch to
    ``ToDashboard``; with ``steps``, its peeks bounded by ``FOLLOWED_PEEK``."""
    config = pipeline.config if steps is None else pipeline.config.with_(
        upto_nchanges=min(pipeline.config.upto_nchanges, FOLLOWED_PEEK))
    return Shipper(config, pipeline.switches, engine=pipeline.engine(),
                   downstream=ToDashboard(pipeline, steps, behind))
