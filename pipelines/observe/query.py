"""``lakecdc sql``: SQL on the lakehouse tables, by name, without a JVM wherever delta-rs
can answer.

Two engines answer it. **delta-rs's DataFusion** (``pipelines.observe.query_rs``, the default:
a query on gold in milliseconds, no JVM) registers each table the query names at its latest
version. **Spark** (``run_query``) answers what DataFusion cannot, and the command says why
when it turns to it (``NeedsSpark``): tables read by their catalog names (``LAKECDC_CATALOG``),
storage only Spark reaches (``LAKECDC_WRITER=spark``), a mirror with changes waiting in its
tail (only Spark lays a tail over a table in SQL here), or a query in Spark's dialect that
DataFusion cannot plan (``unix_micros``, say). A table the query names that does not exist is
one sentence on either engine, without a JVM. Spark registers each layer's Delta table as a
temporary view named after it, at its latest version when registered (``register_tables``):

| name                       | table                            |
|----------------------------|----------------------------------|
| ``bronze_wal2json_changes``| ``bronze/wal2json_changes``      |
| ``silver_changes``         | ``silver/changes``               |
| ``silver_quarantine``      | ``silver/quarantine``            |
| ``gold_service_stats``     | ``gold/service_stats``           |
| ``silver_<schema>_<table>``| ``silver/tables/<schema>/<table>``: each captured table's mirror |

The same names work in notebooks (locally and on Databricks) and in the dashboard queries
under ``sql/``. For an earlier version use Delta's time travel on the path
(``docs/notebooks.md``).

With ``LAKECDC_CATALOG`` and ``LAKECDC_SCHEMA`` set, the tables are registered by these
names in that schema (``pipelines.setup.register``): ``use_tables`` then makes it the
session's current schema instead of making views, so the same unqualified names reach the
catalog's tables, with the catalog's grants. A mirror's tail is not in the catalog, so a
mirror that has one is shadowed by a temporary view of the same name: its table, read
through the catalog's name, with the tail laid over it. Either way the names give the
tables' current rows.

Both engines run one query and nothing else: the text is taken as a subquery (``SELECT *
FROM (<text>)``), which only a query can be (DataFusion plans it so, then runs the text as
written, whose ``ORDER BY`` it would drop in a subquery). A ``DELETE``, ``INSERT``,
``MERGE``, ``DROP``, ``OPTIMIZE``, DataFusion's ``COPY … TO`` or any other statement is a
syntax error there and never runs, whatever the names point at and whatever the catalog's
grants would allow.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa

from core.errors import UserError, first_line
from core.layout import QUERYABLE, mirror_path, mirror_view_name, view_name

TABLES = {view_name(table): table for table in QUERYABLE}


class NeedsSpark(Exception):
    """Why delta-rs's SQL engine does not answer this query (a sentence)."""


def as_subquery(query: str) -> str:
    """``query`` as a subquery, which only a query can be (the module's text)."""
    # Newlines: a comment ending the text must not swallow the closing parenthesis.
    return f"SELECT * FROM (\n{query.strip().rstrip(';')}\n) AS lakecdc_query"


def table_paths(config, spark=None) -> dict[str, str]:
    """View name → the table's path as Spark sees it (``s3a://`` for S3 off Databricks).
    Mirrors: of every table ever captured (the stored set: added ones, and removed ones,
    whose mirrors stay); ``register_tables`` passes over those that do not exist."""
    from core.engine.choose import engine_for
    from core.storage import Lakehouse, on_databricks, spark_path
    from pipelines.setup.capture import known_tables

    paths = {name: spark_path(config.table_path(where), on_databricks())
             for name, where in TABLES.items()}
    tables = known_tables(config, Lakehouse.from_config(config).delta_rs_options(),
                          engine=engine_for(config, spark))()
    return {**paths, **{mirror_view_name(t): spark_path(mirror_path(config.lakehouse, t),
                                                         on_databricks())
                        for t in tables}}


def use_tables(spark, config) -> list[str]:
    """The tables by their names, unqualified, for a query or a notebook; returns the names
    there. With a catalog: its schema becomes the session's current one (the names
    registered there); without: a temporary view per table (``register_tables``)."""
    paths = table_paths(config, spark)
    if not config.registers:
        return register_tables(spark, paths)
    from core.catalog_names import Catalog, quoted
    from silver.mirrors.store_spark import current_mirror, tail_exists_spark

    catalog = Catalog.from_config(spark, config)
    catalog.require_schema()
    spark.sql(f"USE {quoted(config.catalog, config.catalog_schema)}")
    named = [name for name in paths if spark.catalog.tableExists(catalog.name(name))]
    for name in named:
        if name not in TABLES and tail_exists_spark(spark, paths[name]):
            current_mirror(spark, paths[name], spark.read.table(catalog.name(name))
                           ).createOrReplaceTempView(name)
    return named


def register_tables(spark, paths: dict[str, str]) -> list[str]:
    """Create or replace a temporary view per existing table; returns the names made. A
    mirror with a tail is its current rows, the tail as it is now laid over its table
    (``silver.mirrors.store_spark.current_mirror``)."""
    from delta.tables import DeltaTable

    from silver.mirrors.store_spark import current_mirror

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


def run_query(spark, query: str):
    """(Spark) Run one query, as a subquery so that nothing else can run (the module's
    text); a query the user got wrong, or a statement that is not a query, is a
    ``UserError``. Returns its DataFrame."""
    from pyspark.errors import AnalysisException, ParseException

    try:
        return spark.sql(as_subquery(query))
    except ParseException as exc:
        raise UserError(f"the query failed: {first_line(exc)}; lakecdc sql runs one query "
                        "(SELECT, WITH, VALUES or TABLE) and never changes a table.") from None
    except AnalysisException as exc:
        raise UserError(f"the query failed: {first_line(exc)} "
                        f"(tables: {', '.join(TABLES)}).") from None


def render(result, fmt: str = "table", limit: int = 1000) -> str:
    """At most ``limit`` rows of ``result`` (an Arrow table, or a Spark DataFrame) as an
    aligned text table, CSV or JSON lines."""
    if isinstance(result, pa.Table):
        columns = result.column_names
        rows = list(zip(*(c.to_pylist() for c in result.slice(0, limit).columns)))
    else:
        columns, rows = result.columns, result.limit(limit).collect()
    if fmt == "json":
        return "\n".join(json.dumps(dict(zip(columns, r)), default=str) for r in rows)
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
