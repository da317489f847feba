"""The pure parts of gold's folds (``gold.fold``): summing steps, what is not folded yet,
and when a fold is due."""

from __future__ import annotations

import pyarrow as pa

from gold.fold import DELTAS, FoldClock, stamped, summed, unfolded
from gold.plan import KEY_DELTA_COLUMNS

A = ("svc-a", "tpl-1", "email", "created")
B = ("svc-b", "tpl-2", "sms", "sending")


def deltas(*rows) -> pa.Table:
    """(key, delta, last_commit_lsn) rows as ``KEY_DELTA_COLUMNS``."""
    return pa.Table.from_pylist(
        [{**dict(zip(KEY_DELTA_COLUMNS.names[:4], key)), "delta": d, "last_commit_lsn": lsn}
         for key, d, lsn in rows], schema=KEY_DELTA_COLUMNS)


def as_dict(table: pa.Table) -> dict:
    return {tuple(r[c] for c in KEY_DELTA_COLUMNS.names[:4]): (r["delta"], r["last_commit_lsn"])
            for r in table.to_pylist()}


def test_steps_sum_per_key_with_the_newest_commit_and_zero_sums_stay():
    got = summed([deltas((A, 2, 100), (B, 1, 100)), deltas((A, -1, 200), (B, -1, 300))])
    assert got.schema == KEY_DELTA_COLUMNS
    assert as_dict(got) == {A: (1, 200), B: (0, 300)}


def test_rows_read_back_from_deltas_hold_several_steps_and_are_summed_too():
    held = pa.concat_tables([stamped(deltas((A, 1, 100)), 0), stamped(deltas((A, 1, 200)), 1)])
    assert held.schema == DELTAS
    assert as_dict(summed([held])) == {A: (2, 200)}
    assert summed([]).num_rows == 0


def test_not_folded_yet_is_past_gold_s_folded_watermark_and_at_or_past_its_floor():
    # Steps (100], (150, 200], (200, 300]: a shipper batch's among them, batch id -1.
    held = pa.concat_tables([stamped(deltas((A, 1, 100)), 3), stamped(deltas((A, 1, 200)), -1),
                             stamped(deltas((B, 1, 300)), 5)])
    assert unfolded(held, 200, 0).column("batch_id").to_pylist() == [5]
    assert unfolded(held, 100, 0).column("batch_id").to_pylist() == [-1, 5]
    assert unfolded(held, None, 0).num_rows == 3
    # Rows below a rebuild's floor are inside its baseline.
    assert unfolded(held, None, 250).column("batch_id").to_pylist() == [5]


def test_a_gold_folded_before_folds_recorded_their_watermark_is_read_by_batch():
    held = pa.concat_tables([stamped(deltas((A, 1, 100)), 3), stamped(deltas((A, 1, 200)), 4),
                             stamped(deltas((B, 1, 300)), 5)])
    assert unfolded(held, None, 0, folded_batch=4).column("batch_id").to_pylist() == [5]
    # The watermark, once recorded, decides.
    assert unfolded(held, 100, 0, folded_batch=4).column("batch_id").to_pylist() == [4, 5]


def test_a_fold_takes_at_most_its_share_of_the_time():
    now = [0.0]
    clock = FoldClock(0.1, now=lambda: now[0])
    assert clock.due()                            # none yet in this process: at once
    clock.folded(0.3)
    now[0] = 2.6
    assert not clock.due()
    now[0] = 2.71                                 # 0.3 s of folding per 3 s
    assert clock.due()
    assert FoldClock(1.0).due() and not FoldClock(0.0).due()
    every = FoldClock(1.0, now=lambda: now[0])
    every.folded(5.0)
    assert every.due()
