"""``lakecdc sql``: Spark SQL on the lakehouse tables, by name.

Each layer's Delta table is registered as a temporary view named after it, at its latest
version when registered (``register_tables``):

| name                       | table                            |
|----------------------------|----------------------------------|
| ``bronze_wal2json_changes``| ``bronze/wal2json_changes``      |
| ``silver_changes``         | ``silver/changes``               |
| ``silver_quarantine``      | ``silver/quarantine``            |
| ``gold_service_stats``     | ``gold/service_stats``           |
| ``silver_<schema>_<table>``| ``silver/tables/<schema>/<table>``: the mirror of each captured table |

The same names work in notebooks (locally and on Databricks) and in the dashboard queries
under ``sql/``. For an earlier version use Delta's time travel on the path
(``docs/notebooks.md``).

With ``LAKECDC_CATALOG`` and ``LAKECDC_SCHEMA`` set, the tables are registered by these
names in that schema (``pipelines.setup.catalog``): ``use_tables`` then makes it the
session's current schema instead of making views, so the same unqualified names reach the
catalog's tables, with the catalog's grants. A mirror's tail is not in the catalog, so a
mirror that has one is shadowed by a temporary view of the same name: its table, read
through the catalog's name, with the tail laid over it. Either way the names give the
tables' current rows.

``run_query`` runs one query and nothing else: the text is taken as a subquery
(``SELECT * FROM (<text>)``), which only a query can be. A ``DELETE``, ``INSERT``,
``MERGE``, ``DROP``, ``OPTIMIZE`` or any other statement is a syntax error there and never
runs, whatever the names point at and whatever the catalog's grants would allow.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from core.errors import UserError, first_line
from core.layout import QUERYABLE, mirror_path, mirror_view_name, view_name

TABLES = {view_name(table): table for table in QUERYABLE}


def table_paths(config, spark: SparkSession | None = None) -> dict[str, str]:
    """View name → the table's path as Spark sees it (``s3a://`` for S3 off Databricks).
    Mirrors: of every table ever captured (the stored set: added ones, and removed ones,
    whose mirrors stay); ``register_tables`` passes over those that do not exist."""
    from core.spark_writes import writes_for
    from core.storage import Lakehouse, on_databricks, spark_path
    from pipelines.setup.tables import known_tables

    paths = {name: spark_path(config.table_path(where), on_databricks())
             for name, where in TABLES.items()}
    tables = known_tables(config, Lakehouse.from_config(config).delta_rs_options(),
                          writes_for(spark, config))()
    return {**paths, **{mirror_view_name(t): spark_path(mirror_path(config.lakehouse, t),
                                                         on_databricks())
                        for t in tables}}


def use_tables(spark: SparkSession, config) -> list[str]:
    """The tables by their names, unqualified, for a query or a notebook; returns the names
    there. With a catalog: its schema becomes the session's current one (the names
    registered there); without: a temporary view per table (``register_tables``)."""
    paths = table_paths(config, spark)
    if not config.registers:
        return register_tables(spark, paths)
    from core.catalog import Catalog, quoted
    from silver.mirror_store import current_mirror, tail_exists_spark

    catalog = Catalog.from_config(spark, config)
    catalog.require_schema()
    spark.sql(f"USE {quoted(config.catalog, config.catalog_schema)}")
    named = [name for name in paths if spark.catalog.tableExists(catalog.name(name))]
    for name in named:
        if name not in TABLES and tail_exists_spark(spark, paths[name]):
            current_mirror(spark, paths[name], spark.read.table(catalog.name(name))
                           ).createOrReplaceTempView(name)
    return named


def register_tables(spark: SparkSession, paths: dict[str, str]) -> list[str]:
    """Create or replace a temporary view per existing table; returns the names made. A
    mirror with a tail is its current rows, the tail as it is now laid over its table
    (``silver.mirror_store.current_mirror``)."""
    from delta.tables import DeltaTable

    from silver.mirror_store import current_mirror

    made = []
    for name, path in paths.items():
        if DeltaTable.isDeltaTable(spark, path):
            current_mirror(spark, path).createOrReplaceTempView(name)
            made.append(name)
    return made


def read_query(path: str) -> str:
    """The text of a ``.sql`` file, with a trailing ``;`` removed (one statement)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"cannot read the query file {path} ({exc.strerror}).") from None
    return text.strip().rstrip(";")


def run_query(spark: SparkSession, query: str) -> DataFrame:
    """Run one query, as a subquery so that nothing else can run (the module's text); a
    query the user got wrong, or a statement that is not a query, is a ``UserError``."""
    from pyspark.errors import AnalysisException, ParseException

    try:
        # Newlines: a comment ending the text must not swallow the closing parenthesis.
        return spark.sql(f"SELECT * FROM (\n{query.strip().rstrip(';')}\n) AS lakecdc_query")
    except ParseException as exc:
        raise UserError(f"the query failed: {first_line(exc)}; lakecdc sql runs one query "
                        "(SELECT, WITH, VALUES or TABLE) and never changes a table.") from None
    except AnalysisException as exc:
        raise UserError(f"the query failed: {first_line(exc)} (tables: {', '.join(TABLES)}).") from None


def render(frame: DataFrame, fmt: str = "table", limit: int = 1000) -> str:
    """At most ``limit`` rows as an aligned text table, CSV or JSON lines."""
    rows = frame.limit(limit).collect()
    columns = frame.columns
    if fmt == "json":
        return "\n".join(json.dumps(r.asDict(), default=str) for r in rows)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else v for v in r] for r in rows])
        return out.getvalue().rstrip("\n")
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    body = ["  ".join(v.rjust(w) if _numeric(r[i]) else v.ljust(w)
                      for i, (v, w) in enumerate(zip(row, widths)))
            for row, r in zip(cells, rows)]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body,
                      f"({len(rows)} row{'s' if len(rows) != 1 else ''})"])


def _cell(value) -> str:
    return "NULL" if value is None else str(value)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or \
        type(value).__name__ == "Decimal"
