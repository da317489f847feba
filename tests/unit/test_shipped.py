"""bronze.shipped.KeptRows.next_peek: a catch-up followed by the dashboard starts with a
small peek and grows it only as far as a batch of its rows' width is kept whole."""

from __future__ import annotations

import pyarrow as pa

from bronze.shipped import FIRST_FOLLOWED_PEEK, KEPT_BYTES, NARROWEST_PEEK, KeptRows


def kept(rows: int, row_bytes: int) -> KeptRows:
    batch = pa.record_batch({"data": pa.array([b"x" * row_bytes] * rows, pa.binary())})
    out = KeptRows()
    out.add(batch)
    return out


def test_a_peek_that_was_not_full_starts_the_next_small():
    assert kept(10, 100).next_peek(50_000, 50_000, full=False) == FIRST_FOLLOWED_PEEK
    assert KeptRows().next_peek(50_000, 50_000, full=False) == FIRST_FOLLOWED_PEEK
    assert kept(10, 100).next_peek(400, 400, full=False) == 400      # never above the bound


def test_full_peeks_of_narrow_rows_double_up_to_the_bound():
    narrow = kept(1_000, 200)
    assert narrow.next_peek(50_000, FIRST_FOLLOWED_PEEK, full=True) == 2 * FIRST_FOLLOWED_PEEK
    assert narrow.next_peek(50_000, 40_000, full=True) == 50_000


def test_full_peeks_of_wide_rows_grow_only_as_far_as_a_batch_is_kept():
    for row_bytes in (2_000, 8_000):          # a row's bytes, as Arrow holds them
        wide = kept(100, row_bytes)
        per_row = wide.bytes / wide.rows
        fits = wide.next_peek(50_000, 40_000, full=True)     # in a catch-up
        assert fits < 40_000 and fits * per_row <= 0.75 * KEPT_BYTES < (fits + 1) * per_row
        started = wide.next_peek(50_000, 500, full=False)   # at its start
        assert started == min(FIRST_FOLLOWED_PEEK, fits)
    huge = kept(10, 1 << 20)                  # 1 MB rows: a peek never asks for fewer
    assert huge.next_peek(50_000, 40_000, full=True) == NARROWEST_PEEK


def test_rows_past_the_kept_bound_still_count_toward_the_width():
    rows = KeptRows()
    for _ in range(40):
        rows.add(pa.record_batch({"data": pa.array([b"x" * (4 << 20)], pa.binary())}))
    assert rows.batches is None and rows.rows == 40
    assert rows.bytes > KEPT_BYTES
