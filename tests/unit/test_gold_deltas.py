"""gold.deltas on literal silver rows, against whole expected DataFrames written by hand.

Every expected value below is worked out from the rules of docs/gold.md for the literal input
rows, not taken from pipeline output.
"""

from dataclasses import replace
from datetime import datetime, timezone

import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from core.captured import CountedTables
from gold import deltas as D
from gold.plan import lines_table, plan, tuples
from core.errors import UserError
from silver.schema import SILVER_CHANGES

pytestmark = pytest.mark.spark

LIVE = ("public", "notifications")
HIST = ("public", "notification_history")
TS = datetime(2025, 1, 2, 3, 4, 5)
UTC_TS = TS.replace(tzinfo=timezone.utc)      # as Arrow returns it (the session is in UTC)
CREATED = ("svc1", "tpl1", "email", "created")
SENDING = ("svc1", "tpl1", "email", "sending")
DELIVERED = ("svc1", "tpl1", "email", "delivered")
SMS = ("svc2", "tpl9", "sms", "created")
NO_DIMS = (None, None, None, None)


def change(commit_lsn, seq, tx_changes, op, table=LIVE, new=NO_DIMS, old=NO_DIMS,
           old_id=None, error=None, new_id="n1"):
    """One silver row (SILVER_CHANGES) with only what gold reads filled in."""
    schema, name = table if table else (None, None)
    return dict(commit_lsn=commit_lsn, seq=seq, tx_changes=tx_changes, xid=7, lsn=commit_lsn,
                commit_ts=TS, op=op, schema_name=schema, table_name=name,
                id=new_id if new != NO_DIMS else None,
                service_id=new[0], template_id=new[1], notification_type=new[2],
                notification_status=new[3], old_id=old_id, old_service_id=old[0],
                old_template_id=old[1], old_notification_type=old[2],
                old_notification_status=old[3], columns=None, message_prefix=None,
                message_content=None, error=error, shipped_at=TS, identity=None,
                column_types=None)


def silver(spark, *rows):
    return spark.createDataFrame([Row(**r) for r in rows], SILVER_CHANGES)


def contribs(spark, *lines):
    """Expected CONTRIBUTIONS rows: (commit_lsn, tx_changes, dims, delta, rows)."""
    return spark.createDataFrame(
        [(lsn, txc, *dims, TS, delta, rows) for lsn, txc, dims, delta, rows in lines],
        D.CONTRIBUTIONS)


def key_deltas(spark, *lines):
    return spark.createDataFrame([(*dims, delta, last) for dims, delta, last in lines],
                                 D.KEY_DELTAS)


def test_inserts_count_plus_one_in_either_table(spark):
    got = D.contributions(silver(spark,
                                 change(100, 0, 2, "I", LIVE, new=CREATED),
                                 change(100, 1, 2, "I", HIST, new=SMS)))
    assertDataFrameEqual(got, contribs(spark,
                                       (100, 2, NO_DIMS, 0, 2),
                                       (100, 2, CREATED, 1, 0),
                                       (100, 2, SMS, 1, 0)))


def test_update_with_identity_moves_one_between_keys(spark):
    got = D.contributions(silver(spark,
                                 change(200, 0, 1, "U", LIVE, new=SENDING, old=CREATED,
                                        old_id="n1")))
    assertDataFrameEqual(got, contribs(spark,
                                       (200, 1, NO_DIMS, 0, 1),
                                       (200, 1, SENDING, 1, 0),
                                       (200, 1, CREATED, -1, 0)))


def test_update_with_identity_but_same_dims_nets_zero_and_gives_no_key_delta(spark):
    rows = silver(spark, change(210, 0, 1, "U", HIST, new=CREATED, old=CREATED, old_id="n0"))
    assertDataFrameEqual(D.contributions(rows), contribs(spark,
                                                         (210, 1, NO_DIMS, 0, 1),
                                                         (210, 1, CREATED, 0, 0)))
    assertDataFrameEqual(D.key_deltas(D.contributions(rows)), key_deltas(spark))


