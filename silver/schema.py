"""Schemas of the silver layer: the wal2json v2 change JSON, and the silver change table.

Silver is ONE append-only table, ``silver/changes``, holding exactly one row per bronze row
(changes of every captured table, transactional and non-transactional logical messages, and
rows that failed to parse), plus ``silver/quarantine`` holding the raw JSON and error of the
rows that failed. One table rather than one per captured table because a source transaction
spans tables (an archival move inserts into ``notification_history`` and deletes from
``notifications``): gold must see every row of a transaction before applying it, which it
checks by counting rows per ``commit_lsn`` against ``tx_changes`` - possible only if every
bronze row has exactly one silver row in one table.

wal2json 2.5 writes numbers (bigint, numeric) as bare JSON numbers; every column value is
read as a string so no precision is lost, then typed where a column is used.
"""

from pyspark.sql.types import (
                               ArrayType,
                               BooleanType,
                               IntegerType,
                               LongType,
                               MapType,
                               StringType,
                               StructField,
                               StructType,
                               TimestampType,
)

from core.captured import DIMS

WAL2JSON_COLUMN = StructType([
    StructField("name", StringType()),
    StructField("type", StringType()),
    StructField("value", StringType()),
])

# The parts of a wal2json v2 row silver reads. B/C rows never reach bronze.
WAL2JSON_CHANGE = StructType([
    StructField("action", StringType()),
    StructField("schema", StringType()),
    StructField("table", StringType()),
    StructField("columns", ArrayType(WAL2JSON_COLUMN)),
    StructField("identity", ArrayType(WAL2JSON_COLUMN)),
    StructField("transactional", BooleanType()),
    StructField("prefix", StringType()),
    StructField("content", StringType()),
])


SILVER_CHANGES = StructType([
    # Key and transaction framing, copied from bronze.
    StructField("commit_lsn", LongType(), False),
    StructField("seq", IntegerType(), False),
    StructField("tx_changes", IntegerType(), False),
    StructField("xid", LongType()),
    StructField("lsn", LongType(), False),
    StructField("commit_ts", TimestampType()),
    # What happened: I, U, D, T (truncate), M (logical message), R (snapshot backfill read
    # of a row, parsed like an insert: `lakecdc backfill snapshot`); NULL when error is set.
    StructField("op", StringType()),
    StructField("schema_name", StringType()),
    StructField("table_name", StringType()),
    # New row values (I, U, R): the id and the four dims, typed as text (uuid / enum / text).
    StructField("id", StringType()),
    *[StructField(c, StringType()) for c in DIMS],
    # Old values from the replica identity (U with a key change, D); NULL otherwise.
    StructField("old_id", StringType()),
    *[StructField(f"old_{c}", StringType()) for c in DIMS],
    # Every new column value as text, for analysts and for columns added mid-stream.
    StructField("columns", MapType(StringType(), StringType())),
    # Logical messages (op M).
    StructField("message_prefix", StringType()),
    StructField("message_content", StringType()),
    # Parse failure: the error, and (in quarantine) the raw JSON.
    StructField("error", StringType()),
    StructField("shipped_at", TimestampType()),
    # Added for the mirrors (silver/tables): the replica identity's old values (U with a key
    # change or FULL identity, D) and every column's Postgres type as wal2json reports it
    # (of ``columns``, else of ``identity``). NULL on rows written before they existed.
    StructField("identity", MapType(StringType(), StringType())),
    StructField("column_types", MapType(StringType(), StringType())),
])

# Columns added to silver/changes after its first release: an older table gains them
# (``silver.writer.ensure_table``), its earlier rows NULL in them.
SILVER_ADDED = ("identity", "column_types")

SILVER_QUARANTINE = StructType([
    StructField("commit_lsn", LongType(), False),
    StructField("seq", IntegerType(), False),
    StructField("tx_changes", IntegerType(), False),
    StructField("lsn", LongType(), False),
    StructField("commit_ts", TimestampType()),
    StructField("action", StringType()),
    StructField("error", StringType(), False),
    StructField("data", StringType(), False),
    StructField("shipped_at", TimestampType()),
])
