"""``silver.parse``: bronze rows → silver change rows and quarantine rows, whole DataFrames.

``tests/fixtures/wal2json/notify_changes.jsonl`` is real wal2json 2.5 output (format v2,
include-xids/-timestamp/-lsn) from Postgres 15 with ``infra/postgres/source_schema.sql`` and
the replica identity ``setup`` creates, B/C rows removed as the shipper folds them. The
traffic: a two-row transaction of inserts (one with ``rate_multiplier`` 1.50 and one with a
35-digit numeric and a TOASTed ``personalisation``), inserts with numeric NaN and
-Infinity (wal2json prints them as null), a status update (identity present), an update of
``billable_units`` on the TOASTed row (``personalisation`` omitted), an archival move
(insert into history + delete), a non-transactional and a transactional logical message,
``ALTER TABLE ADD COLUMN postage`` then an insert, an insert into an uncaptured table
``public.other`` and a ``TRUNCATE notification_history``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from bronze.records import BRONZE_SCHEMA
from silver.parse import parse_changes, quarantine_rows
from silver.schema import SILVER_ADDED, SILVER_CHANGES, SILVER_QUARANTINE

pytestmark = pytest.mark.spark

RECORDED = (Path(__file__).parents[1] / "fixtures" / "wal2json" / "notify_changes.jsonl"
            ).read_text().splitlines()
KNOWN = ("public.notifications", "public.notification_history")
SVC = "11111111-1111-4111-8111-111111111111"
TPL = "22222222-2222-4222-8222-222222222222"
CREATED = "2026-01-02 03:04:05.123456+00"
# The TOASTed value the recording inserted (incompressible enough to be stored out of line).
PERSONALISATION = "".join(hashlib.md5(str(i).encode()).hexdigest() for i in range(160))
COMMIT_TS = dt.datetime(2026, 11, 21, 5, 42, 43, tzinfo=dt.timezone.utc)
SHIPPED_AT = dt.datetime(2026, 11, 21, 5, 42, 44, tzinfo=dt.timezone.utc)


def nid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def bronze_row(commit_lsn: int, seq: int, tx_changes: int, data: str, action: str | None = None,
               xid: int | None = 1, commit_ts: dt.datetime | None = COMMIT_TS) -> dict:
    """A bronze row; ``action`` defaults to the letter the shipper reads from the JSON."""
    return dict(slot="s", commit_lsn=commit_lsn, seq=seq, tx_changes=tx_changes, xid=xid,
                lsn=commit_lsn - 8 + seq, commit_ts=commit_ts,
                action=action or (data[11] if len(data) > 11 else "?"),
                shipped_at=SHIPPED_AT, data=data)


def bronze_df(spark, rows: list[dict]):
    # localCheckpoint: over literal rows the optimizer would evaluate the whole transform
    # itself (ConvertToLocalRelation), so the plan a real scan gets would never run here.
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=BRONZE_SCHEMA)).localCheckpoint()


def silver_row(bronze: dict, **values) -> dict:
    """The expected silver row for ``bronze``: its key columns, ``values``, NULL elsewhere."""
    row = {f.name: None for f in SILVER_CHANGES.fields}
    row.update({k: bronze[k] for k in ("commit_lsn", "seq", "tx_changes", "xid", "lsn",
                                       "commit_ts", "shipped_at")})
    row.update(values)
    return row


def silver_df(spark, rows: list[dict]):
    """Expected rows without the mirrors' columns (``test_the_mirrors_columns`` checks
    them); compare with ``parsed``."""
    return spark.createDataFrame(rows, SILVER_CHANGES).drop(*SILVER_ADDED)


def parsed(bronze, *args):
    return parse_changes(bronze, *args).drop(*SILVER_ADDED)


def dims(n: int, ntype: str, status: str, prefix: str = "") -> dict:
    return {f"{prefix}id": nid(n), f"{prefix}service_id": SVC, f"{prefix}template_id": TPL,
            f"{prefix}notification_type": ntype, f"{prefix}notification_status": status}


def notification(n: int, ntype: str, status: str, billable=None, rate=None,
                 personalisation=None, created=CREATED, **extra) -> dict:
    """Every column of a notifications row as wal2json printed it, as text."""
    return {**dims(n, ntype, status), "key_type": "normal", "created_at": created,
            "sent_at": None, "updated_at": None, "to": None, "reference": None,
            "billable_units": billable, "personalisation": personalisation,
            "rate_multiplier": rate, **extra}


def change(values: dict, table: str = "notifications", **parts) -> dict:
    """An expected silver change of a captured table."""
    return dict(schema_name="public", table_name=table, **values, **parts)


def w2j(action: str, table: str | None = "notifications", columns=None, identity=None,
        **extra) -> str:
    """A wal2json v2 change line (compact, as wal2json writes it)."""
    doc: dict = {"action": action, "xid": 900, "timestamp": "2026-11-21 05:42:43+00",
                 "lsn": "0/153C118"}
    if table is not None:
        doc.update(schema="public", table=table)
    if columns is not None:
        doc["columns"] = [{"name": k, "type": "text", "value": v} for k, v in columns.items()]
    if identity is not None:
        doc["identity"] = [{"name": k, "type": "text", "value": v} for k, v in identity.items()]
    doc.update(extra)
    return json.dumps(doc, separators=(",", ":"))


KEYS = dims(1, "email", "created")


def failed(bronze: dict, error: str) -> dict:
    return silver_row(bronze, error=error)


# --- recorded wal2json output ------------------------------------------------------------

def recorded_bronze() -> list[dict]:
    r = RECORDED
    return [
        bronze_row(1000, 0, 2, r[0]), bronze_row(1000, 1, 2, r[1]),     # xid 732
        bronze_row(1010, 0, 1, r[2]),                                     # 733
        bronze_row(1020, 0, 1, r[3]),                                     # 734
        bronze_row(1030, 0, 1, r[4]),                                     # 735
        bronze_row(1040, 0, 1, r[5]),                                     # 736
        bronze_row(1050, 0, 2, r[6]), bronze_row(1050, 1, 2, r[7]),     # 737 archival move
        bronze_row(1060, 0, 1, r[8], xid=None, commit_ts=None),          # non-tx message
        bronze_row(1070, 0, 2, r[9]), bronze_row(1070, 1, 2, r[10]),    # 738
        bronze_row(1080, 0, 1, r[11]),                                    # 740 after ADD COLUMN
        bronze_row(1090, 0, 1, r[12]),                                    # 741 public.other
        bronze_row(1100, 0, 1, r[13]),                                    # 742 TRUNCATE
    ]


def test_recorded_wal2json_becomes_one_typed_row_per_bronze_row(spark):
    b = recorded_bronze()
    big = "12345678901234567890.123456789012345"
    toasted_update = notification(2, "sms", "created", billable="2", rate=big)
    del toasted_update["personalisation"]     # unchanged TOASTed column: omitted by wal2json
    expected = [
        silver_row(b[0], op="I", **change(dims(1, "email", "created"), columns=notification(
            1, "email", "created", billable="1", rate="1.50"))),
        silver_row(b[1], op="I", **change(dims(2, "sms", "created"), columns=notification(
            2, "sms", "created", rate=big, personalisation=PERSONALISATION))),
        silver_row(b[2], op="I", **change(dims(3, "letter", "created"), columns=notification(
            3, "letter", "created", billable="3"))),
        silver_row(b[3], op="I", **change(dims(4, "email", "created"), columns=notification(
            4, "email", "created", billable="4"))),
        silver_row(b[4], op="U", **change(dims(1, "email", "sending"),
                                          **dims(1, "email", "created", prefix="old_"),
                                          columns=notification(1, "email", "sending",
                                                               billable="1", rate="1.50"))),
        silver_row(b[5], op="U", **change(dims(2, "sms", "created"),
                                          **dims(2, "sms", "created", prefix="old_"),
                                          columns=toasted_update)),
        silver_row(b[6], op="I", **change(dims(1, "email", "sending"), "notification_history",
                                          columns=notification(1, "email", "sending",
                                                               billable="1", rate="1.50"))),
        silver_row(b[7], op="D", **change(dims(1, "email", "sending", prefix="old_"))),
        silver_row(b[8], op="M", message_prefix="hb", message_content="x"),
        silver_row(b[9], op="M", message_prefix="lakecdc", message_content="marker"),
        silver_row(b[10], op="U", **change(dims(3, "letter", "delivered"),
                                           **dims(3, "letter", "created", prefix="old_"),
                                           columns=notification(3, "letter", "delivered",
                                                                billable="3"))),
        silver_row(b[11], op="I", **change(dims(5, "letter", "created"), columns=notification(
            5, "letter", "created", created="2026-01-02 03:04:05+00", postage="second"))),
        failed(b[12], "unknown table public.other"),
        silver_row(b[13], op="T", schema_name="public", table_name="notification_history"),
    ]
    actual = parse_changes(bronze_df(spark, b), KNOWN)
    assert ([(f.name, f.dataType) for f in actual.schema]
            == [(f.name, f.dataType) for f in SILVER_CHANGES])
    assertDataFrameEqual(actual.drop(*SILVER_ADDED), silver_df(spark, expected))


NOTIFICATION_TYPES = {
    "id": "uuid", "service_id": "uuid", "template_id": "uuid",
    "notification_type": "notification_type", "notification_status": "text",
    "key_type": "text", "created_at": "timestamp with time zone",
    "sent_at": "timestamp with time zone", "updated_at": "timestamp with time zone",
    "to": "text", "reference": "text", "billable_units": "integer", "personalisation": "text",
    "rate_multiplier": "numeric"}


def test_the_mirrors_columns(spark):
    """``identity`` holds the replica identity's old values and ``column_types`` each
    column's type as the recorded wal2json 2.5 named it (of the new row, else of the
    identity); messages, truncates and failed rows have neither."""
    b = recorded_bronze()
    rows = {(r.commit_lsn, r.seq): r for r in
            parse_changes(bronze_df(spark, b), KNOWN).select(
                "commit_lsn", "seq", "identity", "column_types").collect()}

    def at(i):
        return rows[(b[i]["commit_lsn"], b[i]["seq"])]

    assert at(0).identity is None and at(0).column_types == NOTIFICATION_TYPES
    assert at(4).identity == dims(1, "email", "created")          # a status update
    assert at(4).column_types == NOTIFICATION_TYPES
    assert at(5).column_types == {k: v for k, v in NOTIFICATION_TYPES.items()
                                  if k != "personalisation"}     # the TOASTed one omitted
    deleted = dims(1, "email", "sending")
    assert at(7).identity == deleted                              # the archival delete
    assert at(7).column_types == {k: NOTIFICATION_TYPES[k] for k in deleted}
    assert at(11).column_types == {**NOTIFICATION_TYPES, "postage": "text"}   # added column
    for i in (8, 9, 12, 13):                      # messages, unknown table, truncate
        assert at(i).identity is None and not at(i).column_types


def test_a_captured_table_is_known_by_configuration(spark):
    b = [bronze_row(10, 0, 1, w2j("I", "notification_archive", columns=KEYS))]
    unknown = silver_df(spark, [failed(b[0], "unknown table public.notification_archive")])
    assertDataFrameEqual(parsed(bronze_df(spark, b), KNOWN), unknown)
    assertDataFrameEqual(parsed(bronze_df(spark, b), ()), unknown)
    assertDataFrameEqual(
        parsed(bronze_df(spark, b), KNOWN + ("public.notification_archive",)),
        silver_df(spark, [silver_row(b[0], op="I", **change(KEYS, "notification_archive",
                                                            columns=KEYS))]))


def test_only_a_counted_tables_changes_must_carry_id_and_the_dims(spark):
    """A captured table gold does not count (``public.services``) needs no id or dims: its
    inserts, updates and deletes parse clean. The same changes of a counted table fail, so
    gold stops on them rather than count NULL dims."""
    row = {"id": SVC, "name": "Cabinet Office", "active": "true"}
    pk = {"id": SVC}
    b = [
        bronze_row(10, 0, 3, w2j("I", "services", columns=row)),
        bronze_row(10, 1, 3, w2j("U", "services", columns={**row, "name": "CO"},
                                 identity=pk)),
        bronze_row(10, 2, 3, w2j("D", "services", identity=pk)),
        bronze_row(20, 0, 2, w2j("I", columns=row)),
        bronze_row(20, 1, 2, w2j("D", identity=pk)),
    ]
    known = KNOWN + ("public.services",)
    clean = [
        silver_row(b[0], op="I", **change({"id": SVC}, "services", columns=row)),
        silver_row(b[1], op="U", **change({"id": SVC, "old_id": SVC}, "services",
                                          columns={**row, "name": "CO"})),
        silver_row(b[2], op="D", **change({"old_id": SVC}, "services")),
    ]
    counted = [
        failed(b[3], "I without service_id, template_id, notification_type, "
                     "notification_status in columns"),
        failed(b[4], "D identity lacks service_id, template_id, notification_type, "
                     "notification_status: the replica identity must cover id and the dims"),
    ]
    bronze = bronze_df(spark, b)
    assertDataFrameEqual(parsed(bronze, known, KNOWN), silver_df(spark, clean + counted))
    assertDataFrameEqual(quarantine_rows(bronze, known, KNOWN).select("commit_lsn", "seq"),
                         spark.createDataFrame([(20, 0), (20, 1)], "commit_lsn long, seq int"))
    # Without the counted tables named, every known table must carry them (the default).
    assert parse_changes(bronze, known).where(F.col("error").isNotNull()).count() == 5



def test_snapshot_read_rows_are_parsed_like_inserts_and_checked_alike(spark):
    """Op R (``lakecdc backfill snapshot``): the row read, shaped as wal2json writes an
    insert, in the transaction of the backfill's HIGH watermark message."""
    read = notification(7, "sms", "delivered", billable="2", rate="1.50")
    high = json.dumps({"action": "M", "xid": 901, "lsn": "0/153C200", "transactional": True,
                       "prefix": "lakecdc.backfill",
                       "content": '{"run":"r1","table":"public.notifications","chunk":1,'
                                  '"mark":"high"}'}, separators=(",", ":"))
    as_backfill = json.dumps({"action": "R", "schema": "public", "table": "notifications",
                              "columns": [{"name": k, "type": "text", "value": v}
                                          for k, v in read.items()]}, separators=(",", ":"))
    b = [
        bronze_row(50, 0, 5, high),
        bronze_row(50, 1, 5, as_backfill),
        bronze_row(50, 2, 5, w2j("R", "notification_history", columns=KEYS)),
        bronze_row(50, 3, 5, w2j("R", columns={**KEYS, "service_id": None})),
        bronze_row(50, 4, 5, w2j("R", "notification_archive", columns=KEYS)),
        bronze_row(60, 0, 1, w2j("R"), "R"),
    ]
    assertDataFrameEqual(parsed(bronze_df(spark, b), KNOWN), silver_df(spark, [
        silver_row(b[0], op="M", message_prefix="lakecdc.backfill",
                   message_content='{"run":"r1","table":"public.notifications","chunk":1,'
                                   '"mark":"high"}'),
        silver_row(b[1], op="R", **change(dims(7, "sms", "delivered"), columns=read)),
        silver_row(b[2], op="R", **change(KEYS, "notification_history", columns=KEYS)),
        failed(b[3], "R without service_id in columns"),
        failed(b[4], "unknown table public.notification_archive"),
        failed(b[5], "R without columns"),
    ]))