def test_zero_rules_update_without_identity_history_delete_truncate_message_other_table(spark):
    got = D.contributions(silver(spark,
                                 change(300, 0, 6, "U", LIVE, new=DELIVERED),
                                 change(300, 1, 6, "D", HIST, old=CREATED, old_id="n1"),
                                 change(300, 2, 6, "T", HIST),
                                 change(300, 3, 6, "M", table=None),
                                 change(300, 4, 6, "I", ("public", "services"), new=SMS),
                                 change(300, 5, 6, "D", ("other", "notifications"),
                                        old=CREATED, old_id="n1")))
    assertDataFrameEqual(got, contribs(spark, (300, 6, NO_DIMS, 0, 6)))
    assertDataFrameEqual(D.problems(silver(spark, change(300, 2, 6, "T", HIST))),
                         spark.createDataFrame([], D.problems(silver(spark)).schema))



def test_snapshot_read_rows_count_zero_but_complete_their_transaction(spark):
    """Op R: the backfill's rows, appended to its HIGH watermark message's transaction. The
    baseline already counts them, so they add nothing - but they are rows of the
    transaction, which gold applies only once it holds all of them."""
    rows = [change(800, 0, 3, "M", table=None),
            change(800, 1, 3, "R", LIVE, new=CREATED),
            change(800, 2, 3, "R", HIST, new=DELIVERED)]
    got = D.contributions(silver(spark, *rows))
    assertDataFrameEqual(got, contribs(spark, (800, 3, NO_DIMS, 0, 3)))
    assertDataFrameEqual(D.key_deltas(got), key_deltas(spark))
    assert D.problems(silver(spark, *rows)).collect() == []
    # Without its last read row the transaction is not complete: gold waits for it.
    partial = _plan(spark, silver(spark, *rows[:2]))
    assert (partial.transactions, partial.applied, len(partial.carried)) == (1, 0, 1)
    # Reads are not purges either.
    assert D.history_purges(silver(spark, *rows)).collect() == []


def test_delete_from_notifications_counts_minus_one_on_old_dims(spark):
    got = D.contributions(silver(spark, change(400, 0, 1, "D", LIVE, old=SENDING, old_id="n1")))
    assertDataFrameEqual(got, contribs(spark,
                                       (400, 1, NO_DIMS, 0, 1),
                                       (400, 1, SENDING, -1, 0)))


def test_archival_move_nets_zero_per_key_and_status_change_does_not(spark):
    rows = silver(spark,
                  change(500, 0, 2, "I", HIST, new=DELIVERED),
                  change(500, 1, 2, "D", LIVE, old=DELIVERED, old_id="n1"),
                  change(600, 0, 1, "U", LIVE, new=DELIVERED, old=SENDING, old_id="n2"))
    assertDataFrameEqual(D.key_deltas(D.contributions(rows)),
                         key_deltas(spark, (SENDING, -1, 600), (DELIVERED, 1, 600)))


def test_contributions_of_a_split_transaction_add_up_to_the_whole(spark):
    a = [change(700, 0, 3, "I", LIVE, new=CREATED), change(700, 1, 3, "I", LIVE, new=CREATED)]
    b = [change(700, 2, 3, "U", LIVE, new=SENDING, old=CREATED, old_id="n1")]
    whole = D.contributions(silver(spark, *a, *b))
    parts = D.aggregate(D.contributions(silver(spark, *a))
                        .unionByName(D.contributions(silver(spark, *b))))
    expected = contribs(spark, (700, 3, NO_DIMS, 0, 3), (700, 3, CREATED, 1, 0),
                        (700, 3, SENDING, 1, 0))
    assertDataFrameEqual(whole, expected)
    assertDataFrameEqual(parts, expected)


