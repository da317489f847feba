"""Typed mirrors of captured tables: random traffic on a table with a composite
primary key and a column of every mapped type - TOASTed text updated and left alone, key
changes, deletes, a TRUNCATE, a column added mid-stream - over several ``run --once``
passes; each ends in mirror = source, the mirror read with delta-rs and the source with
psycopg, never through lakecdc. Then the mirrors' app transactions: a batch replayed after
its MERGE writes nothing, and a batch merged in parts, killed after its first part, is
completed by the next start without writing that part again."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import re
import shutil
import struct
from decimal import Decimal

import pytest

from core.captured import COUNTED
from core.layout import mirror_path
from tests.tests_support import cli_env, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLE = "public.typed_rows"
CAPTURED = (*COUNTED.names, TABLE)
MIRRORED = {"LAKECDC_TABLES": ",".join(CAPTURED), "LAKECDC_MIRRORS": "all"}

SCHEMA_SQL = """
CREATE TYPE mood AS ENUM ('calm', 'busy');
CREATE TABLE typed_rows (
    k1 integer, k2 text, small smallint, big bigint, price numeric(12,2), exact numeric,
    ratio real, score double precision, flag boolean, day date,
    seen timestamp, at timestamptz, label varchar(20), code char(3), ref uuid, state mood,
    doc jsonb, raw bytea, counts integer[], tags text[], wait interval, body text,
    PRIMARY KEY (k1, k2));
-- Stored out of line and uncompressed: an UPDATE that leaves it alone omits it from the WAL.
ALTER TABLE typed_rows ALTER COLUMN body SET STORAGE EXTERNAL;
"""
# Read back as the mirror holds each type (text for types kept as text: Postgres's own
# output, as wal2json prints it).
SOURCE_SELECT = """
SELECT k1, k2, small, big, price, exact::text, ratio, score, flag, day, seen, at, label, code,
       ref::text, state::text, doc::text, raw, counts, tags, wait::text, body{added}
