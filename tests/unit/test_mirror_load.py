"""The load's pure parts (``silver.mirrors.chunk_load``, ``pipelines.setup.mirror_loader``,
``silver.mirrors.store``): how each type is read, the chunks' queries, a chunk's CSV parsed
into the mirror's types, and what a mirror's history says of a load. Postgres's own output
is what the integration tests (``test_mirrors.py``, ``test_tables_add.py``) read."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal

import pyarrow as pa
import pytest

from core.commits import Commit, commit_metadata, parse_commit_metadata
from pipelines.setup.mirror_loader import LoadState, load_state
from silver.mirrors.chunk_load import chunk_copy, chunk_end, load_column, parse_chunk

COLUMNS = [("k", "integer"), ("name", "text"), ("big", "bigint"), ("price", "numeric(12,2)"),
           ("ratio", "real"), ("flag", "boolean"), ("day", "date"),
           ("at", "timestamp with time zone"), ("seen", "timestamp(3) without time zone"),
           ("raw", "bytea"), ("counts", "integer[]"), ("wait", "interval")]


def test_each_type_is_read_as_the_mirror_holds_it_and_only_bytea_and_arrays_need_spark():
    read = {n: load_column(n, t) for n, t in COLUMNS}
    assert {n for n, c in read.items() if c.typed} == {"raw", "counts"}
    assert read["at"].final == pa.timestamp("us", tz="UTC")
    assert read["seen"].final == pa.timestamp("us")
    assert read["price"].final == pa.decimal128(12, 2)
    assert read["day"].final == pa.date32()
    assert read["wait"].final == pa.string()
    query = chunk_copy("public", "we'ird", [read[n] for n, _ in COLUMNS], ("k",),
                       ["41"], ["90"]).as_string(None)
    assert query.startswith("COPY (SELECT t.\"k\", t.\"name\"")
    assert query.endswith("FROM \"public\".\"we'ird\" AS t WHERE (t.\"k\") > ('41') AND "
                          "(t.\"k\") <= ('90')) TO STDOUT (FORMAT csv)"), query
    assert ", t.\"at\", t.\"seen\", " in query        # as their ISO text, in UTC
    assert "encode(t.\"raw\", 'hex')" in query
    assert "IN ('NaN', 'Infinity', '-Infinity') THEN NULL" in query      # numbers as JSON
    assert "WHERE" not in chunk_copy("public", "t", [read["k"]], ("k",), None, None
                                     ).as_string(None)
    assert chunk_end("public", "t", ("a", "b"), ["1", "x"], 100).as_string(None) == (
        "SELECT format('%s', t.\"a\"), format('%s', t.\"b\") FROM \"public\".\"t\" AS t "
        "WHERE (t.\"a\", t.\"b\") > ('1', 'x') ORDER BY t.\"a\", t.\"b\" OFFSET 99 LIMIT 1")


def test_a_chunk_parses_into_the_mirror_types_with_null_apart_from_empty_text():
    columns = [load_column(n, t) for n, t in COLUMNS]
    day = (dt.date(2026, 11, 29) - dt.date(1970, 1, 1)).days
    data = (f'7,"a ""b"", c\nd",-9000000000,12.50,0.1,t,{day},2025-11-29 00:00:00.123456+00,'
            '2025-11-29 00:00:00.5,0aff,"{1,NULL,3}",1 day\n'
            '8,"",,,,f,,,,,,\n'
            '9,,1,,,,,,,,,\n').encode()
    rows = parse_chunk(data, columns)
    got = rows.to_pylist()
    assert got[0]["name"] == 'a "b", c\nd' and got[1]["name"] == "" and got[2]["name"] is None
    assert got[0]["big"] == -9_000_000_000 and got[0]["price"] == Decimal("12.50")
    assert got[0]["ratio"] == pytest.approx(0.1) and got[0]["flag"] is True
    assert got[1]["flag"] is False and got[2]["flag"] is None
    assert got[0]["day"] == dt.date(2026, 11, 29)
    assert got[0]["at"] == dt.datetime(2025, 11, 29, 0, 0, 0, 123456, tzinfo=dt.timezone.utc)
    assert got[0]["seen"] == dt.datetime(2025, 11, 29, 0, 0, 0, 500000)
    assert got[0]["raw"] == "0aff" and got[0]["counts"] == "{1,NULL,3}"   # for Spark
    assert got[0]["_lakecdc_commit_lsn"] is None and got[0]["_lakecdc_commit_ts"] is None
    assert rows.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert parse_chunk(b"", columns).num_rows == 0
    for beyond in ("10000-01-01 00:00:00+00", "0044-03-15 00:00:00+00 BC", "infinity"):
        with pytest.raises(pa.ArrowInvalid):        # the load stops, as the stream's typing
            parse_chunk(f"1,,,,,,,{beyond},,,,\n".encode(), columns)


def test_nan_and_infinity_are_loaded_as_the_change_stream_gives_them():
    """wal2json 2.5 (numbers as JSON): NULL in every float and numeric column. Numbers as
    text (2.6+): kept, but a decimal's NaN (a decimal has none)."""
    types = [("f", "double precision"), ("r", "real"), ("n", "numeric"),
             ("d", "numeric(10,2)"), ("i", "integer")]
    nulled = "IN ('NaN', 'Infinity', '-Infinity') THEN NULL"
    as_json = {n: load_column(n, t).expression.as_string(None) for n, t in types}
    assert [n for n, e in as_json.items() if nulled in e] == ["f", "r", "n", "d"]
    as_text = [load_column(n, t, numbers_as_text=True) for n, t in types]
    assert [c.name for c in as_text if nulled in c.expression.as_string(None)] == ["d"]
    rows = parse_chunk(b"NaN,-Infinity,NaN,,1\nInfinity,NaN,-Infinity,2.50,2\n", as_text)
    got = rows.to_pylist()
    assert math.isnan(got[0]["f"]) and got[0]["r"] == -math.inf and got[0]["n"] == "NaN"
    assert got[1]["f"] == math.inf and math.isnan(got[1]["r"]) and got[1]["n"] == "-Infinity"
    assert got[0]["d"] is None and got[1]["d"] == Decimal("2.50")


