"""The exact baseline: rows that existed before the slot, counted at its consistent point.

Rows already in the source when the slot is created have no INSERT in the WAL. ``setup``
creates the slot with an exported snapshot, which sees exactly the transactions committed
before the slot's consistent point; counting inside it gives ``service_stats`` as of that
point. The counts are kept in ``<lakehouse>/gold/_baseline`` (written without Spark, with
the consistent point as a Delta app transaction) and seed gold on its first run, so the
first ``run`` on a populated database is exact. With ``LAKECDC_WRITER=spark`` it is written
and read through Spark (``core.spark_writes``); the consistent point is then also the
commit's lakecdc metadata (layer ``baseline``), since Spark has no public reader of app
transactions.

The count runs in primary-key chunks in a REPEATABLE READ transaction on the snapshot
(``pipelines.source.truth.count_truth``): MVCC, so writers are not blocked; memory is
bounded by the number of keys, not rows; a progress bar shows on a terminal.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from core.captured import DIMS, CountedTables
from core.commits import commit_metadata, newest, read_commits
from core.features import open_table

APP_ID = "lakecdc-baseline"
LAYER = "baseline"          # its commits' lakecdc metadata (``core.commits``)
SCHEMA = pa.schema([*[pa.field(c, pa.string(), nullable=False) for c in DIMS],
                    pa.field("count", pa.int64(), nullable=False)])


def count_in_snapshot(dsn: str, snapshot_name: str, tables: CountedTables) -> pa.Table:
    """service_stats of the counted ``tables`` as of an exported snapshot (the slot's
    consistent point)."""
    from pipelines.source.consistent import ConsistentPoint, count_at

    counts = count_at(dsn, ConsistentPoint(0, snapshot_name), tables, "counting the baseline")
    return to_table(counts)


def to_table(counts) -> pa.Table:
    """A ``{dims: count}`` mapping as the baseline's Arrow table."""
    return pa.Table.from_pylist([dict(zip((*DIMS, "count"), (*k, v)))
                                 for k, v in sorted(counts.items())], schema=SCHEMA)


def write_baseline(uri: str, counts: pa.Table, commit_lsn: int,
                   storage_options: dict | None = None, writes=None) -> None:
    """Replace the baseline with ``counts`` as of ``commit_lsn`` in one commit (through
    ``writes``, a ``core.spark_writes.SparkWrites``, when given)."""
    if writes is not None:
        path = _spark_path(uri)
        writes.create(path, SCHEMA)
        writes.append(path, counts, overwrite=True, app=(APP_ID, commit_lsn),
                      meta=commit_metadata(LAYER, commit_lsn=commit_lsn))
        return
    write_deltalake(uri, counts, mode="overwrite", storage_options=storage_options,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(APP_ID, commit_lsn)]))


def read_baseline(uri: str, storage_options: dict | None = None, spark=None
                  ) -> tuple[int, pa.Table] | None:
    """The baseline's consistent point and counts (None: none written); through ``spark``
    when given."""
    if spark is not None:
        return _read_spark(spark, uri)
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return None
    table = open_table(uri, storage_options)
    return table.transaction_version(APP_ID), table.to_pyarrow_table()


def _spark_path(uri: str) -> str:
    from core.storage import on_databricks, spark_path

    return spark_path(uri, on_databricks())


def _read_spark(spark, uri: str) -> tuple[int, pa.Table] | None:
    path = _spark_path(uri)
    meta = newest(read_commits(spark, path, LAYER, limit=20))
    if meta is None:
        return None
    rows = spark.read.format("delta").load(path).toArrow()
    return int(meta["commit_lsn"]), rows.select(SCHEMA.names).cast(SCHEMA)