FROM typed_rows"""


def toasted(rng: random.Random) -> str:
    """Text long enough to be TOASTed (over 2 kB, stored out of line)."""
    seed = rng.getrandbits(64)
    return "".join(hashlib.sha256(f"{seed}-{i}".encode()).hexdigest() for i in range(40))


def values(rng: random.Random, k1: int, k2: str) -> list:
    return [k1, k2, rng.randint(-32768, 32767), rng.randint(-2**62, 2**62),
            Decimal(rng.randint(-10**11, 10**11)) / 100,
            rng.choice([Decimal("12345678901234567890.123456789012345"), Decimal("0.5"), None]),
            rng.choice([0.1, -2.5, 3.25e10]), rng.random() * 1e6, rng.random() < 0.5,
            dt.date(2020, 1, 1) + dt.timedelta(days=rng.randint(0, 3000)),
            dt.datetime(2026, 1, 1, 12, 0) + dt.timedelta(microseconds=rng.getrandbits(40)),
            dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=rng.randint(-5, 5))))
            + dt.timedelta(seconds=rng.randint(0, 10**7)),
            rng.choice(["a", "b, c", "é"]), rng.choice(["ab", "xyz"]),
            f"00000000-0000-4000-8000-{rng.getrandbits(40):012x}", rng.choice(["calm", "busy"]),
            rng.choice(['{"a": [1, 2]}', '{"b": "x\\"y"}', None]),
            rng.randbytes(rng.randint(0, 8)), [rng.randint(-9, 9), None, 3],
            rng.choice([["p", "q r", 'quo"te', "com,ma"], [], None]),
            dt.timedelta(seconds=rng.randint(0, 10**6)), toasted(rng)]


INSERT = ("INSERT INTO typed_rows VALUES (" + ", ".join(["%s"] * 22) + ")")


def traffic(conn, rng: random.Random, rounds: int, added: bool = False,
            moves: bool = True) -> None:
    keys = [tuple(r) for r in conn.execute("SELECT k1, k2 FROM typed_rows")]
    for _ in range(rounds):
        with conn.transaction():
            k = (rng.randint(0, 10**6), rng.choice(["x", "y", "z z"]))
            if k not in keys:
                conn.execute(INSERT, values(rng, *k))
                keys.append(k)
            if keys and rng.random() < 0.6:          # body left alone: omitted (TOAST)
                conn.execute("UPDATE typed_rows SET big = big + 1, flag = NOT flag, "
                             "tags = %s WHERE k1 = %s AND k2 = %s",
                             [rng.choice([["n"], None]), *rng.choice(keys)])
            if keys and rng.random() < 0.2:          # body rewritten
                conn.execute("UPDATE typed_rows SET body = %s WHERE k1 = %s AND k2 = %s",
                             [toasted(rng), *rng.choice(keys)])
            if moves and keys and rng.random() < 0.15:         # the key changes
                old = keys.pop(rng.randrange(len(keys)))
                new = (old[0] + 10**7, old[1])
                conn.execute("UPDATE typed_rows SET k1 = %s, small = 1 WHERE k1 = %s "
                             "AND k2 = %s", [new[0], *old])
                keys.append(new)
            if keys and rng.random() < 0.2:
                conn.execute("DELETE FROM typed_rows WHERE k1 = %s AND k2 = %s",
                             list(keys.pop(rng.randrange(len(keys)))))
            if added and keys and rng.random() < 0.5:
                conn.execute("UPDATE typed_rows SET note = %s WHERE k1 = %s AND k2 = %s",
                             [f"note {rng.random()}", *rng.choice(keys)])


def source_rows(conn, added: bool) -> dict:
    rows = conn.execute(SOURCE_SELECT.format(added=", note" if added else "")).fetchall()
    # psycopg reads a real (float4) into a double; the mirror's float holds the float4 itself.
    return {(r[0], r[1]): [_norm(v) for v in (*r[:6], _float4(r[6]), *r[7:])] for r in rows}


def _float4(value):
    return None if value is None else struct.unpack("f", struct.pack("f", value))[0]


def mirror_rows(config, added: bool, tail: bool = False, spark=None) -> dict:
    """The mirror's table read with delta-rs; ``tail``: with its tail laid over it
    (``silver.mirrors.tail.read_mirror``), by Spark where ``spark`` is given
    (``silver.mirrors.store_spark.current_mirror``)."""
    from deltalake import DeltaTable

    from silver.mirrors.tail import read_mirror

    names = ["k1", "k2", "small", "big", "price", "exact", "ratio", "score", "flag", "day",
             "seen", "at", "label", "code", "ref", "state", "doc", "raw", "counts", "tags",
             "wait", "body", *(["note"] if added else [])]
    path = mirror_path(config.lakehouse, TABLE)
    if tail and spark is not None:
        from silver.mirrors.store_spark import current_mirror

        table = current_mirror(spark, path).select(*names).toArrow()
    elif tail:
        table = read_mirror(path, columns=names).select(names)
    else:
        table = DeltaTable(path).to_pyarrow_table(columns=names)
    return {(r["k1"], r["k2"]): [_norm(r[n]) for n in names] for r in table.to_pylist()}


def _norm(value):
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    return value


def assert_mirror_is_source(source_db, config, added=False, tail=False, spark=None):
    with source_db.connect() as conn:
        expected = source_rows(conn, added)
    got = mirror_rows(config, added, tail, spark)
    assert len(expected) > 5
    assert got.keys() == expected.keys()
    differing = [k for k in expected if got[k] != expected[k]]
    assert not differing, (len(differing), differing[:3], [
        (i, got[k][i], expected[k][i]) for k in differing[:2]
        for i in range(len(expected[k])) if got[k][i] != expected[k][i]])


@pytest.mark.long
@pytest.mark.parametrize("merge_s", ["1000", "0"], ids=["merge", "tail"])
def test_a_mirror_matches_its_source_through_toast_key_changes_truncate_and_a_new_column(
        source_db, config, cli_here, merge_s):
    """The table holds rows before ``setup``: its mirror starts from them (read in the
    slot's exported snapshot), then follows the changes. ``merge``: every batch MERGEd
    (however long a MERGE takes); ``tail``: every mirror keeps its batches in a tail first
    (``LAKECDC_MIRROR_MERGE_S=0``, as a big table's does), drained at the end of each run."""
    rng = random.Random(1717)
    with source_db.connect() as conn:
        conn.execute(SCHEMA_SQL)
        traffic(conn, rng, 40)
    env = {**cli_env(config), **MIRRORED, "LAKECDC_MIRROR_MERGE_S": merge_s}
    setup = cli_here(["setup"], env)      # in this process: its bytea and arrays need Spark
    assert setup.returncode == 0, setup.stderr[-3000:]
    for table in ("public.notifications", "public.notification_history"):
        assert f"loaded the 0 rows of {table} into its mirror" in setup.stdout, setup.stdout
    assert "rows of public.typed_rows into its mirror in" in setup.stdout, setup.stdout
    moves = merge_s != "0"           # a batch moving a key is MERGEd, tail or not
    with source_db.connect() as conn:
        traffic(conn, rng, 60, moves=moves)

    def run_once():
        done = cli_here(["run", "--once"], env)
        assert done.returncode == 0, done.stderr[-3000:]

    run_once()
    assert_mirror_is_source(source_db, config)
    with source_db.connect() as conn:           # TOAST left alone across batches
        conn.execute("UPDATE typed_rows SET small = 7")
        traffic(conn, rng, 30, moves=moves)
    run_once()
    assert_mirror_is_source(source_db, config)
    with source_db.connect() as conn:           # a TRUNCATE between changes, in one batch
        traffic(conn, rng, 10)
        conn.execute("TRUNCATE typed_rows")
        traffic(conn, rng, 20)
        conn.execute("ALTER TABLE typed_rows ADD COLUMN note text")
        traffic(conn, rng, 30, added=True)
    run_once()
    assert_mirror_is_source(source_db, config, added=True)
    # The tail took the second run's batch; the first applies the changes held while setup
    # loaded the table, the third a TRUNCATE: both MERGEd into the table.
    assert (tail_batches(config) >= 1) if merge_s == "0" else tail_batches(config) == 0


def tail_batches(config) -> int:
    """The batches the mirror's tail took (``silver.mirrors.tail``)."""
    import json

    from deltalake import DeltaTable

    from silver.mirrors.tail import tail_path

    tail = tail_path(mirror_path(config.lakehouse, TABLE))
    if not DeltaTable.is_deltatable(tail):
        return 0
    return sum("batch_id" in json.loads(c.get("userMetadata") or "{}")
               for c in DeltaTable(tail).history())


def mirrored_after_one_run(source_db, config, cli_here, seed: int, rounds: int) -> dict:
    """``typed_rows`` created and captured by ``setup``, ``rounds`` of traffic on it, then
    ``run --once``: every layer and the mirror hold them. Returns the CLI's environment."""
    with source_db.connect() as conn:
        conn.execute(SCHEMA_SQL)
    env = {**cli_env(config), **MIRRORED}
    assert run_cli(["setup"], env).returncode == 0
    with source_db.connect() as conn:
        traffic(conn, random.Random(seed), rounds)
    assert cli_here(["run", "--once"], env).returncode == 0
    return env


def test_a_replayed_mirror_batch_changes_nothing(source_db, config, tmp_path, cli_here):
    """The mirrors' checkpoint is put back to before its last batch, which then runs again
    (a kill after the MERGE, before the checkpoint's commit): the MERGE of a batch's final
    rows is idempotent by construction, and its app transaction skips it without a write."""
    from deltalake import DeltaTable

    env = mirrored_after_one_run(source_db, config, cli_here, seed=23, rounds=20)
    checkpoint = f"{config.lakehouse}/_checkpoints/mirrors"
    saved = tmp_path / "mirrors-checkpoint"
    shutil.copytree(checkpoint, saved)
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET big = big + 1")     # no TOAST column touched
        conn.execute("DELETE FROM typed_rows WHERE k1 % 2 = 0")
    assert cli_here(["run", "--once"], env).returncode == 0
    assert_mirror_is_source(source_db, config)
    version = DeltaTable(mirror_path(config.lakehouse, TABLE)).version()
    shutil.rmtree(checkpoint)
    shutil.copytree(saved, checkpoint)                         # the batch runs again
    again = cli_here(["mirrors", "--once"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "public.typed_rows (1 batches)" in again.stdout
    assert DeltaTable(mirror_path(config.lakehouse, TABLE)).version() == version
    assert_mirror_is_source(source_db, config)


def test_kill_9_between_the_parts_of_a_batch_then_the_rerun_merges_only_the_rest(
        source_db, config, cli_here):
    """One batch moves a row's key twice (A -> B -> C) leaving its TOASTed body out, so it is
    merged in two parts: the second move needs the mirror's row at B, which the first part
    writes. The process is killed right after the first part's commit (``kill -9``'s
    ``os._exit``, before the checkpoint). The next start replays the batch: the first
    part's app transaction skips it (no commit), the second is merged, and the mirror
    equals the source, the moved row's body included."""
    import json

    from deltalake import DeltaTable

    env = mirrored_after_one_run(source_db, config, cli_here, seed=31, rounds=12)
    with source_db.connect() as conn:
        k1, k2 = conn.execute("SELECT k1, k2 FROM typed_rows ORDER BY k1 LIMIT 1").fetchone()
        for step in (1, 2):                         # A -> B, then B -> C: the body left out
            conn.execute("UPDATE typed_rows SET k1 = %s, small = %s WHERE k1 = %s AND k2 = %s",
                         [-step, step, k1 if step == 1 else -1, k2])
    assert cli_here(["ship", "--once"], env).returncode == 0
    assert cli_here(["stream", "--once"], env).returncode == 0
    mirror = mirror_path(config.lakehouse, TABLE)
    before = DeltaTable(mirror).version()

    killed = run_cli(["mirrors", "--once"], {**env, "LAKECDC_FAULT": "after_mirror_merge:1"})
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert DeltaTable(mirror).version() == before + 1
    first = json.loads(DeltaTable(mirror).history(1)[0]["userMetadata"])
    assert (first["part"], first.get("partial")) == (0, True)
    held = mirror_rows(config, added=False)
    assert (-1, k2) in held and (-2, k2) not in held        # killed between the two parts

    again = cli_here(["mirrors", "--once"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    written = DeltaTable(mirror).history(DeltaTable(mirror).version() - before - 1)
    assert [json.loads(c["userMetadata"])["part"] for c in written] == [1]
    assert first["batch_id"] == json.loads(written[0]["userMetadata"])["batch_id"]
    assert_mirror_is_source(source_db, config)
    assert mirror_rows(config, added=False)[(-2, k2)][-1] is not None     # the body kept


def assert_sql_through_a_catalog_is_current_and_read_only(config, spark, count: int) -> None:
    """``lakecdc sql``'s names with a catalog (``use_tables``), the mirror registered in a
    schema of this session's catalog: its name gives the table with its tail laid over it
    (``count`` rows, the source's), and a DELETE through the name is refused, the mirror
    unchanged."""
    from deltalake import DeltaTable

    from core.catalog_names import Catalog
    from core.errors import UserError
    from pipelines.observe.query import run_query, use_tables

    schema = f"t_{config.slot}"
    named = config.with_(catalog="spark_catalog", catalog_schema=schema)
    mirror = mirror_path(config.lakehouse, TABLE)
    version = DeltaTable(mirror).version()
    spark.sql(f"CREATE SCHEMA `{schema}`")
    try:
        Catalog.from_config(spark, named).register("silver_public_typed_rows", mirror)
        assert "silver_public_typed_rows" in use_tables(spark, named)
        assert run_query(spark, "SELECT count(*) AS n FROM silver_public_typed_rows"
                         ).first().n == count
        with pytest.raises(UserError, match="never changes a table"):
            run_query(spark, "DELETE FROM silver_public_typed_rows")
        with pytest.raises(UserError, match="never changes a table"):
            run_query(spark, f"DELETE FROM spark_catalog.`{schema}`.silver_public_typed_rows")
    finally:
        spark.catalog.dropTempView("silver_public_typed_rows")
        spark.sql("USE spark_catalog.default")
        spark.sql(f"DROP SCHEMA `{schema}` CASCADE")
    assert DeltaTable(mirror).version() == version


def test_a_tail_holds_a_batch_over_its_table_until_drained_and_a_replay_appends_nothing(
        source_db, config, cli_here, tmp_path, spark):
    """A mirror keeping its batches in a tail (``LAKECDC_MIRROR_MERGE_S=0``, as a big
    table's does): killed right after the tail took a batch, the mirror's table has not
    changed and the table with its tail laid over it equals the source, read by delta-rs
    (``read_mirror``) and by Spark (``current_mirror``, as ``lakecdc sql`` reads it).
    The next start replays the batch: the tail's app transaction skips it, and the end of
    the run drains the tail into the table, which then equals the source by itself. The
    negative control: with the guard off, the replay appends the batch to the tail again."""
    import json

    from deltalake import DeltaTable

    from silver.mirrors.tail import tail_path

    env = mirrored_after_one_run(source_db, config, cli_here, seed=41, rounds=15)
    env = {**env, "LAKECDC_MIRROR_MERGE_S": "0"}
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET big = big + 1")     # the TOASTed body left out
        conn.execute("DELETE FROM typed_rows WHERE k1 % 3 = 0")
        conn.execute(INSERT, values(random.Random(42), 5, "new"))
    for stage in (["ship", "--once"], ["stream", "--once"]):
        assert cli_here(stage, env).returncode == 0
    mirror = mirror_path(config.lakehouse, TABLE)
    tail = tail_path(mirror)
    before = DeltaTable(mirror).version()
    checkpoint = f"{config.lakehouse}/_checkpoints/mirrors"
    saved = tmp_path / "mirrors-checkpoint"
    shutil.copytree(checkpoint, saved)

    killed = run_cli(["mirrors", "--once"], {**env, "LAKECDC_FAULT": "after_mirror_merge:1"})
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert DeltaTable(mirror).version() == before               # the table waits
    with pytest.raises(AssertionError):
        assert_mirror_is_source(source_db, config)
    assert_mirror_is_source(source_db, config, tail=True)
    assert_mirror_is_source(source_db, config, tail=True, spark=spark)
    with source_db.connect() as conn:
        count = conn.execute("SELECT count(*) FROM typed_rows").fetchone()[0]
    assert count != len(mirror_rows(config, added=False))
    assert_sql_through_a_catalog_is_current_and_read_only(config, spark, count)
    listed = cli_here(["tables"], env)                          # its rows: the current ones
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert next(ln for ln in listed.stdout.splitlines()
                if ln.startswith(TABLE)).split()[6] == f"{count:,}", listed.stdout
    taken = DeltaTable(tail).version()

    def appended_since(version: int) -> list[dict]:
        table = DeltaTable(tail)
        return [m for c in table.history(table.version() - version)
                if "batch_id" in (m := json.loads(c.get("userMetadata") or "{}"))]

    again = cli_here(["mirrors", "--once"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert appended_since(taken) == []                          # the replay: skipped
    assert DeltaTable(tail).to_pyarrow_table().num_rows == 0    # drained
    assert_mirror_is_source(source_db, config)
    drained = json.loads(DeltaTable(mirror).history(1)[0]["userMetadata"])
    assert "batch_id" in drained and not drained.get("partial"), drained

    shutil.rmtree(checkpoint)
    shutil.copytree(saved, checkpoint)                          # the batch runs again
    unguarded = cli_here(["mirrors", "--once"],
                         {**env, "LAKECDC_UNSAFE_DISABLE_GUARDS": "mirror_txn"})
    assert unguarded.returncode == 0, unguarded.stderr[-3000:]
    assert len(appended_since(taken)) == 1                      # appended a second time
    assert_mirror_is_source(source_db, config)

    # A tail left by a kill, then the Spark writer (``LAKECDC_WRITER=spark``), which keeps
    # no tail: it drains the tail first, and its replay guard skips the batch drained.
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET small = small - 1")
    for stage in (["ship", "--once"], ["stream", "--once"]):
        assert cli_here(stage, env).returncode == 0
    killed = run_cli(["mirrors", "--once"], {**env, "LAKECDC_FAULT": "after_mirror_merge:1"})
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert DeltaTable(tail).to_pyarrow_table().num_rows > 0
    by_spark = cli_here(["mirrors", "--once"], {**env, "LAKECDC_WRITER": "spark"})
    assert by_spark.returncode == 0, by_spark.stderr[-3000:]
    assert DeltaTable(tail).to_pyarrow_table().num_rows == 0
    assert_mirror_is_source(source_db, config)


def test_mirrors_before_silver_exists_is_one_sentence(source_db, config, cli_here):
    from tests.tests_support import error_line

    env = {**cli_env(config), **MIRRORED}
    with source_db.connect() as conn:
        conn.execute(SCHEMA_SQL)
    assert run_cli(["setup"], env).returncode == 0
    line = error_line(cli_here(["mirrors", "--once"], env), "no silver table",
                      "lakecdc stream")
    assert "silver/changes" in line
    bad = error_line(cli_here(["mirrors", "--once", "--accept-errors-upto", "x"], env),
                     "--accept-errors-upto")
    assert "0/4A3F2C0" in bad


@pytest.mark.long
def test_verify_checks_each_mirror_against_its_source_under_traffic_and_names_a_changed_row(
        source_db, config, cli_here):
    """``verify`` while traffic goes on: changes straddle its point, so the mirror is
    compared with the source at the point plus verify's own netting of the changes after it -
    here as a big table is (``--sample-above 0``): its every key, and a sample of its rows
    (the whole table, sized so) compared column by column. Then one row of the mirror is
    changed behind lakecdc's back: exit 1, naming the table and the row's key. Last, with a
    sample of some of the rows, a row the source never had and a column changed in every
    row: exactly the sample's rows and that key differ."""
    import threading

    import psycopg
    from deltalake import DeltaTable

    rng = random.Random(99)
    with source_db.connect() as conn:
        conn.execute(SCHEMA_SQL)
        traffic(conn, rng, 30)
    env = {**cli_env(config), **MIRRORED}
    setup = cli_here(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    # The float and numeric columns, whose NaN and ±Infinity wal2json 2.5 prints as null.
    assert "public.typed_rows: NaN and ±Infinity in price, exact, ratio, score arrive as " \
           "NULL" in setup.stdout, setup.stdout
    with source_db.connect() as conn:
        traffic(conn, rng, 30)
    assert cli_here(["run", "--once"], env).returncode == 0
    stop, rounds = threading.Event(), []

    def churn():       # a few seconds of changes while verify takes its point
        with psycopg.connect(source_db.dsn, autocommit=True) as conn:
            churned = random.Random(5)
            while not stop.is_set() and len(rounds) < 40:
                traffic(conn, churned, 1)
                rounds.append(1)
                stop.wait(0.2)
    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        verified = cli_here(["verify", "--sample-above", "0", "--sample-rows", "100000"], env)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert len(rounds) > 3, rounds
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    line = next(ln for ln in verified.stdout.splitlines() if ln.startswith(f"mirror {TABLE}:"))
    # The sample is every row at the point (rows the churn added after it are not in it).
    every = re.search(r"exact, ([\d,]+) rows \(every key; ([\d,]+) rows? of a sample", line)
    assert every and 0 < int(every.group(2)) <= int(every.group(1)), line

    # Verify compares a mirror as of its newest lakecdc commit: the churn still on its way is
    # merged first, then a row is changed behind the pipeline's back, then another row of the
    # source changes, so the mirror's next commit comes after the tampered one. Two rows
    # hold NaN and ±Infinity, which reach the mirror as NULL: a known loss, counted apart.
    with source_db.connect() as conn:
        for k1, special in ((-1, "NaN"), (-2, "-Infinity")):
            conn.execute("INSERT INTO typed_rows (k1, k2, exact, score, ratio) VALUES "
                         "(%s, 'nan', %s, %s, 'Infinity')", [k1, special, special])
    assert cli_here(["run", "--once"], env).returncode == 0
    mirror = DeltaTable(mirror_path(config.lakehouse, TABLE))
    k1, k2 = next((r["k1"], r["k2"]) for r in mirror.to_pyarrow_table(
        columns=["k1", "k2"]).to_pylist())
    mirror.update(updates={"label": "'changed'"}, predicate=f"k1 = {k1} AND k2 = '{k2}'")
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET big = big + 1 WHERE (k1, k2) = (SELECT k1, k2 "
                     "FROM typed_rows WHERE NOT (k1 = %s AND k2 = %s) LIMIT 1)", [k1, k2])
    drift = cli_here(["verify"], env)
    assert drift.returncode == 1, drift.stdout[-3000:] + drift.stderr[-3000:]
    line = next(ln for ln in drift.stdout.splitlines() if ln.startswith(f"mirror {TABLE}:"))
    assert "2 rows differ" in line and f"keys: {k1}, {k2}" in line, line
    assert "known loss: 2 rows of the source held NaN or ±Infinity" in line, line
    assert "the mirror of public.typed_rows on 2 rows" in drift.stderr, drift.stderr

    # A row the source never had, and every row's label changed: committed as the mirrors'
    # own commits (verify compares a mirror as of its newest), holding what it held.
    import pyarrow as pa
    from deltalake import write_deltalake

    from core.commits import commit_metadata, parse_commit_metadata
    from core.engine.delta_rs import rs_commit

    mirror = DeltaTable(mirror_path(config.lakehouse, TABLE))
    held = next(m for m in (parse_commit_metadata(h.get("userMetadata"), "mirror")
                            for h in mirror.history()) if m and not m.get("partial"))
    commit = rs_commit(commit_metadata("mirror", **held))
    stray = mirror.to_pyarrow_table().slice(0, 1)
    stray = stray.set_column(stray.schema.get_field_index("k1"), "k1",
                             pa.array([-999], stray.schema.field("k1").type))
    write_deltalake(mirror.table_uri, stray, mode="append", commit_properties=commit)
    DeltaTable(mirror.table_uri).update(updates={"label": "'tampered'"}, commit_properties=commit)
    sampled = cli_here(["verify", "--sample-above", "0", "--sample-rows", "20"], env)
    assert sampled.returncode == 1, sampled.stdout[-3000:] + sampled.stderr[-3000:]
    line = next(ln for ln in sampled.stdout.splitlines() if ln.startswith(f"mirror {TABLE}:"))
    found = re.search(r"([\d,]+) rows? differ from the source's ([\d,]+) rows \(every key; "
                      r"([\d,]+) rows? of a sample", line)
    assert found, line
    differ, rows, sample = (int(found.group(i).replace(",", "")) for i in (1, 2, 3))
    assert 0 < sample < rows and differ == sample + 1, line


def test_the_dashboard_and_lakecdc_tables_show_where_the_mirrors_are_complete(
        source_db, config, cli_here):
    """After a batch, the mirrors' query records the newest source transaction every mirror
    holds whole (``lakecdc_layer_progress``, layer ``mirrors``), and ``lakecdc tables``
    shows it. Its LSN is at least the last source transaction's: the WAL position read from
    the source before that transaction began. A dashboard whose table predates the row
    keeps the mirrors running and says, once, what its owner runs."""
    import psycopg

    from core.lsn import fmt
    from pipelines.run.mirror_progress import UPGRADE_SQL

    env = mirrored_after_one_run(source_db, config, cli_here, seed=5, rounds=10)
    with source_db.connect() as conn:
        before = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()[0]
        started = dt.datetime.now(dt.timezone.utc)
        conn.execute("UPDATE typed_rows SET small = small + 1")
    assert cli_here(["run", "--once"], env).returncode == 0
    assert_mirror_is_source(source_db, config)

    def mark():
        with psycopg.connect(config.dashboard, autocommit=True) as dash:
            return dash.execute("SELECT source_commit_lsn, source_commit_ts FROM "
                                "lakecdc_layer_progress WHERE layer = 'mirrors'").fetchone()
    lsn, at = mark()
    assert lsn > before and at >= started - dt.timedelta(seconds=1)
    listed = cli_here(["tables"], env)
    assert listed.returncode == 0
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(TABLE))
    assert fmt(lsn) in line

    with psycopg.connect(config.dashboard, autocommit=True) as dash:    # an older dashboard
        dash.execute("DELETE FROM lakecdc_layer_progress WHERE layer = 'mirrors'")
        dash.execute("ALTER TABLE lakecdc_layer_progress DROP CONSTRAINT "
                     "lakecdc_layer_progress_layer_check, ADD CONSTRAINT "
                     "lakecdc_layer_progress_layer_check CHECK (layer IN ('bronze', 'silver', "
                     "'gold', 'dashboard'))")
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET small = small + 1")
    older = cli_here(["run", "--once"], env)
    assert older.returncode == 0 and "predates the mirrors' row" in older.stderr
    assert mark() is None
    assert_mirror_is_source(source_db, config)
    with psycopg.connect(config.dashboard, autocommit=True) as dash:    # its owner upgrades
        dash.execute(UPGRADE_SQL)
    with source_db.connect() as conn:
        conn.execute("UPDATE typed_rows SET small = small + 1")
    assert cli_here(["run", "--once"], env).returncode == 0
    assert mark()[0] > lsn


def test_a_table_loaded_by_tables_add_holds_every_type_as_its_changes_do(
        source_db, config, cli_here):
    """``typed_rows`` (a column of every mapped type: bytea and ``integer[]`` / ``text[]``
    typed by Spark, the others parsed by Arrow), 120 rows, added while a shipper runs and
    loaded in chunks of 37. Then traffic on it - TOASTed bodies left alone and rewritten,
    key changes, deletes - and a drain: the mirror equals the source, every row and
    column, so the loaded values and the changes applied over them agree."""
    from pipelines.setup.prepare import setup
    from tests.tests_support import running_shipper

    rng = random.Random(38)
    with source_db.connect() as conn:
        conn.execute(SCHEMA_SQL)
        for i in range(120):
            conn.execute(INSERT, values(rng, i, rng.choice(["x", "y", "z z", "it's"])))
    setup(config)
    env = {**cli_env(config), "LAKECDC_MIRRORS": "all"}
    with running_shipper(config):
        added = cli_here(["tables", "add", TABLE, "--chunk-rows", "37"], env)
        assert added.returncode == 0, added.stderr[-3000:]
        assert "its 120 current rows loaded" in added.stdout, added.stdout
        assert "(4 chunks)" in added.stdout, added.stdout
    assert_mirror_is_source(source_db, config)          # as loaded: no change since
    with source_db.connect() as conn:
        traffic(conn, rng, 60)
    drained = cli_here(["run", "--once"], env)
    assert drained.returncode == 0, drained.stderr[-3000:]
    assert_mirror_is_source(source_db, config)
    # SQL on the typed mirror without a JVM (delta-rs's DataFusion) over an enum, a numeric
    # and a timestamp without time zone, against the same aggregate in Postgres.
    query = ("SELECT state, count(*) AS n, sum(price) AS total, min(seen) AS first_seen "
             "FROM {} GROUP BY state ORDER BY state")
    answered = cli_here(["sql", "--engine", "delta-rs", "--format", "json",
                         query.format("silver_public_typed_rows")], env)
    assert answered.returncode == 0, answered.stderr[-3000:]
    with source_db.connect() as conn:
        truth = conn.execute(query.format("typed_rows").replace("state,", "state::text,", 1)
                             .replace("BY state ORDER BY state", "BY 1 ORDER BY 1")).fetchall()
    assert [tuple(json.loads(line).values()) for line in answered.stdout.splitlines()] == \
        [tuple(str(v) if not isinstance(v, (int, str)) else v for v in row) for row in truth]

