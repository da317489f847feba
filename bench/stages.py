"""Where a probe's freshness goes, stage by stage.

The pipeline reports each shipper batch (``Pipeline.on_ship``) and each stream batch
(``Pipeline.on_pass``); ``StageClock`` keeps their wall-clock times. Each probe, committed at
``t0`` and first seen on the dashboard ``latency`` later, is then placed on that timeline.
The batch that showed it is the last one whose rows reached the dashboard before it was
seen: a shipper batch whose step went ahead of the stream (``gold.ahead``), or a stream
batch. Its stages:

- **poll wait**: from its commit to the start of the shipper's peek that carried it;
- **ship**: that peek and its bronze commit;
- **ahead of the stream**: the shipper batch's step - the Arrow parse, gold's plan, the
  upsert into the dashboard - right after the bronze commit, before the slot's advance (0
  for a probe a stream batch showed);
- **stream trigger**: from the bronze commit to the start of the stream batch that read it
  (the slot's advance, the trigger interval, a batch that had fixed its input just before
  the commit, Spark's reading of bronze's log and its planning);
- **parse**: reading the batch's bronze files and the Arrow parse;
- **gold + push**: from the parse to the end of the batch's push ahead (gold's step planned
  and upserted into the dashboard); for a batch not pushed ahead (the dashboard was not at
  the step's starting point), to the batch's end;
- **seen**: what is left: the dashboard poller's own interval (0.05 s), the feeder's
  catch-up for a batch not pushed ahead, and anything the stages above did not cover.

The last three are 0 for a probe shown ahead of the stream. The stages add up to the
probe's latency by construction; ``breakdown`` reports each one's percentiles over the
probes, and their medians' share.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

STAGE_LABELS = {"poll_wait": "poll wait (the shipper's next peek)",
                "ship": "ship (peek, bronze commit)",
                "ship_ahead": "ahead of the stream (parse, plan, upsert)",
                "stream_trigger": "stream trigger (interval, bronze's log, planning)",
                "parse": "parse (bronze files → Arrow rows)",
                "gold_push": "gold + push (the step planned, upserted ahead)",
                "seen": "seen (the dashboard poller, the rest)"}
STAGES = tuple(STAGE_LABELS)


@dataclass(frozen=True)
class _Span:
    start: float
    end: float
    parse_s: float = 0.0
    done_s: float = 0.0         # from the start to the batch's rows on the dashboard
    ahead: bool = False         # pushed ahead of gold (else by the feeder's catch-up, later)


class StageClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ships: list[_Span] = []
        self.passes: list[_Span] = []

    def on_ship(self, result, progress) -> None:
        """``Pipeline.on_ship``: a shipper batch that committed changes (its rows on the
        dashboard ``ahead_seconds`` after its bronze commit, when its step went ahead of the
        stream; the slot's advance follows)."""
        if result.committed and result.changes:
            start = result.started_at
            with self._lock:
                self.ships.append(_Span(start, start + result.seconds, 0.0, result.seconds
                                        + result.ahead_seconds, result.ahead_seconds > 0))

    def on_pass(self, result) -> None:
        """``Pipeline.on_pass``: a stream batch (its rows on the dashboard at
        ``ahead_done_seconds``, else at its end)."""
        if result.input_rows:
            start = result.started_at
            done = result.ahead_done_seconds or result.seconds
            with self._lock:
                self.passes.append(_Span(start, start + result.seconds, result.parse_seconds,
                                         done, bool(result.ahead_done_seconds)))

    def place(self, t0: float, latency: float) -> dict[str, float] | None:
        """A probe's stages (None: no batch carried it, as far as this clock saw).

        The stream batch that carried it is the last one whose rows reached the dashboard
        before the probe was seen (the poller looks every 0.05 s). Not the first batch that
        began after the shipper's commit: a batch fixes what it reads (Spark's
        ``latestOffset``) before its work begins, so a commit landing in between waits for
        the next one. The shipper's batch is the first begun after the commit, or the one
        before when that one ended after the stream batch began."""
        seen = t0 + latency
        shown = _last(self.passes, t0, seen, lambda p: p.start + p.done_s)
        early = _last([s for s in self.ships if s.ahead], t0, seen,
                      lambda s: s.start + s.done_s)
        if early is not None and (shown is None or early.start + early.done_s
                                  >= shown.start + shown.done_s):
            stages = {"poll_wait": max(0.0, early.start - t0), "ship": early.end - early.start,
                      "ship_ahead": early.done_s - (early.end - early.start),
                      "stream_trigger": 0.0, "parse": 0.0, "gold_push": 0.0}
            stages["seen"] = latency - sum(stages.values())
            stages["ahead"] = stages["shipped_ahead"] = True
            return stages
        if shown is None:
            return None
        ship = _first_from(self.ships, t0, shown.start)
        if ship is None:
            return None
        stages = {"poll_wait": max(0.0, ship.start - t0), "ship": ship.end - ship.start,
                  "ship_ahead": 0.0, "stream_trigger": max(0.0, shown.start - ship.end),
                  "parse": shown.parse_s, "gold_push": max(0.0, shown.done_s - shown.parse_s)}
        stages["seen"] = latency - sum(stages.values())
        stages["ahead"] = shown.ahead
        stages["shipped_ahead"] = False
        return stages

    def breakdown(self, latencies: list[tuple[float, float]]) -> dict:
        """Per stage, p50/p95/max over the probes placed, and each median's share of the
        median latency."""
        with self._lock:
            self.ships.sort(key=lambda s: s.start)
            self.passes.sort(key=lambda p: p.start)
        placed = [s for t0, lat in latencies if (s := self.place(t0, lat)) is not None]
        out: dict = {"probes": len(latencies), "placed": len(placed),
                     "pushed_ahead": sum(1 for p in placed if p["ahead"]),
                     "shipped_ahead": sum(1 for p in placed if p["shipped_ahead"]),
                     "ship_batches": len(self.ships),
                     "ship_batches_ahead": sum(1 for s in self.ships if s.ahead),
                     "batches": len(self.passes),
                     "batches_pushed_ahead": sum(1 for p in self.passes if p.ahead)}
        if not placed:
            return out
        median_latency = percentile(sorted(lat for _, lat in latencies), 0.5)
        for stage in STAGES:
            values = sorted(p[stage] for p in placed)
            p50 = percentile(values, 0.5)
            out[stage] = {"p50": round(p50, 3), "p95": round(percentile(values, 0.95), 3),
                          "max": round(values[-1], 3),
                          "share": round(p50 / median_latency, 2) if median_latency else None}
        return out


def _last(spans: list[_Span], t0: float, seen: float, shown_at) -> _Span | None:
    """The span whose rows were shown last between ``t0`` and ``seen``."""
    shown = [(shown_at(s), s) for s in spans if t0 < shown_at(s) <= seen + 0.001]
    return max(shown, key=lambda pair: pair[0])[1] if shown else None


def _first_from(spans: list[_Span], after: float, before: float) -> _Span | None:
    """The first span begun at or after ``after``, or the one before it (ending after
    ``after``) when that one ended after ``before`` (so it cannot have carried the
    change)."""
    i = bisect.bisect_left([s.start for s in spans], after)
    if i < len(spans) and spans[i].end <= before:
        return spans[i]
    earlier = spans[i - 1] if i > 0 else None
    return earlier if earlier is not None and after < earlier.end <= before else None


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values``: the nearest rank, as the bench reports it."""
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]