# --- values carried through --------------------------------------------------------------

def test_values_reach_silver_exactly_as_postgres_printed_them(spark):
    full = notification(1, "email", "created")
    bare = (w2j("I", columns=full)[:-2]
            + ',{"name":"n1","type":"numeric","value":NaN}'
            + ',{"name":"n2","type":"numeric","value":-Infinity}'
            + ',{"name":"n3","type":"numeric","value":1e400}'
            + ',{"name":"n4","type":"numeric","value":0.10}'
            + ',{"name":"n5","type":"bigint","value":-9223372036854775808}'
            + ',{"name":"b","type":"boolean","value":true}]}')
    # Text that looks like a bare number after "value": must stay as it is.
    tricky = {**full, "reference": '"value":2}', "to": "x\\"}
    b = [
        bronze_row(10, 0, 1, bare),
        bronze_row(20, 0, 1, w2j("I", columns=tricky)),
        bronze_row(30, 0, 1, w2j("U", columns=full)),              # no key change
        bronze_row(40, 0, 1, json.dumps({"action": "M", "xid": None, "lsn": "0/1",
                                         "transactional": False, "prefix": "",
                                         "content": '{"value":3}'}, separators=(",", ":")),
                   xid=None),
    ]
    assertDataFrameEqual(parsed(bronze_df(spark, b), KNOWN), silver_df(spark, [
        silver_row(b[0], op="I", **change(dims(1, "email", "created"), columns={
            **full, "n1": "NaN", "n2": "-Infinity", "n3": "1e400", "n4": "0.10",
            "n5": "-9223372036854775808", "b": "true"})),
        silver_row(b[1], op="I", **change(dims(1, "email", "created"), columns=tricky)),
        silver_row(b[2], op="U", **change(dims(1, "email", "created"), columns=full)),
        silver_row(b[3], op="M", message_prefix="", message_content='{"value":3}'),
    ]))


