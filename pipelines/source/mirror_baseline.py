"""Every row a captured table held at a consistent point, as text: ``lakecdc verify``'s truth
for the mirrors (``pipelines.verify.reconcile``), read inside its temporary slot's exported
snapshot and kept in ``<lakehouse>/_verify`` (written without Spark, the consistent point
as a Delta app transaction). A lakehouse set up before ``setup`` loaded mirrors by chunks
(``pipelines.setup.mirror_load``) holds such rows in
``<lakehouse>/silver/_mirror_baselines/<schema>/<table>`` too: a mirror starts from them
once (``pipelines.run.mirrors.seed_mirror``).

Each value is read as the text wal2json prints for it, so a row from here and a row from
the WAL convert alike (``silver.mirror_types``): the type's output, bytea as hex digits, and
a ``NaN``/``±Infinity`` as NULL where the mirror gets NULL
(``silver.mirror_type_map.loses_specials``: every one where the slot's wal2json prints
numbers as JSON, as 2.5 does; with numbers as text, a decimal's NaN). The rows that held
such a value are counted as they are read (``Baseline.lost``): the known loss, reported
apart from drift.
The read is chunked through a server-side cursor: memory is bounded by a chunk, not a table
- except with ``LAKECDC_WRITER=spark``, where a table's rows are collected and written
through Spark in one commit (``core.spark_writes``; the consistent point then also in the
commit's lakecdc metadata, layer ``mirror_baseline``): one table's text rows are held in
memory there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import psycopg
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from psycopg import sql

from bronze.backfill_source import BYTEA, NOT_A_NUMBER, NUMBER_TYPES
from core.commits import commit_metadata, newest, read_commits
from core.layout import mirror_baseline_path
from silver.mirror_type_map import loses_specials

APP_ID = "lakecdc-mirror-baseline"
LAYER = "mirror_baseline"       # its commits' lakecdc metadata (``core.commits``)
CHUNK_ROWS = 10_000



@dataclass(frozen=True)
class Baseline:
    rows: int
    lost: int       # rows holding a NaN or ±Infinity read as NULL (``loses_specials``)


def column_texts(conn: psycopg.Connection, table: str, numbers_as_text: bool = False
                 ) -> tuple[list[tuple[str, sql.Composable]], sql.Composable]:
    """(name, the SQL giving its value as wal2json's text) per column, in attribute order;
    and the SQL telling whether a row holds a value its mirror loses (NaN, ±Infinity).
    ``numbers_as_text``: how the slot's wal2json prints numbers."""
    schema, name = table.split(".", 1)
    rows = conn.execute("""
        SELECT a.attname, a.atttypid::int8, format_type(a.atttypid, a.atttypmod)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum""", [schema, name]).fetchall()
    out, lossy = [], []
    not_a_number = sql.SQL(", ").join(sql.Literal(v) for v in NOT_A_NUMBER)
    for column, type_oid, pg_type in rows:
        c = sql.Identifier(column)
        if loses_specials(pg_type, numbers_as_text):
            text = sql.SQL("CASE WHEN {c}::text IN ({n}) THEN NULL "
                           "ELSE {c}::text END").format(c=c, n=not_a_number)
            lossy.append(sql.SQL("coalesce({c}::text IN ({n}), false)").format(
                c=c, n=not_a_number))
        elif type_oid in NUMBER_TYPES:
            text = sql.SQL("{}::text").format(c)
        elif type_oid == BYTEA:
            text = sql.SQL("encode({}, 'hex')").format(c)
        else:   # the type's output function (a cast to text would trim char(n)'s padding)
            text = sql.SQL("CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END").format(c=c)
        out.append((column, text))
    return out, sql.SQL(" OR ").join(lossy) if lossy else sql.SQL("false")


def _chunks(conn: psycopg.Connection, table: str,
            columns: list[tuple[str, sql.Composable]], lost: sql.Composable,
            schema: pa.Schema) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The rows as text, a chunk at a time, each with how many of its rows lost a value."""
    query = sql.SQL("SELECT {}, {} FROM {}").format(
        sql.SQL(", ").join(text for _, text in columns), lost,
        sql.Identifier(*table.split(".", 1)))
    with conn.cursor(name="lakecdc_mirror_baseline") as cursor:
        cursor.execute(query)
        while rows := cursor.fetchmany(CHUNK_ROWS):
            yield pa.RecordBatch.from_arrays(
                [pa.array([r[i] for r in rows], pa.string()) for i in range(len(columns))],
                schema=schema), sum(1 for r in rows if r[-1])


def write_baselines(dsn: str, snapshot_name: str, tables: tuple[str, ...], lakehouse: str,
                    commit_lsn: int, storage_options: dict | None = None, writes=None,
                    numbers_as_text: bool = False) -> dict[str, Baseline]:
    """Read every table in ``tables`` inside the exported snapshot and replace its baseline
    (one commit each, app transaction ``commit_lsn``; through ``writes``, a
    ``core.spark_writes.SparkWrites``, when given); returns what each held.
    ``numbers_as_text``: how the slot's wal2json prints numbers (``column_texts``)."""
    from core.postgres import connect

    written = {}
    with connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        for table in tables:
            columns, lost = column_texts(conn, table, numbers_as_text)
            schema = pa.schema([pa.field(n, pa.string()) for n, _ in columns])
            count = lossy = 0

            def counted(chunks):
                nonlocal count, lossy
                for batch, lost_rows in chunks:
                    count += batch.num_rows
                    lossy += lost_rows
                    yield batch

            reader = pa.RecordBatchReader.from_batches(
                schema, counted(_chunks(conn, table, columns, lost, schema)))
            if writes is not None:
                path = _spark_path(mirror_baseline_path(lakehouse, table))
                writes.create(path, schema)
                writes.append(path, reader.read_all(), overwrite=True,
                              app=(APP_ID, commit_lsn),
                              meta=commit_metadata(LAYER, commit_lsn=commit_lsn))
            else:
                write_deltalake(mirror_baseline_path(lakehouse, table), reader,
                                mode="overwrite", schema_mode="overwrite",
                                storage_options=storage_options,
                                commit_properties=CommitProperties(
                                    app_transactions=[Transaction(APP_ID, commit_lsn)]))
            written[table] = Baseline(count, lossy)
        conn.rollback()
    return written


def baseline_point(lakehouse: str, table: str, storage_options: dict | None = None,
                   spark=None) -> int | None:
    """The consistent point of ``table``'s baseline, or None if it has none (read through
    ``spark`` when given)."""
    uri = mirror_baseline_path(lakehouse, table)
    if spark is not None:
        meta = newest(read_commits(spark, _spark_path(uri), LAYER, limit=20))
        return None if meta is None else int(meta["commit_lsn"])
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return None
    return DeltaTable(uri, storage_options=storage_options).transaction_version(APP_ID)


def _spark_path(uri: str) -> str:
    from core.storage import on_databricks, spark_path

    return spark_path(uri, on_databricks())
