"""What each captured table's mirror is created with, read from the source's catalog: its
columns (name, Postgres type) in the source's order and its key. One reading for every
creator of a mirror: the mirrors' query (``pipelines.run.mirror_query``), and ``setup`` and
``tables add`` when they register mirrors by name (``pipelines.setup.register``)."""

from __future__ import annotations

import psycopg

from bronze.source import mirror_key
from silver.mirrors.mirror_table import TableSpec
from silver.mirrors.type_map import loses_specials


def table_specs(conn: psycopg.Connection, tables: tuple[str, ...]) -> list[TableSpec]:
    """The spec of each of ``tables``; a table without a key gets an empty ``key`` (it is
    captured, not mirrored)."""
    specs = []
    for table in tables:
        columns, key = mirror_key(conn, table)
        schema, name = table.split(".", 1)
        specs.append(TableSpec(schema, name, tuple(columns), tuple(key)))
    return specs


def specials_note(spec: TableSpec, numbers_as_text: bool) -> str:
    """One sentence naming the columns of ``spec``'s table whose NaN and ±Infinity reach its
    mirror as NULL ('' if none): ``setup`` and ``tables add`` print it."""
    columns = [c for c, t in spec.columns if loses_specials(t, numbers_as_text)]
    if not columns:
        return ""
    table = spec.name
    if numbers_as_text:
        return (f"{table}: a NaN in {', '.join(columns)} reaches its mirror as NULL (a "
                "numeric with a precision is a decimal there, which has no NaN; silver keeps "
                "the text); verify counts such rows as a known loss (docs/silver.md).")
    return (f"{table}: NaN and ±Infinity in {', '.join(columns)} arrive as NULL (the "
            "source's wal2json prints them as null; 2.6 and later keep them), so silver and "
            "its mirror hold NULL there; verify counts such rows as a known loss "
            "(docs/silver.md).")
