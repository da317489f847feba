"""The dashboard's one writer in a running pipeline (``lakecdc run``, ``lakecdc push``).

One thread, one connection, one queue. Stages hand it steps of gold (``offer``): a stream
batch's planned step while gold's MERGE runs (``pipelines.run.stream``), and a shipper
batch's step as soon as bronze holds it (``gold.ahead``). Each is added to the dashboard only
where the dashboard is at the step's start (``gold.push.push_ahead``'s fence), so whichever
stage's step comes first, the other's finds the dashboard past it, and the dashboard stays
exact as of its watermark.

When no step waits, the feeder catches the dashboard up from gold itself (``gold.push``'s
push, steps 1-4 of docs/gold.md, "The push"): when a stage asks (``catch_up``: the stream,
after each batch) and every ``interval_s`` (a gold written by another process, a dashboard
back after an outage). With no stage handing it steps (``lakecdc push``), that is all it does.

A step never fails its stage: a dashboard the feeder cannot reach, or a gold it cannot read
yet, leaves the step out (its ``Offered`` says not taken), and the catch-up brings the
dashboard to gold later. A catch-up's problem a person must fix (``UserError``, or a
dashboard never reached) ends ``run``, which ends the pipeline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

import psycopg

from core.errors import UserError
from core.postgres import Unreachable, connect
from core.storage import gold_key
from core.switches import NONE, Switches
from gold.push import PushResult, push_ahead, push_gold
from gold.view import gold_view, read_errors

log = logging.getLogger("lakecdc.push")

# The fault point hit right after a stage's step went onto the dashboard (tests).
AFTER_STEP = {"stream": "after_ahead_push", "shipper": "after_ship_ahead"}


@dataclass(frozen=True)
class Offered:
    """What became of a step handed to the feeder."""

    taken: bool             # added to the dashboard
    seconds: float          # the feeder's time on it (0.0: never tried)
    done_at: float          # when it was answered (``time.monotonic()``)


class DashboardFeeder:
    """See the module docstring. ``run`` is the feeder's thread; ``offer`` and ``catch_up``
    are called from the stages' threads.

    ``engine``: what reads gold (``gold.view``; None: delta-rs). ``marks``: what bronze
    and silver hold (``pipelines.run.stream.LayerProgress.snapshot``), recorded with each
    push. ``on_result`` (metrics): each catch-up that completed; it must not raise."""

    def __init__(self, gold_path: str, dashboard_dsn: str, *, interval_s: float = 5.0,
                 engine=None, storage_options: dict | None = None,
                 marks: Callable[[], dict] | None = None, switches: Switches = NONE,
                 on_result: Callable[[PushResult], None] | None = None) -> None:
        self.gold_path = gold_path
        self.dsn = dashboard_dsn
        self.interval_s = interval_s
        self.engine = engine
        self.storage_options = storage_options
        self.marks = marks
        self.switches = switches
        self.on_result = on_result
        self.key = gold_key(gold_path)
        self.pushes: list[PushResult] = []      # the catch-ups that wrote
        self._waiting: deque[tuple[object, str, Future]] = deque()
        self._due = False               # a catch-up was asked for
        self._closed = False
        self._changed = threading.Condition()
        self._conn: psycopg.Connection | None = None
        self._table_id: str | None = None
        self._said: str | None = None   # why the last step was not taken, until one is

    # --- the stages' side -------------------------------------------------------------

    def offer(self, step, by: str) -> Future:
        """Hand the feeder a step of gold (``gold.apply.Planned``, or a function of the
        dashboard's watermark returning one or None: ``gold.ahead``) from stage ``by``
        (``AFTER_STEP``'s keys). Returns the future of its ``Offered``; steps are added in
        the order they are handed on."""
        answer: Future = Future()
        with self._changed:
            if not self._closed:
                self._waiting.append((step, by, answer))
                self._changed.notify()
                return answer
        answer.set_result(Offered(False, 0.0, time.monotonic()))
        return answer

    def catch_up(self) -> None:
        """Ask for a catch-up from gold once the steps handed on are added (the first one
        also starts the catch-ups every ``interval_s``)."""
        with self._changed:
            self._due = True
            self._changed.notify()

    def close(self) -> None:
        """``run`` adds the steps still waiting, then returns; later steps are not taken."""
        with self._changed:
            self._closed = True
            self._changed.notify()

    # --- the feeder's thread ------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> list[PushResult]:
        """Each step handed on, in order; a catch-up when asked for or due; until ``close``,
        or ``stop`` is set (``lakecdc push``), with no step waiting. Returns the catch-ups
        that wrote."""
        stop = stop or threading.Event()
        reached = False
        next_at: float | None = None        # the next catch-up by the clock
        try:
            while True:
                with self._changed:
                    while not (self._waiting or self._due or self._closed or stop.is_set()
                               or next_at is not None and time.monotonic() >= next_at):
                        self._changed.wait(None if next_at is None
                                           else max(0.0, next_at - time.monotonic()))
                    handed = self._waiting.popleft() if self._waiting else None
                    if handed is None and (self._closed or stop.is_set()):
                        return self.pushes
                    if handed is None:
                        self._due = False
                if handed is not None:
                    self._add(*handed)
                    continue
                reached = self._catch_up(reached)
                next_at = time.monotonic() + self.interval_s
        finally:
            with self._changed:
                self._closed = True
                left, self._waiting = list(self._waiting), deque()
            for _, _, answer in left:
                answer.set_result(Offered(False, 0.0, time.monotonic()))
            self._disconnect()

    def _add(self, step, by: str, answer: Future) -> None:
        begun = time.monotonic()
        taken = False
        try:
            taken = self._push_ahead(step)
            if taken:
                self.switches.hit(AFTER_STEP[by])
        finally:
            answer.set_result(Offered(taken, time.monotonic() - begun, time.monotonic()))

    def _push_ahead(self, step) -> bool:
        """``push_ahead`` of ``step``; False (and said once while it lasts) when it cannot
        be added."""
        try:
            if self._table_id is None:
                self._table_id = gold_view(self.gold_path, self.storage_options,
                                           engine=self.engine).table_id
            taken = push_ahead(self._connection(), self.key, self._table_id, step,
                               self.marks() if self.marks is not None else None,
                               self.switches)
        except (psycopg.Error, OSError, Unreachable, UserError,
                *read_errors(self.engine)) as exc:
            said, self._said = self._said, str(exc)
            log.log(logging.DEBUG if said == self._said else logging.WARNING,
                    "a step was not pushed ahead of gold (the push catches up): %s", exc)
            self._disconnect()
            return False
        except Exception:                   # never the stage's failure
            log.warning("a step was not pushed ahead of gold", exc_info=True)
            self._disconnect()
            return False
        self._said = None if taken else self._said
        return taken

    def _catch_up(self, reached: bool) -> bool:
        """One push from gold. A lost connection, a dashboard restarting or a gold read
        failing is retried at the next interval; returns whether the dashboard has been
        reached. Raises what a person must fix, and a first connection that fails."""
        try:
            result = push_gold(self._connection(), self.gold_path, self.storage_options,
                               marks=self.marks() if self.marks is not None else None,
                               switches=self.switches, engine=self.engine)
        except (psycopg.OperationalError, OSError, Unreachable,
                *read_errors(self.engine)) as exc:
            self._disconnect()
            if isinstance(exc, Unreachable) and not reached:
                raise
            log.warning("push failed, retrying in %.0fs: %s", self.interval_s, exc)
            return reached
        if result.pushed:
            self.pushes.append(result)
        if self.on_result is not None:
            self.on_result(result)
        return True

    def _connection(self) -> psycopg.Connection:
        if self._conn is None:
            self._conn = connect(self.dsn, what="dashboard")
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
