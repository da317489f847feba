"""The mirrors' tables through Spark (``LAKECDC_WRITER=spark``: only Spark holds the
storage credentials; ``silver.mirrors.store``'s text): ``SparkMirrors``, and Spark's reads of
a mirror with the tail the delta-rs writer may have left (``current_mirror``, as ``lakecdc
sql`` reads it).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from core.commits import commit_metadata
from core.switches import NONE, Switches
from silver.mirrors.merge import (
    HISTORY,
    MergeJob,
    batch_meta,
    due_replay,
    merge_clauses,
    q,
    start_point,
)
from silver.mirrors.mirror_table import (
    EXISTS,
    HAS_PREFIX,
    LOAD_APP_ID,
    REPLAYED_APP_ID,
    TYPES_PROPERTY,
    mirror_shape_of,
    mirrored_columns,
)
from silver.mirrors.net_changes import MIRROR_COLUMNS
from silver.mirrors.tail import VERSION, net_tail, tail_path


class SparkMirrors:
    """The mirrors' tables through Spark (see the module's text); ``engine``: the mirrors'
    own ``core.engine.spark_delta.SparkDelta``."""

    def __init__(self, engine, switches: Switches = NONE) -> None:
        self.engine = engine
        self.guard = switches.on("mirror_txn")
        self._recorded: dict[tuple[str, str], int | None] = {}  # (path, app) → its newest
        self._settled: set[str] = set()         # mirrors whose tail was looked at

    def rows(self, batch) -> pa.Table:
        return batch.select(*MIRROR_COLUMNS).toArrow()

    def merge(self, job: MergeJob) -> bool:
        """Commit ``job`` unless its version is recorded; False: a replay, skipped (by this
        check or by Spark's own). Every batch is MERGEd into the mirror's table."""
        self.drain(job.path, job.app)
        if self.guard:
            recorded = self.recorded(job.path, job.app)
            if recorded is not None and recorded >= job.version:
                return False
        c = merge_clauses(job.key, job.types)
        self.engine.merge(job.path, job.source(), c.on, delete=c.delete_when, update=c.update,
                          update_when=c.exists, insert=c.insert, insert_when=c.exists,
                          delete_unmatched=job.truncate, meta=job.meta,
                          app=(job.app, job.version) if self.guard else None)
        self._recorded[(job.path, job.app)] = job.version
        return True

    def drain(self, path: str, app: str | None = None) -> None:
        """Drain a tail the delta-rs writer left (``RsMirrors.drain``; its MERGE records
        ``app`` only where the tail's rows are ``app``'s, as ``drain_tail``'s), once per
        query: this writer keeps none."""
        from delta.tables import DeltaTable

        if path in self._settled:
            return
        self._settled.add(path)
        spark, tail = self.engine.spark, tail_path(path)
        if not tail_exists_spark(spark, path):
            return
        rows = spark.read.format("delta").load(tail).toArrow()
        if rows.num_rows:
            key, types = self.shape(path)
            c = merge_clauses(key, types)
            top = int(pc.max(rows[VERSION]).as_py())
            meta = batch_meta([r.userMetadata for r in DeltaTable.forPath(
                spark, tail).history(HISTORY).collect()], top)
            ours = app is not None and self._version_of(tail, app) is not None
            self.engine.merge(path, net_tail(rows, key, mirrored_columns(key, types)),
                              c.on, delete=c.delete_when, update=c.update,
                              update_when=c.exists, insert=c.insert, insert_when=c.exists,
                              meta=meta, app=(app, top) if ours else None)
            self._recorded = {k: v for k, v in self._recorded.items() if k[0] != path}
        self.drop_tail(path)

    def drain_due(self, paths: Iterable[str] = ()) -> None:
        """Nothing: this writer keeps no tail."""

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing to pause: this writer drains nothing in the background."""
        yield

    def drain_all(self, paths: Iterable[str] = ()) -> None:
        """Nothing: this writer keeps no tail (one left is drained at its first MERGE)."""

    def drop_tail(self, path: str) -> None:
        """Empty the mirror's tail, if it has one (``RsMirrors.drop_tail``)."""
        drop_tail_spark(self.engine.spark, path)

    def changed_beside(self, path: str) -> None:
        """Nothing kept that a commit beside it makes stale (Spark reads the log anew)."""

    def shape(self, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """As ``RsMirrors.shape``, from Spark's ``detail()``."""
        return mirror_shape(self.engine.spark, path)

    def seed_state(self, path: str) -> tuple[int | None, dict[str, str]]:
        """As ``RsMirrors.seed_state``, the app transactions read from Spark's snapshot of
        the table (``SparkDelta.recorded``)."""
        from delta.tables import DeltaTable

        types = json.loads(DeltaTable.forPath(self.engine.spark, path).detail().first()
                           .properties[TYPES_PROPERTY])
        return start_point(self.engine.recorded(path).version_of), types

    def replay_due(self, path: str) -> int | None:
        """As ``RsMirrors.replay_due``."""
        recorded = self.engine.recorded(path)
        return due_replay(recorded.version_of(LOAD_APP_ID),
                          recorded.version_of(REPLAYED_APP_ID))

    def mark_replayed(self, path: str, floor: int, meta: str) -> None:
        """As ``RsMirrors.mark_replayed``: an empty append (Spark skips it where the
        version is recorded already)."""
        empty = self.engine.spark.read.format("delta").load(path).limit(0).toArrow()
        self.engine.append(path, empty, meta=meta, app=(REPLAYED_APP_ID, floor))

    def recorded(self, path: str, app: str) -> int | None:
        """The newest version of ``app`` the mirror records, in its table or in a tail the
        delta-rs writer left (None: none): read once, then kept (this query is its only
        writer)."""
        if (path, app) not in self._recorded:
            versions = [self._version_of(path, app)]
            if tail_exists_spark(self.engine.spark, path):
                versions.append(self._version_of(tail_path(path), app))
            self._recorded[(path, app)] = max((v for v in versions if v is not None),
                                              default=None)
        return self._recorded[(path, app)]

    def _version_of(self, path: str, app: str) -> int | None:
        """The version of ``app`` the table at ``path`` records (None: none, or no table)."""
        recorded = self.engine.recorded(path)
        return None if recorded is None else recorded.version_of(app)


def current_mirror(spark, path: str, table=None):
    """(Spark) The current rows of the Delta table at ``path``: a mirror's table with its
    tail laid over it as ``silver.mirrors.tail.current_rows`` does (any other table, or a
    mirror without a tail, as it is). The tail is read now (it is small: at most
    ``MAX_TAIL_ROWS``), the table when the DataFrame runs. ``table``: the table as
    already read (e.g. through a catalog's name for it); None: read from ``path``."""
    from pyspark.sql import functions as F

    table = spark.read.format("delta").load(path) if table is None else table
    tail = tail_path(path)
    if not tail_exists_spark(spark, path):
        return table
    rows = spark.read.format("delta").load(tail).toArrow()
    if rows.num_rows == 0:
        return table
    key, types = mirror_shape(spark, path)
    others = mirrored_columns(key, types)
    netted = spark.createDataFrame(net_tail(rows, key, others))
    kept = table.join(netted.select(*[q(k) for k in key]), list(key), "left_anti")
    made = netted.where(F.col(EXISTS)).alias("s").join(
        table.alias("t"), [F.col(f"s.{q(k)}") == F.col(f"t.{q(k)}") for k in key], "left")
    columns = []
    for name in table.columns:
        if name in others and name in netted.columns:
            value = F.when(F.col(f"s.{q(HAS_PREFIX + str(others.index(name)))}"),
                           F.col(f"s.{q(name)}")).otherwise(F.col(f"t.{q(name)}"))
        elif name in netted.columns:
            value = F.col(f"s.{q(name)}")
        else:                                   # a column the tail does not have yet
            value = F.col(f"t.{q(name)}")
        columns.append(value.cast(table.schema[name].dataType).alias(name))
    return kept.unionByName(made.select(*columns))


def mirror_shape(spark, path: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(Spark) A mirror's key and (column → Postgres type), from its table properties."""
    from delta.tables import DeltaTable

    return mirror_shape_of(DeltaTable.forPath(spark, path).detail().first().properties)


def tail_exists_spark(spark, path: str) -> bool:
    """(Spark) Whether the mirror at ``path`` has a tail (``core.spark_tables.is_table``)."""
    from core.spark_tables import is_table

    return is_table(spark, tail_path(path))


def drop_tail_spark(spark, path: str) -> None:
    """(Spark) Empty the tail of the mirror at ``path``, if it has one, unmerged."""

    tail = tail_path(path)
    if tail_exists_spark(spark, path):
        (spark.read.format("delta").load(tail).limit(0).write.format("delta")
         .mode("overwrite").option("userMetadata", commit_metadata("mirror", folded=None))
         .save(tail))
