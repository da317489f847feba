"""The Delta table features lakecdc's tables may use, and the one way lakecdc opens a table
with delta-rs (``open_table``), which refuses a table using any other.

lakecdc reads and writes its tables with delta-rs as well as with Spark. A table Spark
creates takes the session's defaults (``spark.databricks.delta.properties.defaults.*``,
which Databricks workspaces set, for deletion vectors above all), and an ``ALTER TABLE``
can add a feature later. delta-rs 1.6 handles some of them wrongly rather than not at all
(measured 2026-11-28, tables made by Spark 4.1 with delta-spark 4.4):

- column mapping (``delta.columnMapping.mode`` name or id) without deletion vectors: its
  Arrow reads (``to_pyarrow_table``) return NULL in every column, with no error; so did
  the push's read of gold (issue 37);
- deletion vectors: its Arrow reads refuse the table;
- row tracking, domain metadata: its writers refuse to commit.

So every table lakecdc creates with Spark states these off (``PLAIN``, ``core.tables``),
and ``open_table`` refuses any table outside ``READER_FEATURES`` / ``WRITER_FEATURES``
or with column mapping, with one sentence (exit 2), before a row is read or written.
"""

from __future__ import annotations

from deltalake import DeltaTable

from core.errors import UserError

# Stated by every table lakecdc creates with Spark, over any session default.
PLAIN = {"delta.enableDeletionVectors": "false",
         "delta.columnMapping.mode": "none",
         "delta.enableRowTracking": "false",
         "delta.enableTypeWidening": "false",
         "delta.checkpointPolicy": "classic"}
# The table features (Delta's protocol) delta-rs reads and writes right, among those
# lakecdc's tables have: change data (gold), append-only (bronze, silver), constraints.
READER_FEATURES = frozenset({"timestampNtz"})
WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                             "generatedColumns", "timestampNtz"})


def unreadable(table: DeltaTable) -> list[str]:
    """The features of ``table`` that delta-rs would read or write wrongly; [] if none."""
    protocol = table.protocol()
    found = set(protocol.reader_features or ()) - READER_FEATURES
    found |= set(protocol.writer_features or ()) - WRITER_FEATURES
    if table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
        found.add("columnMapping")
    return sorted(found)


def open_table(uri: str, storage_options: dict | None = None, *,
               version: int | None = None) -> DeltaTable:
    """delta-rs's handle on the table at ``uri`` (at ``version``: None, the newest);
    ``UserError`` if the table uses a feature outside lakecdc's (``unreadable``)."""
    table = DeltaTable(uri, version=version, storage_options=storage_options)
    found = unreadable(table)
    if found:
        raise UserError(
            f"the Delta table at {uri} uses table features lakecdc cannot read or write "
            f"with delta-rs ({', '.join(found)}), probably from a workspace default "
            "(spark.databricks.delta.properties.defaults.*) or an ALTER TABLE: drop them "
            "(ALTER TABLE ... DROP FEATURE) or set the table up again (docs/databricks.md, "
            "\"Workspace defaults\").")
    return table
