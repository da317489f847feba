"""``lakecdc run`` in a catch-up: while the shipper is behind the source (its last peek was
full) and the dashboard follows it batch by batch (``gold.ahead``), the stream and the
mirrors hold their next batch, so the two cores go to the dashboard's path first (docs/
gold.md, "Ahead of the stream"). ``lakecdc run`` started on a backlog holds the stream's
start the same way: it waits for the shipper's first batch, which tells whether the
shipper is behind.

Holding only delays work: nothing is written or skipped, and a batch held is processed in
full once released. A batch is held at most ``HOLD_S`` seconds, so in a long catch-up gold
and the mirrors still move at least that often; ``stop`` releases it at once."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("lakecdc.run")

HOLD_S = 30.0


class ShipperBehind:
    def __init__(self, stop: threading.Event, hold_s: float = HOLD_S) -> None:
        self.stop = stop
        self.hold_s = hold_s
        self._free = threading.Event()
        self._free.set()
        self.held = 0                   # batches held so far

    def set(self, behind: bool) -> None:
        """The shipper is behind and the dashboard follows it (True), or not (False)."""
        if behind:
            self._free.clear()
        else:
            self._free.set()

    def hold(self, name: str, before: threading.Event | None = None) -> float:
        """Before a batch of the query ``name``: wait while the shipper is behind, at most
        ``hold_s``. Returns the seconds waited. ``before``: first wait for it to be set
        (within the same ``hold_s``): the shipper's first batch, which tells whether it is
        behind."""
        began = time.monotonic()
        deadline = began + self.hold_s
        while before is not None and not before.wait(0.05) and not self.stop.is_set() \
                and time.monotonic() < deadline:
            pass
        if self._free.is_set():
            return 0.0
        while not self._free.wait(0.05) and not self.stop.is_set() \
                and time.monotonic() < deadline:
            pass
        held = time.monotonic() - began
        self.held += 1
        log.info("the %s held %s %.2fs while the dashboard followed the shipper's "
                 "catch-up", name, "its start" if before is not None else "a batch", held)
        return held

    def holding(self, name: str, foreach: Callable) -> Callable:
        """``foreach`` (a query's ``foreachBatch`` function), each batch held first."""
        def batch(frame, batch_id: int) -> None:
            self.hold(name)
            foreach(frame, batch_id)
        return batch
