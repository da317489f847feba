"""Every row a captured table held at a consistent point, as text: ``lakecdc verify``'s truth
for the mirrors (``pipelines.verify.reconcile``), read inside its temporary slot's exported
snapshot and kept in ``<lakehouse>/_verify`` (the consistent point as a Delta app
transaction). A lakehouse set up before ``setup`` loaded mirrors by chunks
(``pipelines.setup.mirror_loader``) holds such rows in
``<lakehouse>/silver/_mirror_baselines/<schema>/<table>`` too: a mirror starts from them
once (``pipelines.run.mirror_query.seed_mirror``).

Each value is read as the text wal2json prints for it, so a row from here and a row from
the WAL convert alike (``silver.mirrors.mirror_types``): the type's output, bytea as hex digits, and
a ``NaN``/``±Infinity`` as NULL where the mirror gets NULL
(``silver.mirrors.type_map.loses_specials``: every one where the slot's wal2json prints
numbers as JSON, as 2.5 does; with numbers as text, a decimal's NaN). The rows that held
such a value are counted as they are read (``Baseline.lost``): the known loss, reported
apart from drift.
The read is chunked through a server-side cursor: memory is bounded by a chunk, not a table
- except on Spark's engine (``LAKECDC_WRITER=spark``), where a table's rows are collected
and written in one commit (``core.engine``): one table's text rows are held in memory
there. Either way the consistent point is also the commit's lakecdc metadata (layer
``mirror_baseline``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import psycopg
import pyarrow as pa
from psycopg import sql

from bronze.backfill_source import BYTEA, NOT_A_NUMBER, NUMBER_TYPES
from bronze.source import mirror_key
from core.commits import commit_metadata
from core.engine.api import Engine
from core.engine.delta_rs import DeltaRs, rs_commit
from core.layout import mirror_baseline_path
from core.postgres import table_rows
from core.progress import ProgressBar
from silver.mirrors.type_map import loses_specials

APP_ID = "lakecdc-mirror-baseline"
LAYER = "mirror_baseline"       # its commits' lakecdc metadata (``core.commits``)
CHUNK_ROWS = 10_000


@dataclass(frozen=True)
class Sampling:
    """verify: a table the catalog estimates at more rows than ``above`` is read as its
    every key and about ``rows`` whole rows (``write_baselines``): its whole read inside
    verify's snapshot would hold the source's vacuum horizon for about a minute per 10M
    rows."""
    above: int = 1_000_000
    rows: int = 20_000


@dataclass(frozen=True)
class Baseline:
    rows: int       # rows read (where sampled: the sample's)
    lost: int       # rows holding a NaN or ±Infinity read as NULL (``loses_specials``)
    keys: int | None = None     # where sampled: the keys read, one per row (every row)


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
            schema: pa.Schema, sample: sql.Composable = sql.SQL("")
            ) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The rows as text (those ``sample``, a ``TABLESAMPLE`` clause, picks), a chunk at a
    time, each with how many of its rows lost a value."""
    query = sql.SQL("SELECT {}, {} FROM {} {}").format(
        sql.SQL(", ").join(text for _, text in columns), lost,
        sql.Identifier(*table.split(".", 1)), sample)
    with conn.cursor(name="lakecdc_mirror_baseline") as cursor:
        cursor.execute(query)
        while rows := cursor.fetchmany(CHUNK_ROWS):
            yield pa.RecordBatch.from_arrays(
                [pa.array([r[i] for r in rows], pa.string()) for i in range(len(columns))],
                schema=schema), sum(1 for r in rows if r[-1])


def keys_path(lakehouse: str, table: str) -> str:
    """Where a sampled table's every key at the point is kept (``write_baselines``)."""
    return mirror_baseline_path(lakehouse, table) + "__keys"


