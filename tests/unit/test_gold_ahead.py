"""gold.ahead: a shipper batch's step from the dashboard's watermark, across every batch
after it, with the stream's own parse and plan; never across a batch the stream must judge.

``Dashboard`` stands in for the dashboard's feeder (``gold.feeder``) and its
``push_ahead`` (the fence is tested on a real dashboard in
tests/integration/test_ship_ahead.py): it takes a step only from its own watermark, and
adds its key deltas."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from types import SimpleNamespace

import pyarrow as pa

from bronze.records import BRONZE_SCHEMA
from core.captured import COUNTED, DIMS
from gold.ahead import ShipAhead, shipped_lines
from gold.feeder import Offered
from tests.unit.test_silver_parse import bronze_row, dims, nid, w2j

KNOWN = ("public.notifications", "public.notification_history", "public.services")
CREATED, SENDING = dims(1, "email", "created"), dims(1, "email", "sending")


def key(d: dict) -> tuple:
    return tuple(d[c] for c in DIMS)


def ins(n: int, keys: dict = CREATED) -> str:
    return w2j("I", columns={**keys, "id": nid(n)})


def send(n: int) -> str:
    return w2j("U", columns={**SENDING, "id": nid(n)}, identity={**CREATED, "id": nid(n)})


def tx(lsn: int, *changes: str) -> list[dict]:
    return [bronze_row(lsn, seq, len(changes), data) for seq, data in enumerate(changes)]


def bronze(*txs: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([row for t in txs for row in t], schema=BRONZE_SCHEMA)


def offer(push: ShipAhead, after: int | None, *txs: list[dict]) -> bool:
    """A shipper batch of ``txs``, as the shipper hands it on: its rows before its bronze
    commit, then the batch (a ``bronze.shipped.ShipBatch``) after it. Whether the dashboard
    took its step."""
    rows = bronze(*txs)
    push.prepare(after, rows, KNOWN)
    batch = SimpleNamespace(after_lsn=after, commit_ts=None,
                            commit_lsn=max(rows.column("commit_lsn").to_pylist()))
    return push(batch).result().taken


class Dashboard:
    def __init__(self, at: int | None) -> None:
        self.at = at
        self.counts: Counter = Counter()
        self.down = False

    def __call__(self, choose) -> bool:
        step = choose(self.at)
        if self.down or step is None or step.after_lsn != self.at:
            return False
        for row in step.key_deltas.to_pylist():
            self.counts[key(row)] += row["delta"]
        self.at = step.commit_lsn
        return True

    def offer(self, choose, by: str) -> Future:
        """The feeder's answer, at once."""
        assert by == "shipper"
        answer: Future = Future()
        answer.set_result(Offered(self(choose), 0.0, 0.0))
        return answer


class Slow(Dashboard):
    """A feeder that answers once ``release`` is set, from a thread of its own."""

    def __init__(self, at: int | None, release: threading.Event) -> None:
        super().__init__(at)
        self.release = release

    def offer(self, choose, by: str) -> Future:
        answer: Future = Future()

        def add() -> None:
            self.release.wait()
            answer.set_result(Offered(self(choose), 0.0, 0.0))
        threading.Thread(target=add, daemon=True).start()
        return answer


def ahead(dashboard: Dashboard) -> ShipAhead:
    return ShipAhead(dashboard, COUNTED)


def test_each_batch_goes_ahead_from_the_dashboards_watermark_and_a_missed_one_with_the_next():
    board = Dashboard(at=100)
    push = ahead(board)
    # A batch after none bronze held: no watermark to start a step from.
    assert not offer(push, None, tx(110, ins(1), ins(2)))
    assert board.at == 100
    board.at, board.counts = 110, Counter({key(CREATED): 2})   # the stream brought it
    assert offer(push, 110, tx(120, send(1)), tx(130, ins(3)))
    assert board.at == 130 and board.counts == {key(CREATED): 2, key(SENDING): 1}
    board.down = True                                           # one push fails
    assert not offer(push, 130, tx(140, send(2)))
    board.down = False
    assert offer(push, 140, tx(150, send(3)))                # both batches, one step
    assert board.at == 150 and board.counts == {key(CREATED): 0, key(SENDING): 3}
    assert offer(push, 150, tx(160, ins(4)))
    assert [b.commit_lsn for b in push.batches] == [160]       # what the dashboard holds goes


