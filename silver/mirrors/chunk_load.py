"""A table's current rows as its mirror holds them, read by key-range chunks with Postgres's
``COPY`` (``pipelines.setup.mirror_loader`` runs the load; docs/source-tables.md, "Adding and
removing tables while running").

Postgres renders each column so that Arrow's CSV reader parses it straight into the
mirror's type (``silver.mirrors.type_map``), with the values the change stream gives:

- integers, floats, booleans, decimals and text as the type's own text output (what
  wal2json prints too); NaN and ±Infinity as NULL where the stream gives NULL
  (``silver.mirrors.type_map.loses_specials``: always with wal2json 2.5, only a decimal's NaN
  with numbers printed as text);
- timestamps as their own ISO text, in the reading session's zone, UTC (``READ_SETTINGS``:
  ``+00``), which Arrow's CSV reader parses exactly to the microsecond; a year past 9999,
  BC or ``infinity`` does not parse, and stops the load with one sentence, as such a value
  stops the mirrors' typing of the change stream (``silver.mirrors.arrow_types``); dates
  as days since the epoch;
- bytea (as its hex digits, as wal2json prints it) and arrays that the mirror holds typed
  go through ``silver.mirrors.typed_rows.typed_texts`` (Spark's typing, the one implementation of
  ``silver.mirrors.mirror_types``): the only columns that need a Spark session. Nothing else here
  imports Spark, so ``setup`` and ``tables add`` run without it.

Each chunk's query is one statement, so it reads one snapshot, for as long as the chunk
takes: the load never holds a snapshot for the whole table. Pure functions here: the query,
and the parse of what it returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv
from psycopg import sql

from silver.mirrors.mirror_table import COMMIT_LSN, COMMIT_TS
from silver.mirrors.type_map import kind_arrow, loses_specials, mirror_kind

_AS_IS = ("int", "long", "float", "double", "boolean", "string", "timestamp",
          "timestamp_ntz")
# The reading session's settings that fix how Postgres prints a timestamp: ISO, in UTC.
READ_SETTINGS = {"DateStyle": "ISO", "TimeZone": "UTC"}


@dataclass(frozen=True)
class LoadColumn:
    """One mirror column as a chunk reads it: the expression Postgres renders, the Arrow
    type the CSV reader parses it as, and the Arrow type the mirror holds (None for the
    ones Spark types from their text: ``typed``)."""

    name: str
    pg_type: str
    expression: sql.Composable
    read_as: pa.DataType
    final: pa.DataType | None          # None: typed by Spark from the text

    @property
    def typed(self) -> bool:
        return self.final is None


def load_column(name: str, pg_type: str, numbers_as_text: bool = False) -> LoadColumn:
    """How column ``name`` of Postgres type ``pg_type`` (as wal2json names it) is read;
    ``numbers_as_text``: how the slot's wal2json prints numbers (``loses_specials``)."""
    c = sql.SQL("t.{}").format(sql.Identifier(name))
    kind = mirror_kind(pg_type)
    if loses_specials(pg_type, numbers_as_text):   # NaN and ±Infinity: NULL, as the stream
        c = sql.SQL("CASE WHEN {c}::text IN ('NaN', 'Infinity', '-Infinity') THEN NULL "
                    "ELSE {c} END").format(c=c)
    if kind[0] == "date":
        return LoadColumn(name, pg_type, sql.SQL("({} - DATE '1970-01-01')").format(c),
                          pa.int32(), pa.date32())
    if kind[0] == "decimal" or kind[0] in _AS_IS:
        return LoadColumn(name, pg_type, c, kind_arrow(kind), kind_arrow(kind))
    if kind[0] == "binary":              # its hex digits, as wal2json prints them
        c = sql.SQL("encode({}, 'hex')").format(c)
    return LoadColumn(name, pg_type, c, pa.string(), None)


def chunk_end(schema: str, table: str, key: tuple[str, ...], after: list[str] | None,
              rows: int) -> sql.Composed:
    """The texts of the key ``rows`` rows after the key whose texts are ``after`` (from
    the first row: None): where a chunk of ``rows`` rows ends, read from the key's index
    alone. No row: the rest of the table is one chunk."""
    keys = [sql.SQL("t.{}").format(sql.Identifier(k)) for k in key]
    return sql.SQL("SELECT {texts} FROM {table} AS t{where} ORDER BY {order} OFFSET {skip} "
                   "LIMIT 1").format(
        texts=sql.SQL(", ").join(sql.SQL("format('%s', {})").format(k) for k in keys),
        table=sql.Identifier(schema, table), where=_range(keys, after, None),
        order=sql.SQL(", ").join(keys), skip=sql.Literal(int(rows) - 1))


def chunk_copy(schema: str, table: str, columns: list[LoadColumn], key: tuple[str, ...],
               after: list[str] | None, end: list[str] | None) -> sql.Composed:
    """``COPY`` of the rows of ``schema.table`` whose key is after the key whose columns'
    texts are ``after`` (from the first row: None) and at most the one of ``end`` (to the
    last row: None), as CSV. A composite key is compared as a row, in its index's order;
    the texts are literals of no type, so Postgres reads them as the key's own types."""
    keys = [sql.SQL("t.{}").format(sql.Identifier(k)) for k in key]
    return sql.SQL("COPY (SELECT {columns} FROM {table} AS t{where}) TO STDOUT "
                   "(FORMAT csv)").format(
        columns=sql.SQL(", ").join(c.expression for c in columns),
        table=sql.Identifier(schema, table), where=_range(keys, after, end))


def _range(keys: list[sql.Composable], after: list[str] | None,
           end: list[str] | None) -> sql.Composable:
    row = sql.SQL("({})").format(sql.SQL(", ").join(keys))
    bounds = [sql.SQL("{} > ({})").format(row, sql.SQL(", ").join(map(sql.Literal, after)))
              if after is not None else None,
              sql.SQL("{} <= ({})").format(row, sql.SQL(", ").join(map(sql.Literal, end)))
              if end is not None else None]
    bounds = [b for b in bounds if b is not None]
    return sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(bounds)) if bounds \
        else sql.SQL("")


def parse_chunk(data: bytes, columns: list[LoadColumn]) -> pa.Table:
    """A chunk's CSV (``chunk_copy``) as Arrow: the columns in their mirror types (but
    those Spark types, left as text) and ``COMMIT_LSN`` / ``COMMIT_TS`` NULL (the rows'
    last change is not known: as a mirror's initial rows). Text that does not parse raises
    ``pa.ArrowInvalid``."""
    types = {c.name: c.read_as for c in columns}
    if not data:
        read = pa.table({n: pa.array([], t) for n, t in types.items()})
    else:
        read = pv.read_csv(
            pa.BufferReader(data),
            read_options=pv.ReadOptions(column_names=list(types), block_size=8 << 20),
            parse_options=pv.ParseOptions(newlines_in_values=True),
            convert_options=pv.ConvertOptions(
                column_types=types, null_values=[""], strings_can_be_null=True,
                quoted_strings_can_be_null=False, true_values=["t"], false_values=["f"]))
    out = {}
    for c in columns:
        values = read[c.name]
        out[c.name] = values if c.final is None or values.type == c.final \
            else pc.cast(values, c.final)
    out[COMMIT_LSN] = pa.nulls(read.num_rows, pa.int64())
    out[COMMIT_TS] = pa.nulls(read.num_rows, pa.timestamp("us", tz="UTC"))
    return pa.table(out)
