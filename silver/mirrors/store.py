"""How the mirrors reach their tables: the one place that chooses between the two stores.

``MirrorWriter`` (``silver.mirrors.mirror_writer``) nets and types each table's changes the same way
whatever the engine; what differs is only how it reads its batch, how it asks whether a
MERGE is recorded already, and who commits the MERGE:

- ``RsMirrors`` (the default; ``silver.mirrors.store_rs``): the batch's Parquet files read by
  pyarrow where they are local (``silver.writer.batch_rows``), and a delta-rs MERGE on a kept table
  handle, whose app transaction ``lakecdc-mirror@<query id>`` is read first (delta-rs skips no
  replay by itself); or, for a mirror whose MERGE is slow (a big table), an append of the MERGE's
  source to the mirror's tail, drained into its table in the background (``silver.mirrors.tail``);
- ``SparkMirrors`` (``LAKECDC_WRITER=spark``: only Spark holds the storage credentials;
  ``silver.mirrors.store_spark``): the batch collected by Spark (``toArrow``), and the MERGE
  committed by the engine (``core.engine.spark_delta.SparkDelta``)
  with the same metadata and app transaction. Spark itself skips a MERGE whose version is
  recorded; the writer's own check (the app transaction of the table and its tail, read
  through the session's Delta log once, then kept: the mirrors' query is its tables' only
  writer) saves typing a replayed batch.

The app id carries the query's *epoch*: ``lakecdc-mirror@<query id>``, the id Spark keeps
in the mirrors' checkpoint (``txn_app_id``). Batch ids are numbered within one checkpoint,
and a new one numbers from 0 again (silver made anew, ``pipelines.run.mirror_query.start_mirrors``,
or a checkpoint removed): under one app id its batches would be taken for the old ones that
the mirrors record and skipped. A tail's rows of another epoch are drained before the tail
takes one of this epoch's (their versions are not comparable).

Whether a replay is due is read from app transactions too (``due_replay``), never from the
table's history: a checkpoint carries them, while log cleanup deletes the commits whose
metadata said the same.

Both MERGEs are ``merge_clauses`` (``silver.mirrors.merge``): the rules are written once.
Switched off (the ``mirror_txn`` guard, a negative control only), neither check runs and the
Spark MERGE carries no app transaction, so a replayed batch is merged again.
"""

from __future__ import annotations

from core.config import LOG_RETENTION_MINUTES
from core.engine.delta_rs import DeltaRs
from core.switches import NONE, Switches
from silver.mirrors.store_rs import RsMirrors
from silver.mirrors.store_spark import SparkMirrors


def mirror_store(engine=None, storage_options: dict | None = None, switches: Switches = NONE,
                 merge_s: float = float("inf"),
                 log_retention_minutes: int = LOG_RETENTION_MINUTES):
    """The mirrors' store over ``engine`` (None: delta-rs with ``storage_options``).

    The one place that chooses by engine: delta-rs's store has a performance path of its
    own, the tail (a mirror whose MERGE takes more than ``merge_s`` seconds takes its
    batches into it, its log kept ``log_retention_minutes``), which needs delta-rs's
    handles; Spark's MERGEs every batch into the mirror's table."""
    if engine is None or isinstance(engine, DeltaRs):
        return RsMirrors(storage_options, switches, merge_s, log_retention_minutes,
                         engine=engine)
    return SparkMirrors(engine, switches)