def test_no_step_goes_across_a_batch_the_stream_must_judge():
    board = Dashboard(at=110)
    push = ahead(board)
    offer(push, None, tx(110, ins(1)))
    # A transaction the batch does not hold whole (its rows disagree with its size).
    assert not offer(push, 110, [bronze_row(120, 0, 3, ins(2)), bronze_row(120, 1, 3, ins(3))])
    assert not offer(push, 120, tx(130, ins(4)))             # it would go across 120
    assert board.at == 110
    board.at = 120                                              # the stream judged it
    assert offer(push, 130, tx(140, ins(5)))                 # 130 and 140
    assert board.at == 140 and board.counts == {key(CREATED): 2}


def test_a_batch_out_of_bronzes_order_starts_the_batches_again():
    board = Dashboard(at=110)
    push = ahead(board)
    offer(push, None, tx(110, ins(1)))
    assert not offer(push, 125, tx(130, ins(2)))    # after 125, not after 110: a gap
    assert [b.commit_lsn for b in push.batches] == [130]
    assert not offer(push, 130, tx(140, ins(3)))  # nothing links 110 to 130
    assert board.at == 110


def test_lines_are_refused_for_every_row_gold_or_silver_would_judge():
    def lines(after, *txs):
        return shipped_lines(bronze(*txs), after, KNOWN, COUNTED)

    assert lines(100, tx(110, ins(1)), tx(120, ins(2))).num_rows > 0
    assert lines(None, tx(110, ins(1))) is None                 # what came before unknown
    assert lines(110, tx(110, ins(1))) is None                  # not after it
    assert lines(100, tx(110, w2j("T"))) is None               # a TRUNCATE stops gold
    assert lines(100, tx(110, "{not json")) is None             # silver quarantines it
    assert lines(100, tx(110, w2j("I", table="unknown", columns={"id": "1"}))) is None
    assert lines(100, tx(110, w2j("I", columns={"id": nid(1)}))) is None   # no dims
    assert lines(100, tx(110, w2j("I", table="services", columns={"id": "1"}))).num_rows


def test_rows_prepared_for_another_batch_are_not_taken():
    board = Dashboard(at=110)
    push = ahead(board)
    offer(push, None, tx(110, ins(1)))
    push.prepare(110, bronze(tx(120, ins(2))), KNOWN)      # its commit failed: never stored
    stored = SimpleNamespace(after_lsn=110, commit_lsn=130, commit_ts=None)
    assert not push(stored).result().taken           # stored anew, with rows unseen
    assert board.at == 110 and not board.counts


def test_following_says_whether_the_dashboard_took_the_newest_batch():
    board = Dashboard(at=110)
    push = ahead(board)
    offer(push, None, tx(110, ins(1)))
    assert not push.following                       # the stream's to judge
    assert offer(push, 110, tx(120, ins(2)))
    assert push.following
    board.down = True
    assert not offer(push, 120, tx(130, ins(3)))
    assert not push.following


def test_a_batch_waits_to_be_handed_on_while_the_one_before_is_pushed():
    """The shipper peeks on beside one batch's push, never more: the rows it holds stay
    bounded (``gold.ahead.WAITING``)."""
    release = threading.Event()
    board = Slow(at=110, release=release)
    push = ShipAhead(board, COUNTED)
    offer_rows = [(110, bronze(tx(120, ins(1)))), (120, bronze(tx(130, ins(2))))]
    handed = []
    for after, rows in offer_rows:
        push.prepare(after, rows, KNOWN)
        if handed:                     # the first is held in its push until then
            threading.Timer(0.2, release.set).start()
        handed.append(push(SimpleNamespace(after_lsn=after, commit_ts=None,
                                           commit_lsn=after + 10)))
        assert all(f.done() for f in handed[:-1])
    assert [f.result().taken for f in handed] == [True, True]
    assert board.at == 130 and board.counts == {key(CREATED): 2}



