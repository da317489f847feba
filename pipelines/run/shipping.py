"""The shipper of ``lakecdc run``, wired to its pipeline (``pipelines.run.pipeline``): each
batch's bronze mark, its step handed ahead to the dashboard (``gold.ahead``), the hold of
the stream's and the mirrors' batches in a catch-up (``pipelines.run.behind``), the
metrics and callbacks, and bronze's maintenance between two of the shipper's commits.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from bronze.ship import FOLLOWED_PEEK, Shipper
from gold.ahead import ShipAhead
from pipelines.maintain.schedule import Maintainer
from pipelines.run.behind import ShipperBehind

log = logging.getLogger("lakecdc.run")


def wired_shipper(pipeline, ahead: ShipAhead | None = None,
                  behind: ShipperBehind | None = None) -> Shipper:
    """``pipeline``'s shipper (a ``pipelines.run.pipeline.Pipeline``); with ``ahead``, each
    batch's step goes to the dashboard as soon as bronze holds it (``gold.ahead``), and its peeks
    are bounded by ``FOLLOWED_PEEK``. The shipper waits for that push, except with ``behind`` in
    a catch-up the dashboard follows: a full peek, after one that was not (a catch-up's start) or
    whose step the dashboard took. The shipper then peeks on meanwhile, and ``behind`` holds the
    stream's and the mirrors' batches until a peek is not full or a step not taken."""
    maintainer = Maintainer(pipeline.config, "ship", engine=pipeline.engine(),
                            switches=pipeline.switches)
    config = pipeline.config if ahead is None else pipeline.config.with_(
        upto_nchanges=min(pipeline.config.upto_nchanges, FOLLOWED_PEEK))
    last_full = [False]             # the shipper's previous batch's peek was full

    def taken(handed) -> bool:
        try:
            if not handed.result():
                return False
        except Exception:               # the stream's step, or the push loop, follows
            log.warning("a shipper batch was not pushed ahead", exc_info=True)
            return False
        pipeline.switches.hit("after_ship_ahead")
        return True

    def on_stored(result):
        pipeline.marks.set("bronze", result.commit_lsn, result.commit_ts)
        begun = time.monotonic()
        try:
            handed = ahead(result)
        except Exception:
            log.warning("a shipper batch was not handed on", exc_info=True)
            handed = None
        if handed is None:
            return result
        if behind is not None and result.full and (ahead.following or not last_full[0]):
            behind.set(True)
            handed.add_done_callback(lambda done: taken(done) or behind.set(False))
            return result
        if behind is not None:
            behind.set(False)
        if taken(handed):
            return replace(result, ahead_seconds=time.monotonic() - begun)
        return result

    def on_rows(after_lsn, rows, known) -> None:
        try:
            ahead.prepare(after_lsn, rows, known)
        except Exception:               # then not ahead: the stream's step follows
            log.warning("a shipper batch's step was not prepared", exc_info=True)

    def on_batch(result, progress) -> None:
        last_full[0] = result.full
        if behind is not None and not result.full:
            behind.set(False)
        pipeline.marks.set("bronze", result.commit_lsn, result.commit_ts)
        if pipeline.metrics is not None:
            pipeline.metrics.on_ship_batch(result, progress)
        for callback in pipeline.on_ship:
            try:
                callback(result, progress)
            except Exception:            # an observer never fails the shipper
                log.warning("a ship callback failed", exc_info=True)
        maintainer.after_batch()        # bronze, between two of the shipper's commits
    return Shipper(config, pipeline.switches, on_batch=on_batch, engine=pipeline.engine(),
                   **(dict(on_rows=on_rows, on_stored=on_stored)
                      if ahead is not None else {}))