def test_a_bad_value_does_not_parse():
    with pytest.raises(pa.ArrowInvalid):
        parse_chunk(b"x\n", [load_column("k", "integer")])


def test_a_load_is_found_in_the_mirrors_history_by_its_run():
    def commit(**meta):
        return {"userMetadata": commit_metadata("mirror", **meta)}

    history = [{"userMetadata": None}, commit(batch_id=4),
               commit(load=2, chunk=3, rows=30, after=["30"], floor=99),
               commit(load=2, chunk=2, rows=20, after=["20"], floor=99),
               commit(load=1, chunk=9, rows=90, after=["90"], floor=5, complete=True)]
    commits = [Commit(len(history) - i, parse_commit_metadata(c["userMetadata"], "mirror"))
               for i, c in enumerate(history)]
    assert load_state(commits, 2) == LoadState(3, 30, ["30"], 99, False)
    assert load_state(commits, 1) == LoadState(9, 90, ["90"], 5, True)
    assert load_state(commits, 3) == LoadState()
    assert json.loads(history[2]["userMetadata"])["floor"] == 99


def test_a_complete_load_is_due_its_replay_until_a_merge_records_it():
    """Read from app transactions alone (a checkpoint carries them; log cleanup deletes the
    commits' metadata): the floor of the newest complete load, until the replay of that
    floor is recorded; a later load is due again."""
    from silver.mirrors.merge import due_replay, start_point
    from silver.mirrors.mirror_table import LOAD_APP_ID, SEED_APP_ID

    assert due_replay(None, None) is None                   # never loaded (or still loading)
    assert due_replay(99, None) == 99
    assert due_replay(99, 99) is None                       # applied
    assert due_replay(140, 99) == 140                       # loaded again (removed, added)
    assert start_point({SEED_APP_ID: 50, LOAD_APP_ID: 99}.get) == 99
    assert start_point({SEED_APP_ID: 120, LOAD_APP_ID: 99}.get) == 120   # a newer baseline
    assert start_point({}.get) is None