class Gold:
    """Stands in for gold's writer (``GoldBatchWriter.step_ahead``, tested on real tables in
    tests/integration/test_gold_ahead.py): a step only from its own watermark; ``gate``,
    when given, holds each step until it is set."""

    def __init__(self, at: int, gate: threading.Event | None = None) -> None:
        self.known_watermark = at
        self.counts: Counter = Counter()
        self.gate = gate
        self.steps: list[tuple[int, int]] = []

    def step_ahead(self, step) -> bool:
        if self.gate is not None:
            self.gate.wait()
        if step.after_lsn != self.known_watermark:
            return False
        for row in step.key_deltas.to_pylist():
            self.counts[key(row)] += row["delta"]
        self.steps.append((step.after_lsn, step.commit_lsn))
        self.known_watermark = step.commit_lsn
        return True


def shipped(push: ShipAhead, after: int, *txs: list[dict], full: bool = False) -> None:
    """A shipper batch handed on (``offer``), from a full peek or not."""
    rows = bronze(*txs)
    push.prepare(after, rows, KNOWN)
    push(SimpleNamespace(after_lsn=after, commit_ts=None, full=full,
                         commit_lsn=max(rows.column("commit_lsn").to_pylist())))


def test_each_batch_goes_into_gold_too_from_gold_s_own_watermark():
    board, gold = Dashboard(at=110), Gold(at=110)
    push = ahead(board)
    shipped(push, None, tx(110, ins(1)))                # before gold's writer started
    push.to_gold(gold)
    shipped(push, 110, tx(120, ins(2)), tx(130, send(2)))
    shipped(push, 130, tx(140, w2j("T")))               # the stream's to judge
    shipped(push, 140, tx(150, ins(3)))                 # no step goes across 140
    push.to_gold(None)                                  # every batch handed on is in
    assert gold.steps == [(110, 130)] and gold.counts == {key(SENDING): 1}
    gold.known_watermark = 150                          # the stream brought gold there
    shipped(push, 150, tx(160, ins(4)))                 # after to_gold(None): not handed
    assert gold.known_watermark == 150
    push.close()


def test_gold_behind_a_batch_steps_across_the_kept_ones_once_the_stream_brings_it_to_one():
    board, gold = Dashboard(at=100), Gold(at=90)            # gold behind: its writer's start
    push = ahead(board)
    push.to_gold(gold)
    for n in range(3):
        shipped(push, 100 + 10 * n, tx(110 + 10 * n, ins(n)))
    push.to_gold(None)
    assert gold.steps == []
    gold.known_watermark = 110                          # the stream's batch ended at 110
    push.to_gold(gold)
    shipped(push, 130, tx(140, ins(3)))
    push.to_gold(None)
    assert gold.steps == [(110, 140)]                   # across 120, 130 and 140 at once
    assert gold.counts == {key(CREATED): 3}
    push.close()


def test_in_a_catch_up_gold_waits_and_then_steps_across_the_batches_it_kept():
    """Batches of full peeks are kept, not stepped (the dashboard follows, gold waits), and
    batches handed on while gold's thread was busy go in one step."""
    gate = threading.Event()
    board, gold = Dashboard(at=100), Gold(at=100, gate=gate)
    push = ahead(board)
    push.to_gold(gold)
    shipped(push, 100, tx(110, ins(0)))                 # held in gold's thread by the gate
    for n in range(1, 4):
        shipped(push, 100 + 10 * n, tx(110 + 10 * n, ins(n)), full=n < 3)
    gate.set()
    push.to_gold(None)
    assert gold.steps == [(100, 110), (110, 140)]
    push.close()
