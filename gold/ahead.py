"""The dashboard ahead of the stream: each shipper batch's step of gold, pushed as soon as
bronze holds it (``lakecdc run`` only; docs/gold.md, "Ahead of the stream").

A shipper batch is one bronze commit of whole source transactions, so its rows alone give
gold's step across it: the Arrow parse (``silver.parse``), gold's rules and lines
(``gold.deltas.line_table``) and the plan (``gold.plan``), the stream's own functions on
the same rows. They are worked out in a thread of their own while bronze commits the rows
(``prepare``), and handed to the dashboard's feeder (``gold.feeder``) once it has
(``__call__``).

``ShipAhead`` keeps the steps of the last few batches, each with the newest source commit
bronze held before it, and offers the dashboard the step from its own watermark to the
newest batch: the push adds it only when the dashboard's watermark is that step's start
(``gold.push.push_ahead``'s fence), so the dashboard stays exact as of its watermark
whoever moves it - these steps, the stream's (``gold.apply.Planned``), or the feeder's
catch-up from gold (whose step 3b refreshes every key such steps wrote).

Once the stream's gold writer has started (``to_gold``), each batch's step also goes into
gold, in a thread of its own: appended to ``_deltas`` where gold's watermark is the batch's
start (``gold.apply.GoldBatchWriter.step_ahead``), so a reader of gold by path sees the
change a fold later, without waiting for the stream (docs/gold.md, "Gold ahead of the
stream").

A batch gold would stop on, quarantine rows of, or that does not plan whole (a TRUNCATE,
a row without its dims), or too big to keep (``bronze.shipped.KEPT_ROWS``), is never offered,
and no step goes across it: the stream decides those, and the dashboard follows it from
there.

The parse knows the tables of the captured set the shipper peeked with
(``bronze.capture_list.ShipperSet.known``), which needs no Spark: the steps go ahead from
the shipper's first batch, while the stream is still starting. The set only grows, and the
stream's parse reads it before each batch, so it knows at least those tables when it reads
the same rows: a row the stream would find of an unknown table is found so here too.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from core.captured import CountedTables
from gold.apply import Planned
from gold.deltas import line_table
from gold.feeder import DashboardFeeder
from gold.fold import SHIP_STEP
from gold.plan import LINES, plan
from silver.parse import parse_table

log = logging.getLogger("lakecdc.gold")

# The most batches, and contribution lines, kept for the dashboard to catch up through: at
# steady traffic the dashboard takes every batch at once, so one or two are kept.
MAX_BATCHES = 64
MAX_LINES = 200_000
# The most batches handed on and not yet offered: in a catch-up, one batch's parse and push
# run beside the shipper's next peek.
WAITING = 1


@dataclass(frozen=True)
class Shipped:
    """One shipper batch: gold's lines across it (None: not for a step ahead)."""

    after_lsn: int | None       # the newest source commit bronze held before it
    commit_lsn: int             # the newest it holds after it
    commit_ts: datetime | None
    lines: pa.Table | None      # ``gold.plan.LINES``


def shipped_lines(rows: pa.Table, after_lsn: int | None, known_tables: Iterable[str],
                  tables: CountedTables) -> pa.Table | None:
    """Gold's contribution lines of one shipper batch's bronze rows, or None where the
    stream must judge them: a row the parse fails (silver quarantines it), a row gold stops
    on, a transaction the rows do not hold whole, or a row not after ``after_lsn``."""
    if after_lsn is None or not rows.num_rows:
        return None
    if pc.min(rows.column("commit_lsn")).as_py() <= after_lsn:
        return None
    silver = parse_table(rows, known_tables, tables.names)
    if silver.column("error").null_count < silver.num_rows:
        return None
    found = line_table(silver, tables)
    if found.column("problem_rank").null_count < found.num_rows:
        return None
    lines = found.drop_columns(["problem_rank"]).cast(LINES)
    whole = plan(lines)
    if whole.carried or whole.broken_at is not None:
        return None
    return lines


