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
from gold.plan import LINES, plan
from silver.parse import parse_table

# A step ahead of the stream carries this batch id (it is no stream batch).
SHIP_STEP = -1
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
        self.batches: list[Shipped] = []
        self._prepared: tuple[int | None, int, Future] | None = None
        self._parse: ThreadPoolExecutor | None = None
        self._waiting: deque[Future] = deque()
        self._took = False          # whether the newest batch no longer waiting was taken

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
        return offered

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
        if self.batches and batch.after_lsn != self.batches[-1].commit_lsn:
            self.batches.clear()         # not the next batch: no step goes across the gap
        lines = None
        if prepared is not None and prepared[:2] == (batch.after_lsn, batch.commit_lsn):
            lines = prepared[2].result()
        self.batches.append(Shipped(batch.after_lsn, batch.commit_lsn, batch.commit_ts,
                                    lines))
        while len(self.batches) > MAX_BATCHES or (
                len(self.batches) > 1 and sum(b.lines.num_rows for b in self.batches
                                              if b.lines is not None) > MAX_LINES):
            self.batches.pop(0)

    def step_from(self, at: int | None) -> Planned | None:
        """The step from the dashboard's watermark ``at`` (None: it holds none of this
        gold) to the newest batch: across every batch after ``at``. Where ``at`` is no batch's
        start, the newest batch's own step, which the fence refuses."""
        if at is not None:
            while self.batches and self.batches[0].commit_lsn <= at:
                self.batches.pop(0)      # the dashboard holds it
        if not self.batches:
            return None
        first, newest = self.batches[0], self.batches[-1]
        across = self.batches if first.after_lsn == at else [newest]
        if any(b.lines is None for b in across):
            return None
        step = plan(pa.concat_tables([b.lines for b in across]))
        return Planned(SHIP_STEP, across[0].after_lsn, step.commit_lsn, step.commit_ts,
                       step.key_deltas)

    def close(self) -> None:
        """After the shipper stopped: its last batch's parse done."""
        if self._parse is not None:
            self._parse.shutdown(wait=True)
