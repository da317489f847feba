"""The Delta table features lakecdc's tables may use, and the one way lakecdc opens a table
with delta-rs (``open_table``), which refuses a table using any other.

lakecdc reads and writes its tables with delta-rs as well as with Spark. A table Spark
creates takes the session's defaults (``spark.databricks.delta.properties.defaults.*``,
which Databricks workspaces set, for deletion vectors above all), and an ``ALTER TABLE``
can add a feature later. delta-rs 1.6 handles some of them wrongly rather than not at all
(measured 2026-11-28, tables made by Spark 4.1 with delta-spark 4.4):

- column mapping (``delta.columnMapping.mode`` name or id) without deletion vectors: its
  Arrow reads (``to_pyarrow_table``) return NULL in every column, with no error; so did
  the push's read of gold, where only Spark wrote it;
- deletion vectors: its Arrow reads refuse the table;
- row tracking, domain metadata: its writers refuse to commit.

So every table lakecdc creates with Spark states these off (``PLAIN``, ``core.spark_tables``),
and ``open_table`` refuses any table outside ``READER_FEATURES`` / ``WRITER_FEATURES``
or with column mapping, with one sentence (exit 2), before a row is read or written.

delta-rs itself adds features too: deltalake 1.6.6's ``alter.set_table_properties`` rewrites
the protocol of every table at reader version 3, whatever the properties (measured
2026-12-07): ``variantType`` joins its reader and writer features, ``appendOnly`` and
``invariants`` its writer features (``SET_PROPERTIES_ADDS``). A table with a ``timestamp_ntz``
column is at reader version 3: a mirror of a table with a ``timestamp`` column and the
mirror's tail. So lakecdc sets no property of such a table through delta-rs
(``properties_settable``): those tables get theirs at creation, where delta-rs works the
protocol out from the columns after the properties. A table whose ``variantType`` came
this way (``spurious``: no variant column) is refused with the command that repairs it
(``core.protocol_repair``).
"""

from __future__ import annotations

import json

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


# What deltalake 1.6.6's SET TBLPROPERTIES adds to the protocol of a table at reader version
# 3, whatever the properties set (``apply_properties_to_protocol``, in delta-rs).
SET_PROPERTIES_ADDS = frozenset({"variantType", "appendOnly", "invariants"})
_TYPE_KEYS = ("type", "elementType", "keyType", "valueType")


def unreadable(table: DeltaTable) -> list[str]:
    """The features of ``table`` that delta-rs would read or write wrongly; [] if none."""
    protocol = table.protocol()
    found = set(protocol.reader_features or ()) - READER_FEATURES
    found |= set(protocol.writer_features or ()) - WRITER_FEATURES
    if table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
        found.add("columnMapping")
    return sorted(found)


def properties_settable(table: DeltaTable) -> bool:
    """Whether delta-rs can set a property of ``table`` (``alter.set_table_properties``)
    without adding a feature outside lakecdc's: not at reader version 3, where deltalake
    1.6 adds ``SET_PROPERTIES_ADDS`` (below it, a table at writer version 7 gains
    ``appendOnly``, ``invariants`` and reader version 2, all lakecdc's)."""
    return table.protocol().min_reader_version < 3


def spurious(table: DeltaTable) -> list[str]:
    """The features of ``table`` outside lakecdc's that delta-rs's SET TBLPROPERTIES added
    and the table does not use: ``variantType`` without a variant column; [] if any other
    feature is outside lakecdc's too (that table is not one delta-rs did this to)."""
    found = unreadable(table)
    if found != ["variantType"] or _has_variant(json.loads(table.schema().to_json())):
        return []
    return found


def readable(table: DeltaTable, uri: str) -> DeltaTable:
    """``table`` (delta-rs's handle on the table at ``uri``), or ``UserError`` if it uses a
    feature outside lakecdc's (``unreadable``): one sentence saying what to do."""
    found = unreadable(table)
    if found and found == spurious(table):
        raise UserError(
            f"the Delta table at {uri} lists the table feature {found[0]} but has no variant "
            "column: deltalake 1.6 adds it when it sets a property of a table with "
            "timestamp_ntz columns, as lakecdc's maintenance once did; with "
            "`lakecdc run` stopped, run `lakecdc maintain --once`, which takes it out again.")
    if found:
        raise UserError(
            f"the Delta table at {uri} uses table features lakecdc cannot read or write "
            f"with delta-rs ({', '.join(found)}), probably from a workspace default "
            "(spark.databricks.delta.properties.defaults.*) or an ALTER TABLE: drop them "
            "(ALTER TABLE ... DROP FEATURE) or set the table up again (docs/databricks.md, "
            "\"Workspace defaults\").")
    return table


def open_table(uri: str, storage_options: dict | None = None, *,
               version: int | None = None) -> DeltaTable:
    """delta-rs's handle on the table at ``uri`` (at ``version``: None, the newest);
    ``UserError`` if the table uses a feature outside lakecdc's (``readable``)."""
    return readable(DeltaTable(uri, version=version, storage_options=storage_options), uri)


def _has_variant(node) -> bool:
    """Whether a Delta schema (its JSON, parsed) has a variant anywhere, nested too."""
    if isinstance(node, dict):
        return any(node.get(k) == "variant" for k in _TYPE_KEYS) or \
            any(_has_variant(v) for v in node.values())
    return isinstance(node, list) and any(_has_variant(v) for v in node)
