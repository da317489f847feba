"""What lakecdc's Delta commits record, and the one place that reads it back.

- **Metadata** (``commitInfo.userMetadata``): one JSON convention for every table the
  stream writes. Silver's appends record the stream's batch id; gold's MERGE, ``_pending``
  writes, seed and rebuild record the batch id and the *watermark* (``commit_lsn``,
  ``commit_ts``: the newest source commit gold includes) and, for seeds and rebuilds, the
  *floor* (see ``gold.asof``). It lives in the commit files, which log cleanup deletes, so
  it describes (status, ``verify``'s report, time travel) and the stream never recognises a
  replay by it. The readers take a table's history from Spark (``read_commits``) or from
  delta-rs (``read_commits_rs``, for the push and ``status``, which run without Spark).
- **App transactions** (``(app id, version)``, Delta's ``txn`` action): table state, like
  the schema, so every checkpoint carries them and a cleaned log still has them. Whether a
  table holds a batch, a step or a baseline already - what a replay is recognised by - is
  read from them (``recorded``), never from the history: a stream stopped longer than the
  log retention, then maintained, finds no commit of its own left there (F30).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

META_KIND = "lakecdc"
# The most reads of a delta-rs history while commits land meanwhile (``rs_history``).
HISTORY_READS = 20


@dataclass(frozen=True)
class Recorded:
    """A Delta table's newest version and the version it records for each app id, read
    from one snapshot of it (``recorded``)."""

    version: int
    _lookup: Callable[[str], int | None] = field(repr=False)

    def version_of(self, app_id: str) -> int | None:
        """The version the table records for ``app_id`` (None: none)."""
        return self._lookup(app_id)


@dataclass(frozen=True)
class Commit:
    version: int
    meta: dict | None            # lakecdc's metadata; None for any other commit (OPTIMIZE, ...)


def commit_metadata(layer: str = "gold", **values) -> str:
    """The ``userMetadata`` text of a commit of ``layer``'s tables."""
    return json.dumps({META_KIND: layer, **values}, sort_keys=True, default=str)


def parse_commit_metadata(text: str | None, layer: str = "gold") -> dict | None:
    """lakecdc's metadata of a commit of ``layer``, or None for any other commit."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get(META_KIND) == layer else None


def floor_of(meta: dict) -> int | None:
    """The floor a gold commit's metadata records, if any."""
    return int(meta["floor"]) if meta.get("floor") is not None else None