@pytest.mark.parametrize("pg_type", [
    "smallint", "integer", "bigint", "oid", "real", "double precision", "boolean", "date",
    "bytea", "numeric(12,2)", "numeric(50,2)", "numeric", "text", "uuid", "jsonb",
    "timestamp with time zone", "timestamp(3) without time zone", "integer[]", "text[]",
    "numeric(5,1)[]", "timestamp with time zone[]", "interval"])
def test_the_load_writes_each_type_as_spark_types_it(pg_type):
    """One type map, two views: the Arrow type the load writes is the one Spark writes for
    the mirror's Spark type (Spark's timestamps as UTC instants)."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import TimestampType

    from silver.mirrors.type_map import arrow_type
    from silver.mirrors.mirror_types import spark_type

    spark = spark_type(pg_type)
    expected = pa.timestamp("us", tz="UTC") if isinstance(spark, TimestampType) \
        else to_arrow_type(spark)
    assert arrow_type(pg_type) == expected


def test_which_columns_lose_nan_and_infinity_and_the_shipper_asks_for_text():
    from bronze.slot import plugin_options
    from silver.mirrors.type_map import loses_specials

    as_json = [t for t in ("real", "double precision", "numeric", "numeric(10,2)",
                           "numeric(50,2)", "integer", "text", "real[]")
               if loses_specials(t, numbers_as_text=False)]
    assert as_json == ["real", "double precision", "numeric", "numeric(10,2)", "numeric(50,2)"]
    # As text, only a decimal's (precision up to 38: a wider numeric is a string) is lost.
    assert [t for t in as_json if loses_specials(t, numbers_as_text=True)] == ["numeric(10,2)"]
    assert plugin_options(("public.t",), numbers_as_text=True)[-2:] == [
        "numeric-data-types-as-string", "1"]
    assert "numeric-data-types-as-string" not in plugin_options(("public.t",))


def test_a_load_is_complete_by_its_app_transaction_when_its_commits_are_gone(tmp_path):
    """The load's last chunk records its floor as the app transaction ``lakecdc-mirror-load``,
    which a checkpoint carries: with no commit of the load left in the history (log
    cleanup), a rerun of the same load reads nothing and writes nothing. A later load
    (a higher floor) is not complete: it reads the source (here none: it fails)."""
    from deltalake import DeltaTable

    from pipelines.setup.mirror_loader import MirrorTarget, load_mirror
    from silver.mirrors.mirror_table import COMMIT_LSN, COMMIT_TS, LOAD_APP_ID, TableSpec

    spec = TableSpec("public", "t", (("id", "integer"), ("name", "text")), ("id",))
    target = MirrorTarget(str(tmp_path / "mirror"), spec)
    target.ensure()
    rows = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"],
                     COMMIT_LSN: pa.nulls(2, pa.int64()),
                     COMMIT_TS: pa.nulls(2, pa.timestamp("us", tz="UTC"))})
    target.write(rows, commit_metadata("mirror"), overwrite=True, app=(LOAD_APP_ID, 99))
    version = DeltaTable(target.path).version()
    report = load_mirror("postgresql://127.0.0.1:1/none", target, 7, 99)
    assert (report.complete, report.rows, report.new_rows) == (True, 2, 0)
    assert DeltaTable(target.path).version() == version
    with pytest.raises(Exception):
        load_mirror("postgresql://127.0.0.1:1/none", target, 8, 100)