# --- failure paths -----------------------------------------------------------------------

POISON = [
    ("not json", "I", "malformed JSON"),
    ("", "I", "malformed JSON"),
    ("null", "I", "malformed JSON"),
    ('[{"action":"I"}]', "I", "malformed JSON"),
    (w2j("I", columns=KEYS)[:-20], "I", "malformed JSON"),                       # truncated
    (w2j("I", columns=KEYS).replace('"columns":[', '"columns":"x","c":['), "I",
     "malformed JSON"),                                                         # wrong type
    (w2j("I", columns=KEYS, transactional="yes"), "I", "malformed JSON"),
    ('{"xid":1,"schema":"public","table":"notifications"}', "I", "no action in JSON"),
    (w2j("I", columns=KEYS), "U", "JSON action I differs from bronze action U"),
    (w2j("X", columns=KEYS), "X", "unknown action X"),
    ('{"action":"B","xid":1,"lsn":"0/1","nextlsn":"0/2"}', "B", "unknown action B"),
    (w2j("I", table=None, columns=KEYS), "I", "change without schema or table"),
    (w2j("D", "notification_archive", identity=KEYS), "D",
     "unknown table public.notification_archive"),
    (w2j("I"), "I", "I without columns"),
    (w2j("U", columns={}), "U", "U without columns"),
    (w2j("D"), "D", "D without identity"),
    (w2j("I", columns=KEYS).replace('"name":"template_id"', '"name":"service_id"'), "I",
     "duplicate or unnamed column in columns"),
    (w2j("I", columns=KEYS).replace('"name":"template_id",', ""), "I",
     "duplicate or unnamed column in columns"),
    (w2j("U", columns=KEYS, identity=KEYS).replace('"name":"template_id"', '"name":"id"'),
     "U", "duplicate or unnamed column in columns"),
    (w2j("D", identity=KEYS).replace('"name":"template_id"', '"name":"id"'), "D",
     "duplicate or unnamed column in identity"),
    (w2j("I", columns={"id": nid(1)}), "I",
     "I without service_id, template_id, notification_type, notification_status in columns"),
    (w2j("U", columns={**KEYS, "notification_status": None}), "U",
     "U without notification_status in columns"),
    (w2j("D", identity={"id": nid(1)}), "D",   # REPLICA IDENTITY DEFAULT: primary key only
     "D identity lacks service_id, template_id, notification_type, notification_status: "
     "the replica identity must cover id and the dims"),
    (w2j("U", columns=KEYS, identity={"id": nid(1), "service_id": SVC}), "U",
     "U identity lacks template_id, notification_type, notification_status: "
     "the replica identity must cover id and the dims"),
]