def _plan(spark, rows, carried=()):
    """``gold.plan`` over the batch's collected ``lines`` (and lines carried before)."""
    found = D.lines(rows).toArrow().to_pylist()
    got = plan(lines_table([tuple(v for k, v in r.items() if k != "problem_rank")
                            for r in found] + list(carried)))
    return replace(got, key_deltas=tuples(got.key_deltas))


def test_completeness_cuts_at_the_first_incomplete_transaction(spark):
    rows = silver(spark,
                  change(10, 0, 1, "I", LIVE, new=CREATED),
                  change(20, 0, 2, "I", LIVE, new=SMS),           # 1 of 2 rows: incomplete
                  change(30, 0, 1, "I", LIVE, new=SENDING))       # complete, after the gap
    got = _plan(spark, rows)
    assert (got.transactions, got.applied, got.commit_lsn, got.broken_at) == (3, 1, 10, None)
    assert got.key_deltas == [(*CREATED, 1, 10)]
    assert sorted(got.carried, key=str) == sorted([
        (20, 2, *NO_DIMS, UTC_TS, 0, 1), (20, 2, *SMS, UTC_TS, 1, 0),
        (30, 1, *NO_DIMS, UTC_TS, 0, 1), (30, 1, *SENDING, UTC_TS, 1, 0)], key=str)
    # The carried lines and the rest of transaction 20 complete it in a later batch.
    later = _plan(spark, silver(spark, change(20, 1, 2, "I", LIVE, new=SMS)), got.carried)
    assert (later.applied, later.commit_lsn, later.carried) == (2, 30, [])
    assert sorted(later.key_deltas) == sorted([(*SMS, 2, 20), (*SENDING, 1, 30)])


def test_completeness_without_a_gap_applies_everything(spark):
    got = _plan(spark, silver(spark, change(10, 0, 1, "I", LIVE, new=CREATED)))
    assert (got.applied, got.commit_lsn, got.commit_ts, got.carried) == (1, 10, UTC_TS, [])


def test_failure_path_too_many_rows_or_disagreeing_sizes_are_broken(spark):
    rows = silver(spark,
                  change(10, 0, 1, "I", LIVE, new=CREATED),
                  change(10, 0, 1, "I", LIVE, new=CREATED),       # delivered twice
                  change(20, 0, 2, "I", LIVE, new=SMS),
                  change(20, 1, 3, "I", LIVE, new=SMS))           # sizes disagree
    got = _plan(spark, rows)
    assert (got.broken_at, got.applied) == (10, 0)
    assert plan(lines_table([(20, 2, *NO_DIMS, None, 0, 1),
                             (20, 3, *NO_DIMS, None, 0, 1)])).broken_at == 20


def test_the_batch_lines_flag_problems_and_problems_names_the_row_to_stop_on(spark):
    rows = silver(spark, change(10, 0, 1, "D", LIVE, old_id="n1"), change(20, 0, 1, "T", LIVE),
                  change(30, 0, 1, "I", LIVE, new=CREATED))
    ranks = {r["commit_lsn"]: r["problem_rank"] for r in D.lines(rows).toArrow().to_pylist()
             if r["service_id"] is None}
    rank = {name: i + 1 for i, name in enumerate(D.PROBLEMS)}
    assert ranks == {10: rank[D.NO_OLD_DIMS], 20: rank[D.TRUNCATE], 30: None}
    first = D.problems(rows).first()
    assert (first.problem, first.commit_lsn, first.seq) == ("truncate", 20, 0)


def test_the_batch_lines_are_summed_in_a_hash_aggregate(spark):
    """No sort of a batch's lines: an aggregate of a struct (the whole problem row, as
    ``lines`` once carried) made Spark sort them (docs/gold.md)."""
    rows = silver(spark, change(10, 0, 1, "I", LIVE, new=CREATED))
    plan = D.lines(rows)._jdf.queryExecution().executedPlan().toString()
    assert "HashAggregate" in plan and "SortAggregate" not in plan


