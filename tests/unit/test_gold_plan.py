"""gold.plan on literal contribution lines: which transactions a batch applies (no Spark).

Lines are (commit_lsn, tx_changes, service, template, type, status, commit_ts, delta, rows);
every expected value is worked out by hand from the rules in gold.plan's docstring."""

from dataclasses import replace
from datetime import datetime, timezone

from gold import plan as P
from gold.plan import lines_table


def plan(lines):
    """``gold.plan.plan`` of lines given as tuples, its key deltas as tuples."""
    got = P.plan(lines_table(lines))
    assert got.key_deltas.schema == P.KEY_DELTA_COLUMNS
    return replace(got, key_deltas=P.tuples(got.key_deltas))


def aggregate(lines):
    """``gold.plan.aggregate`` of lines given as tuples, as tuples."""
    return [tuple(r.values()) for r in P.aggregate(lines_table(lines)).to_pylist()]


T1 = datetime(2026, 1, 1, tzinfo=timezone.utc)
T2 = datetime(2026, 1, 2, tzinfo=timezone.utc)
A = ("s1", "t1", "email", "created")
B = ("s1", "t1", "email", "sending")
NONE = (None, None, None, None)


def ordered(lines):
    """Lines in a fixed order (dims may be None, which does not compare with text)."""
    return sorted(lines, key=repr)


def count_line(lsn, size, rows, ts=T1):
    return (lsn, size, *NONE, ts, 0, rows)


def key_line(lsn, size, dims, delta, ts=T1):
    return (lsn, size, *dims, ts, delta, 0)


def test_whole_transactions_apply_and_net_zero_keys_are_dropped():
    got = plan([count_line(10, 2, 2), key_line(10, 2, A, +1), key_line(10, 2, B, +1),
                count_line(20, 1, 1, T2), key_line(20, 1, A, -1, T2),
                key_line(20, 1, B, +1, T2)])
    assert (got.transactions, got.applied, got.commit_lsn, got.commit_ts) == (2, 2, 20, T2)
    assert got.key_deltas == [(*B, 2, 20)]          # A: +1 -1 = 0, dropped
    assert got.carried == [] and got.broken_at is None


def test_an_incomplete_transaction_cuts_and_everything_after_it_is_carried():
    lines = [count_line(10, 1, 1), key_line(10, 1, A, +1),
             count_line(20, 3, 2), key_line(20, 3, B, +2),
             count_line(30, 1, 1), key_line(30, 1, A, +1)]
    got = plan(lines)
    assert (got.applied, got.commit_lsn, got.carried_transactions) == (1, 10, 2)
    assert got.key_deltas == [(*A, 1, 10)]
    assert ordered(got.carried) == ordered(lines[2:])
    # The last row of 20 arrives with the next batch: the carried lines complete it.
    later = plan([*got.carried, count_line(20, 3, 1), key_line(20, 3, B, +1)])
    assert (later.applied, later.commit_lsn, later.carried) == (2, 30, [])
    assert ordered(later.key_deltas) == ordered([(*A, 1, 30), (*B, 3, 20)])


def test_nothing_complete_applies_nothing_and_keeps_the_watermark():
    got = plan([count_line(10, 2, 1)])
    assert (got.applied, got.commit_lsn, got.commit_ts, got.key_deltas) == (0, None, None, [])


def test_failure_path_more_rows_than_the_transaction_has_or_sizes_disagreeing_are_broken():
    assert plan([count_line(10, 1, 2)]).broken_at == 10
    assert plan([count_line(10, 2, 1), count_line(10, 3, 1)]).broken_at == 10
    assert plan([count_line(10, 0, 0)]).broken_at == 10
    assert plan([count_line(5, 1, 1), count_line(10, 1, 2)]).broken_at == 10


def test_aggregate_is_associative_so_carried_lines_combine_with_new_ones():
    a = [count_line(10, 3, 1), key_line(10, 3, A, +1)]
    b = [count_line(10, 3, 2, T2), key_line(10, 3, A, +1, T2)]
    assert ordered(aggregate(a + b)) == ordered(aggregate(aggregate(a) + aggregate(b))) == \
        ordered([count_line(10, 3, 3, T2), key_line(10, 3, A, +2, T2)])