def write_baselines(dsn: str, snapshot_name: str, tables: tuple[str, ...], lakehouse: str,
                    commit_lsn: int, storage_options: dict | None = None,
                    engine: Engine | None = None, numbers_as_text: bool = False,
                    sampling: Sampling | None = None) -> dict[str, Baseline]:
    """Read every table in ``tables`` inside the exported snapshot and replace its baseline
    (one commit each, app transaction ``commit_lsn``; through ``engine``, None: delta-rs
    with ``storage_options``); returns what each held.
    ``numbers_as_text``: how the slot's wal2json prints numbers (``column_texts``).

    A table the catalog estimates at more than ``sampling.above`` rows is read in two parts
    instead of whole: its every key (``keys_path``, the key columns' texts), and about
    ``sampling.rows`` of its rows, each kept with the probability that gives (``TABLESAMPLE
    BERNOULLI``: another sample each run)."""
    from core.postgres import connect

    engine = engine if engine is not None else DeltaRs(storage_options)
    written = {}
    with connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        for table in tables:
            columns, lost = column_texts(conn, table, numbers_as_text)
            estimate = _estimate(conn, table)
            if sampling is None or estimate <= sampling.above:
                rows, lossy = _write(mirror_baseline_path(lakehouse, table), _texts(columns),
                                     _shown(_chunks(conn, table, columns, lost, _texts(columns)),
                                            f"verify: reading {table}", estimate),
                                     commit_lsn, engine)
                written[table] = Baseline(rows, lossy)
                continue
            key = mirror_key(conn, table)[1]
            texts = dict(columns)
            keyed = [(k, texts[k]) for k in key]
            keys, lossy = _write(keys_path(lakehouse, table), _texts(keyed),
                                 _shown(_chunks(conn, table, keyed, lost, _texts(keyed)),
                                        f"verify: reading {table}'s keys", estimate),
                                 commit_lsn, engine)
            share = min(100.0, 100.0 * sampling.rows / max(keys, 1))
            rows, _ = _write(mirror_baseline_path(lakehouse, table), _texts(columns),
                             _chunks(conn, table, columns, sql.SQL("false"), _texts(columns),
                                     sql.SQL("TABLESAMPLE BERNOULLI ({})").format(
                                         sql.Literal(share))),
                             commit_lsn, engine)
            written[table] = Baseline(rows, lossy, keys)
        conn.rollback()
    return written


def _estimate(conn: psycopg.Connection, table: str) -> int:
    """The catalog's estimate of ``table``'s rows (its count where it has none yet)."""
    estimate = table_rows(conn, table)
    if estimate is not None:
        return estimate
    name = sql.Identifier(*table.split(".", 1))
    return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(name)).fetchone()[0]


def _shown(chunks: Iterator[tuple[pa.RecordBatch, int]], what: str, total: int | None
           ) -> Iterator[tuple[pa.RecordBatch, int]]:
    """``chunks``, their rows counted on a ``core.progress.ProgressBar``."""
    with ProgressBar(what, total) as shown:
        for chunk in chunks:
            yield chunk
            shown(chunk[0].num_rows)


def _texts(columns: list[tuple[str, sql.Composable]]) -> pa.Schema:
    return pa.schema([pa.field(n, pa.string()) for n, _ in columns])


def _write(uri: str, schema: pa.Schema, chunks: Iterator[tuple[pa.RecordBatch, int]],
           commit_lsn: int, engine: Engine) -> tuple[int, int]:
    """``chunks`` as the whole table at ``uri``, in one commit (app transaction
    ``commit_lsn``) through ``engine``; returns (rows, rows that lost a value)."""
    count = lossy = 0

    def counted():
        nonlocal count, lossy
        for batch, lost_rows in chunks:
            count += batch.num_rows
            lossy += lost_rows
            yield batch

    reader = pa.RecordBatchReader.from_batches(schema, counted())
    meta = commit_metadata(LAYER, commit_lsn=commit_lsn)
    if isinstance(engine, DeltaRs):
        # delta-rs writes the chunks as they are read, so memory holds one chunk whatever
        # the table's size, and replaces the columns an earlier run's table had; an
        # engine's append takes the whole table at once.
        from deltalake import write_deltalake

        write_deltalake(uri, reader, mode="overwrite", schema_mode="overwrite",
                        storage_options=engine.storage_options,
                        commit_properties=rs_commit(meta, APP_ID, commit_lsn))
    else:
        engine.create(uri, schema)
        engine.append(uri, reader.read_all(), overwrite=True, app=(APP_ID, commit_lsn),
                      meta=meta)
    return count, lossy


def baseline_point(lakehouse: str, table: str, storage_options: dict | None = None,
                   engine: Engine | None = None) -> int | None:
    """The consistent point of ``table``'s baseline, or None if it has none (read through
    ``engine``; None: delta-rs with ``storage_options``)."""
    from pipelines.source.baseline import recorded_point

    engine = engine if engine is not None else DeltaRs(storage_options)
    return recorded_point(engine, mirror_baseline_path(lakehouse, table), APP_ID, LAYER)