class Kept:
    """The last shipper batches one follower (the dashboard, or gold) may step across: at
    most ``MAX_BATCHES`` and ``MAX_LINES`` lines, consecutive in bronze's order."""

    def __init__(self) -> None:
        self.batches: list[Shipped] = []

    def add(self, shipped: Shipped) -> None:
        if self.batches and shipped.after_lsn != self.batches[-1].commit_lsn:
            self.batches.clear()         # not the next batch: no step goes across the gap
        self.batches.append(shipped)
        while len(self.batches) > MAX_BATCHES or (
                len(self.batches) > 1 and sum(b.lines.num_rows for b in self.batches
                                              if b.lines is not None) > MAX_LINES):
            self.batches.pop(0)

    def step_from(self, at: int | None) -> Planned | None:
        """The step from the follower's watermark ``at`` (None: it holds none of this
        gold) to the newest batch: across every batch after ``at``. Where ``at`` is no
        batch's start, the newest batch's own step, which the fence refuses."""
        if at is not None:
            while self.batches and self.batches[0].commit_lsn <= at:
                self.batches.pop(0)      # the follower holds it
        if not self.batches:
            return None
        first, newest = self.batches[0], self.batches[-1]
        across = self.batches if first.after_lsn == at else [newest]
        if any(b.lines is None for b in across):
            return None
        step = plan(pa.concat_tables([b.lines for b in across]))
        return Planned(SHIP_STEP, across[0].after_lsn, step.commit_lsn, step.commit_ts,
                       step.key_deltas, step.applied)