def _problems(spark, *rows, **kw):
    return D.problems(silver(spark, *rows), **kw).select("problem", "commit_lsn", "seq")


def test_failure_path_truncate_of_notifications_stops_gold_with_the_rebuild_command(spark):
    rows = (change(50, 0, 1, "I", LIVE, new=CREATED), change(60, 0, 2, "T", HIST),
            change(60, 1, 2, "T", LIVE))
    assertDataFrameEqual(_problems(spark, *rows),
                         [Row(problem="truncate", commit_lsn=60, seq=1)])
    error = D.stop_error(D.problems(silver(spark, *rows)).first().asDict())
    assert isinstance(error, D.GoldStopped) and isinstance(error, UserError)
    assert "TRUNCATE of public.notifications" in str(error)
    assert "lakecdc backfill rebuild-gold" in str(error)


def test_failure_path_changes_gold_cannot_attribute(spark):
    rows = (change(70, 0, 1, "D", LIVE, old_id="n1"),                      # identity = pk
            change(71, 0, 1, "U", LIVE, new=SENDING, old=("svc1", None, None, None),
                   old_id="n1"),                                            # partial identity
            change(72, 0, 1, "I", HIST, new=("svc1", "tpl1", None, "created")),
            change(73, 0, 1, "X", LIVE),                                    # no such op
            change(74, 0, 1, None, table=None))                             # op NULL, no error
    assertDataFrameEqual(_problems(spark, *rows), [
        Row(problem="no_old_dims", commit_lsn=70, seq=0),
        Row(problem="no_old_dims", commit_lsn=71, seq=0),
        Row(problem="no_new_dims", commit_lsn=72, seq=0),
        Row(problem="bad_op", commit_lsn=73, seq=0),
        Row(problem="bad_op", commit_lsn=74, seq=0)])
    problems = D.problems(silver(spark, *rows)).collect()
    identity = D.stop_error(problems[0].asDict())
    assert isinstance(identity, D.GoldStopped) and "replica identity" in str(identity)
    assert isinstance(D.stop_error(problems[-1].asDict()), D.GoldInputError)


def test_failure_path_error_rows_stop_gold_unless_accepted(spark):
    rows = (change(80, 0, 1, None, table=None, error="malformed JSON"),
            change(90, 0, 1, "I", LIVE, new=CREATED))
    assertDataFrameEqual(_problems(spark, *rows), [Row(problem="error_row", commit_lsn=80,
                                                       seq=0)])
    error = D.stop_error(D.problems(silver(spark, *rows)).first().asDict())
    assert isinstance(error, D.GoldStopped) and "malformed JSON" in str(error)
    # Accepted up to LSN 80: no problem, and the row still counts toward completeness.
    assert D.problems(silver(spark, *rows), accept_errors_upto=80).isEmpty()
    assertDataFrameEqual(D.contributions(silver(spark, *rows)),
                         contribs(spark, (80, 1, NO_DIMS, 0, 1), (90, 1, NO_DIMS, 0, 1),
                                  (90, 1, CREATED, 1, 0)))


def test_problems_are_reported_most_important_first(spark):
    rows = (change(10, 0, 1, "D", LIVE, old_id="n1"), change(20, 0, 1, "T", LIVE),
            change(30, 0, 1, "I", LIVE, new=CREATED))
    assert D.problems(silver(spark, *rows)).first().problem == "truncate"


def test_counted_tables_can_be_named(spark):
    tables = CountedTables.from_names("app.live", "app.archive")
    got = D.contributions(silver(spark,
                                 change(10, 0, 2, "I", ("app", "archive"), new=CREATED),
                                 change(10, 1, 2, "I", LIVE, new=CREATED)), tables)
    assertDataFrameEqual(got, contribs(spark, (10, 2, NO_DIMS, 0, 2), (10, 2, CREATED, 1, 0)))
    assert tables.name("live") == "app.live"
