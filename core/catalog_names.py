"""lakecdc's tables by name: ``<catalog>.<schema>.<name>``, external tables over the paths.

With ``LAKECDC_CATALOG`` and ``LAKECDC_SCHEMA`` set (docs/databricks.md, "Unity Catalog"),
each Delta table lakecdc keeps is also registered as an external table at its own path, so
analysts, notebooks and the ``sql/`` files find it by name and the catalog's grants apply.
The path stays the truth: every writer goes on writing by path, and a name only points at it.

- Registering is idempotent: a name already pointing at the table's path is left as it is.
- A name that points elsewhere (another lakehouse, a managed table, a view) is refused with
  one sentence, and is never dropped or replaced: it may hold someone else's data.
- Names live in the session's catalog, which must keep them beyond the process: Unity
  Catalog (or the workspace's Hive metastore) on Databricks, and outside it Spark's Hive
  metastore (``core.spark.get_or_create(metastore=True)``; local Spark's only catalog is
  ``spark_catalog``). Spark's in-memory catalog would forget them when the process ends, so
  it is refused (``require_persistent``).

Catalog, schema and table names are plain identifiers (``core.config.CATALOG_NAME``, the
names of ``core.layout``) and always backquoted; a location is never written into SQL text:
``Catalog.createTable`` takes it as a value.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from core.errors import UserError, first_line
from core.storage import is_remote, on_databricks


def quoted(*parts: str) -> str:
    """``a.b.c`` with each part backquoted (a backquote inside doubled)."""
    return ".".join("`" + p.replace("`", "``") + "`" for p in parts)


def location(path: str) -> str:
    """What a table registered at ``path`` is given: a local path made absolute (a relative
    one means nothing to a catalog), a URI as it is."""
    return path if is_remote(path) else os.path.abspath(path)


def same_location(a: str, b: str) -> bool:
    """Whether two spellings name one location: ``file:/x``, ``file:///x`` and ``/x`` are one
    local path; ``s3://``, ``s3a://`` and ``s3n://`` one S3 location; a trailing ``/`` counts
    for nothing. Pure."""
    return _normal(a) == _normal(b)


def _normal(uri: str) -> str:
    uri = uri.rstrip("/")
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return "file:" + os.path.normpath(parsed.path if parsed.scheme else uri)
    scheme = "s3" if parsed.scheme in ("s3a", "s3n") else parsed.scheme
    return f"{scheme}://{parsed.netloc}{os.path.normpath(parsed.path or '/')}".rstrip("/")


def require_persistent(spark) -> None:
    """Refuse a session whose catalog forgets its names when the process ends."""
    if on_databricks():
        return
    kind = spark.conf.get("spark.sql.catalogImplementation", "in-memory")
    if kind != "hive":
        raise UserError("this Spark session keeps table names in memory only, so they would "
                        "be gone when it ends: start it with Hive support "
                        "(core.spark.get_or_create(metastore=True)), or unset "
                        "LAKECDC_CATALOG and LAKECDC_SCHEMA.")


class Catalog:
    """One schema of one catalog, as lakecdc registers its tables in it."""

    def __init__(self, spark, catalog: str, schema: str) -> None:
        self.spark, self.catalog, self.schema = spark, catalog, schema

    @classmethod
    def from_config(cls, spark, config) -> "Catalog":
        return cls(spark, config.catalog, config.catalog_schema)

    def name(self, table: str) -> str:
        """``catalog.schema.table``, backquoted."""
        return quoted(self.catalog, self.schema, table)

    def require_schema(self) -> None:
        """The schema must exist: lakecdc creates tables in it, never the schema itself
        (that is the catalog owner's decision, and a privilege the job need not have)."""
        if not self.spark.catalog.databaseExists(quoted(self.catalog, self.schema)):
            raise UserError(f"schema {self.catalog}.{self.schema} (LAKECDC_CATALOG, "
                            "LAKECDC_SCHEMA) does not exist or cannot be seen: create it "
                            f"(CREATE SCHEMA {quoted(self.catalog, self.schema)}) and grant "
                            "lakecdc's principal USE CATALOG, USE SCHEMA and CREATE TABLE on "
                            "it (docs/databricks.md), then rerun.")

    def location_of(self, table: str) -> str | None:
        """Where name ``table`` points (None: no such name). A name that is not a table at a
        location (a view) is refused."""
        name = self.name(table)
        if not self.spark.catalog.tableExists(name):
            return None
        rows = self.spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
        found = [r.data_type for r in rows if r.col_name == "Location"]
        if not found:
            raise UserError(f"{self.catalog}.{self.schema}.{table} exists and is not a table at "
                            "a location (a view?): lakecdc registers its tables under that "
                            "name; drop or rename it, or register in another schema "
                            "(LAKECDC_SCHEMA).")
        return found[0]

    def check(self, table: str, path: str) -> bool:
        """Whether name ``table`` already points at ``path``; refuse it pointing elsewhere."""
        at = self.location_of(table)
        if at is None:
            return False
        if not same_location(at, location(path)):
            raise UserError(f"{self.catalog}.{self.schema}.{table} already points at {at}, not "
                            f"at this lakehouse's {location(path)}: drop that table if it is "
                            "not needed, or register this lakehouse in another schema "
                            "(LAKECDC_SCHEMA); nothing was registered.")
        return True

    def register(self, table: str, path: str) -> bool:
        """Register the Delta table at ``path`` as external table ``table``, unless the name
        points at it already; returns whether it was registered now. Refuses a name that
        points elsewhere (``check``), also when another process registered it just before."""
        from pyspark.errors import AnalysisException

        if self.check(table, path):
            return False
        try:
            self.spark.catalog.createTable(self.name(table), path=location(path),
                                           source="delta")
        except AnalysisException as exc:
            if "ALREADY_EXISTS" not in str(exc):
                raise UserError(f"cannot register {self.catalog}.{self.schema}.{table} at "
                                f"{location(path)}: {first_line(exc)}") from None
            self.check(table, path)         # registered meanwhile: it must point here
            return False
        return True