class ShipAhead:
    """Each shipper batch's step, handed to the dashboard's feeder (``gold.feeder``) in
    bronze's order, from the shipper's thread: ``prepare`` with a batch's rows right before
    bronze commits them, ``__call__`` once it has. The feeder adds the batch to those kept
    and asks for the step from the dashboard's watermark to it; the future ``__call__``
    returns says whether the dashboard took it. The shipper waits for it, or, in a catch-up,
    peeks on meanwhile (``pipelines.run.shipping``): at most ``WAITING`` batches wait for
    the feeder, so the rows held stay bounded."""

    def __init__(self, feeder: DashboardFeeder, tables: CountedTables) -> None:
        self.feeder = feeder
        self.tables = tables
        self.kept = Kept()                  # the dashboard's
        self._prepared: tuple[int | None, int, Future] | None = None
        self._parse: ThreadPoolExecutor | None = None
        self._waiting: deque[Future] = deque()
        self._took = False          # whether the newest batch no longer waiting was taken
        self._gold = None           # gold's writer (``to_gold``), its batches and thread
        self._gold_kept = Kept()
        self._gold_inbox: deque[tuple] = deque()
        self._gold_thread: ThreadPoolExecutor | None = None
        self._to_gold: deque[Future] = deque()

    @property
    def batches(self) -> list[Shipped]:
        """The batches kept for the dashboard."""
        return self.kept.batches

    @property
    def following(self) -> bool:
        """Whether the dashboard took the step of the newest batch the feeder has answered
        for: it follows the shipper."""
        for offered in reversed(self._waiting):
            if offered.done():
                return offered.result().taken
        return self._took

    def prepare(self, after_lsn: int | None, rows: pa.Table, known: Iterable[str]) -> None:
        """A batch's rows, about to be committed: their lines worked out meanwhile, parsed
        with the tables bronze may hold changes of as of their peek (``known``)."""
        self._prepared = None
        if after_lsn is None or not rows.num_rows:
            return
        if self._parse is None:
            self._parse = ThreadPoolExecutor(1, thread_name_prefix="lakecdc-ahead")
        newest = pc.max(rows.column("commit_lsn")).as_py()
        self._prepared = (after_lsn, newest, self._parse.submit(
            shipped_lines, rows, after_lsn, tuple(known), self.tables))

    def __call__(self, batch) -> Future | None:
        """Hand ``batch`` on (None: it stored no source commit); the future's result is the
        feeder's ``Offered``. Waits while ``WAITING`` batches already do."""
        if batch.commit_lsn is None:
            return None
        prepared, self._prepared = self._prepared, None
        while self._waiting and (self._waiting[0].done() or len(self._waiting) >= WAITING):
            self._took = self._waiting.popleft().result().taken
        offered = self.feeder.offer(partial(self._step_to, batch, prepared), by="shipper")
        self._waiting.append(offered)
        self._into_gold(batch, prepared)
        return offered

    def to_gold(self, writer) -> None:
        """From now on each batch's step goes into gold too, in a thread of its own, where
        gold's watermark is the batch's start (``gold.apply.GoldBatchWriter.step_ahead``);
        None: no more, once those handed on are in (before the stream's last fold)."""
        if writer is None:
            self._gold = None
            wait(list(self._to_gold))
            self._to_gold.clear()
            return
        if self._gold_thread is None:
            self._gold_thread = ThreadPoolExecutor(1, thread_name_prefix="lakecdc-gold-ahead")
        self._gold = writer

    def _into_gold(self, batch, prepared) -> None:
        """Hand ``batch`` to gold's thread (``_gold_turn``), with its prepared lines if they
        are its own."""
        writer = self._gold
        if writer is None:
            return
        lines = prepared[2] if prepared is not None and prepared[:2] == (
            batch.after_lsn, batch.commit_lsn) else None
        self._gold_inbox.append((batch, lines))
        while self._to_gold and self._to_gold[0].done():
            self._to_gold.popleft()
        self._to_gold.append(self._gold_thread.submit(self._gold_turn, writer))

    def _gold_turn(self, writer) -> bool:
        """In gold's thread: the batches handed on since its last turn kept, then, unless
        the newest came from a full peek (a catch-up, where the dashboard follows and gold
        waits: docs/gold.md), the step from gold's watermark across every kept batch after
        it, appended where gold stands at its start (``GoldBatchWriter.step_ahead``);
        whether it was. Gold behind a batch (a step it did not take, the stream's start)
        is brought to one by the stream, and its steps go ahead again from there."""
        full = True
        try:
            while self._gold_inbox:
                batch, lines = self._gold_inbox.popleft()
                self._gold_kept.add(Shipped(batch.after_lsn, batch.commit_lsn,
                                            batch.commit_ts,
                                            None if lines is None else lines.result()))
                full = getattr(batch, "full", False)
            if full:
                return False
            step = self._gold_kept.step_from(writer.known_watermark)
            return step is not None and writer.step_ahead(step)
        except Exception:           # the stream's batch brings gold over the batch instead
            log.warning("a shipper batch's step was not taken into gold", exc_info=True)
            return False

    def drain(self) -> None:
        """Until every batch handed on has been offered."""
        wait(list(self._waiting))

    def _step_to(self, batch, prepared, at: int | None) -> Planned | None:
        """In the feeder, at the dashboard's watermark ``at``: ``batch`` kept, then the
        step from ``at`` to it (None: not one to go ahead)."""
        self.add(batch, prepared)
        return self.step_from(at) if self.batches[-1].lines is not None else None

    def add(self, batch, prepared: tuple[int | None, int, Future] | None) -> None:
        """The batch bronze just committed, with its prepared lines if they are its own
        (none: too big to keep, or prepared before the stream started)."""
        lines = None
        if prepared is not None and prepared[:2] == (batch.after_lsn, batch.commit_lsn):
            lines = prepared[2].result()
        self.kept.add(Shipped(batch.after_lsn, batch.commit_lsn, batch.commit_ts, lines))

    def step_from(self, at: int | None) -> Planned | None:
        """The dashboard's step from its watermark ``at`` (``Kept.step_from``)."""
        return self.kept.step_from(at)

    def close(self) -> None:
        """After the shipper stopped: its last batch's parse done, and its step into gold."""
        for pool in (self._parse, self._gold_thread):
            if pool is not None:
                pool.shutdown(wait=True)

