"""What each captured table's mirror is created with, read from the source's catalog: its
columns (name, Postgres type) in the source's order and its key. One reading for every
creator of a mirror: the mirrors' query (``pipelines.run.mirrors``), and ``setup`` and
``tables add`` when they register mirrors by name (``pipelines.setup.catalog``)."""

from __future__ import annotations

import psycopg

from bronze.source import mirror_key
from silver.mirror_table import TableSpec


def table_specs(conn: psycopg.Connection, tables: tuple[str, ...]) -> list[TableSpec]:
    """The spec of each of ``tables``; a table without a key gets an empty ``key`` (it is
    captured, not mirrored)."""
    specs = []
    for table in tables:
        columns, key = mirror_key(conn, table)
        schema, name = table.split(".", 1)
        specs.append(TableSpec(schema, name, tuple(columns), tuple(key)))
    return specs
