"""The exact baseline: rows that existed before the slot, counted at its consistent point.

Rows already in the source when the slot is created have no INSERT in the WAL. ``setup``
creates the slot with an exported snapshot, which sees exactly the transactions committed
before the slot's consistent point; counting inside it gives ``service_stats`` as of that
point. The counts are kept in ``<lakehouse>/gold/_baseline`` (written without Spark, with
the consistent point as a Delta app transaction) and seed gold on its first run, so the
first ``run`` on a populated database is exact.

The count is one ``GROUP BY`` in a REPEATABLE READ transaction: MVCC, so writers are not
blocked, and memory is bounded by the number of keys, not rows.
"""

from __future__ import annotations

import psycopg
import pyarrow as pa
from psycopg import sql
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from pipelines.captured import DIMS
from pipelines.source_truth import TRUTH_SQL

APP_ID = "lakecdc-baseline"
SCHEMA = pa.schema([*[pa.field(c, pa.string(), nullable=False) for c in DIMS],
                    pa.field("count", pa.int64(), nullable=False)])


def count_in_snapshot(dsn: str, snapshot_name: str) -> pa.Table:
    """service_stats as of an exported snapshot (the slot's consistent point)."""
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # A utility statement: no bind parameters, so the name goes in as a quoted literal.
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        rows = conn.execute(TRUTH_SQL).fetchall()
        conn.rollback()
    return pa.Table.from_pylist([dict(zip((*DIMS, "count"), r)) for r in rows], schema=SCHEMA)


def write_baseline(uri: str, counts: pa.Table, commit_lsn: int,
                   storage_options: dict | None = None) -> None:
    """Replace the baseline with ``counts`` as of ``commit_lsn`` in one commit."""
    write_deltalake(uri, counts, mode="overwrite", storage_options=storage_options,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(APP_ID, commit_lsn)]))


def read_baseline(uri: str, storage_options: dict | None = None) -> tuple[int, pa.Table] | None:
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return None
    table = DeltaTable(uri, storage_options=storage_options)
    return table.transaction_version(APP_ID), table.to_pyarrow_table()