def read_commits(spark, path: str, layer: str = "gold", limit: int | None = None,
                 up_to: int | None = None, mentioning: str | None = None) -> list[Commit]:
    """The latest ``limit`` commits (all if None) of the Delta table at ``path`` with
    versions ``<= up_to`` (any if None), newest first; [] if there is no table.
    ``mentioning``: only commits whose metadata text contains it (filtered before the
    driver collects a long history).

    A local table's log is read by delta-rs: a Spark history is a job or two, 0.3-0.7 s on
    2 cores, and a ``run --once`` reads several before its first batch."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from core.storage import delta_rs_uri, on_databricks

    if path.startswith(("/", "file:")) and not on_databricks():
        from deltalake import DeltaTable as RsTable

        uri = delta_rs_uri(path)
        return read_commits_rs(uri, layer=layer, limit=limit, up_to=up_to,
                               mentioning=mentioning) if RsTable.is_deltatable(uri) else []
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    history = DeltaTable.forPath(spark, path).history(limit)
    if up_to is not None:
        history = history.where(F.col("version") <= up_to)
    if mentioning is not None:
        history = history.where(F.col("userMetadata").contains(mentioning))
    rows = history.select("version", "userMetadata").orderBy(F.desc("version")).collect()
    return [Commit(r.version, parse_commit_metadata(r.userMetadata, layer)) for r in rows]


def read_commits_rs(uri: str, storage_options: dict | None = None, layer: str = "gold",
                    limit: int | None = None, up_to: int | None = None,
                    mentioning: str | None = None) -> list[Commit]:
    """Like ``read_commits``, with delta-rs (``rs_history``)."""
    return [Commit(e["version"], parse_commit_metadata(e.get("userMetadata"), layer))
            for e in rs_history(uri, storage_options, limit)
            if (up_to is None or e["version"] <= up_to)
            and (mentioning is None or mentioning in (e.get("userMetadata") or ""))]


def rs_history(uri: str, storage_options: dict | None = None,
               limit: int | None = None) -> list[dict]:
    """delta-rs's history of the newest version of the table at ``uri`` (the latest
    ``limit`` commits, newest first), each commit under its own version.

    delta-rs (1.6) numbers a history down from the version its handle loaded, but reads the
    newest commits storage holds when asked. So the history of a handle loaded at an older
    version is numbered wrongly, and so is the newest's when commits land between the load
    and the read: every number is too low by as many, and with one, version V's entry is
    V+1's commit. That is why this always loads the newest version, and reads again, from
    the version the handle then finds, while a commit landed meanwhile. (Found 2026-11-30:
    the push of gold version V took V+1's watermark for V's when V+1 landed while it read,
    and the dashboard skipped V+1's step; the F13b kill test, 2 runs in 40.)"""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    table = DeltaTable(uri, storage_options=storage_options)
    for _ in range(HISTORY_READS):
        loaded = table.version()
        history = table.history(limit)
        table.update_incremental()
        if table.version() == loaded:
            return history
    raise DeltaError(f"the history of {uri} moved on each of {HISTORY_READS} reads "
                     "(commits landing faster than it can be read); try again.")


def newest(commits: list[Commit]) -> dict | None:
    """The newest lakecdc metadata among ``commits`` (newest first), or None."""
    return next((c.meta for c in commits if c.meta is not None), None)


def last_metadata(spark, path: str, layer: str = "gold", limit: int | None = 100) -> dict | None:
    """The newest lakecdc metadata of ``layer`` in the latest ``limit`` commits of the Delta
    table at ``path`` (all of them if None); None if there is none or no table."""
    return newest(read_commits(spark, path, layer, limit))


def recorded(spark, path: str) -> Recorded | None:
    """What the newest snapshot of the Delta table at ``path`` (Spark's path) records, or
    None if there is no table. A local table is read by delta-rs (as ``read_commits``:
    no Spark job); any other through Spark (``core.spark_writes.recorded_spark``: a
    classic session)."""
    from core.storage import delta_rs_uri, on_databricks

    if path.startswith(("/", "file:")) and not on_databricks():
        return recorded_rs(delta_rs_uri(path))
    from core.spark_writes import recorded_spark

    return recorded_spark(spark, path)


def recorded_rs(uri: str, storage_options: dict | None = None,
                table=None) -> Recorded | None:
    """``recorded`` with delta-rs, of the table at ``uri`` or of the open ``table`` (a
    writer's kept handle) as it stands; None if there is no table."""
    from deltalake import DeltaTable

    if table is None:
        if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
            return None
        table = DeltaTable(uri, storage_options=storage_options)
    return Recorded(table.version(), table.transaction_version)


def rs_commit(meta: str, app_id: str | None = None, version: int | None = None):
    """delta-rs's ``CommitProperties`` for a commit carrying lakecdc's metadata ``meta`` (as
    ``userMetadata``, where Spark's readers find it too) and, with ``app_id``, the Delta app
    transaction ``(app_id, version)``."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        custom_metadata={"userMetadata": meta},
        app_transactions=None if app_id is None else [Transaction(app_id, version)])


def merge_recorded(table, merge, commit) -> dict:
    """Execute ``merge`` (a delta-rs MERGE into ``table``, built with ``commit``) and return
    its metrics. delta-rs commits a MERGE only when it changes a row (Spark commits one
    either way); when it changes none, an empty append carries ``commit`` instead, so the
    table still records the batch: its metadata (a watermark, a batch id) and its app
    transaction."""
    import pyarrow as pa
    from deltalake import write_deltalake

    before = table.version()
    metrics = merge.execute()
    if table.version() == before:
        write_deltalake(table, pa.schema(table.schema().to_arrow()).empty_table(),
                        mode="append", commit_properties=commit)
    return metrics