def poison_bronze() -> list[dict]:
    return [bronze_row(100 + 10 * i, 0, 1, data, action) for i, (data, action, _) in
            enumerate(POISON)]


def test_rows_that_cannot_be_trusted_fail_with_the_reason_and_nothing_parsed(spark):
    b = poison_bronze()
    expected = [failed(row, error) for row, (_, _, error) in zip(b, POISON)]
    assertDataFrameEqual(parsed(bronze_df(spark, b), KNOWN), silver_df(spark, expected))


def test_quarantine_holds_exactly_the_failed_rows_with_their_raw_json(spark):
    good = recorded_bronze()
    poison = poison_bronze()
    bronze = bronze_df(spark, good + poison)
    expected = [{f.name: row.get(f.name) for f in SILVER_QUARANTINE.fields} | {"error": error}
                for row, (_, _, error) in zip(poison, POISON)]
    expected.append({f.name: good[12].get(f.name) for f in SILVER_QUARANTINE.fields}
                    | {"error": "unknown table public.other"})
    quarantine = quarantine_rows(bronze, KNOWN)
    assertDataFrameEqual(quarantine, spark.createDataFrame(expected, SILVER_QUARANTINE))
    # The same rows, by the same rules, as the failed rows of silver.
    assertDataFrameEqual(
        quarantine.select("commit_lsn", "seq", "error"),
        parse_changes(bronze, KNOWN).where(F.col("error").isNotNull())
        .select("commit_lsn", "seq", "error"))


def test_good_rows_have_no_quarantine_rows(spark):
    b = [row for i, row in enumerate(recorded_bronze()) if i != 12]
    assert quarantine_rows(bronze_df(spark, b), KNOWN).collect() == []


def test_each_batch_is_parsed_with_the_captured_set_it_is_given(spark):
    """Each batch gets its own rows, and a captured set that grew (``tables add``) is
    parsed with it."""
    services = ('{"action":"I","schema":"public","table":"services","columns":'
                '[{"name":"id","type":"bigint","value":7}]}')
    one = bronze_df(spark, [bronze_row(100, 0, 1, services)])
    two = bronze_df(spark, [bronze_row(200, 0, 1, services)])

    def parsed(bronze, known):
        return [(r.commit_lsn, r.table_name, r.error)
                for r in parse_changes(bronze, known, KNOWN).collect()]

    assert parsed(one, KNOWN) == [(100, None, "unknown table public.services")]
    assert parsed(two, KNOWN) == [(200, None, "unknown table public.services")]
    assert parsed(two, (*KNOWN, "public.services")) == [(200, "services", None)]
