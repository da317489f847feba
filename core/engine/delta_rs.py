"""delta-rs (the default engine, ``core.engine``): lakecdc's Delta tables read and written
with no JVM.

A writer keeps its handle on each table it commits to (``core.handle.WriterHandle``), so
most commits skip loading the table again; a read that must see other writers' commits
opens the table itself. delta-rs records an app transaction but skips no write whose
version is recorded already (lakecdc's writers check ``recorded`` first), and commits no
MERGE that changes no row: an empty append then carries the MERGE's metadata and app
transaction (``merge_recorded``).

The module's functions serve the classes that hold a delta-rs handle of their own (the
shipper's bronze, the mirrors' tails) as well as ``DeltaRs``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa

from core.commits import HISTORY_READS, Commit, Recorded, parse_commit_metadata
from core.maintenance import (
    TARGET_BYTES,
    TableReport,
    TableSize,
    clean_log,
    commit_time,
    maintain_table,
    table_size,
)
from core.storage import delta_rs_uri
from core.switches import NONE


class DeltaRs:
    """The ``core.engine.api.Engine`` of delta-rs, for the lakehouse reached with
    ``storage_options`` (``core.storage.Lakehouse.delta_rs_options``)."""

    name = "delta-rs"

    def __init__(self, storage_options: dict | None = None) -> None:
        self.storage_options = storage_options
        self._handles: dict[str, tuple[threading.Lock, object]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """The storage options alone: handles and locks are this process's (Spark Connect
        pickles a ``foreachBatch`` writer, and the mirrors' holds an engine)."""
        return {"storage_options": self.storage_options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["storage_options"])

    # -- reading -------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(delta_rs_uri(path),
                                        storage_options=self.storage_options)

    def version(self, path: str) -> int | None:
        return self._open(path).version() if self.exists(path) else None

    def read(self, path: str, columns: list[str] | None = None, where: str | None = None,
             version: int | None = None) -> pa.Table:
        from deltalake import QueryBuilder

        table = self._open(path, version)
        if where is None:
            return table.to_pyarrow_table(columns=columns)
        names = "*" if columns is None else ", ".join(f'"{c}"' for c in columns)
        found = pa.table(QueryBuilder().register("t", table).execute(
            f"SELECT {names} FROM t WHERE {where}").read_all())
        # DataFusion answers in arro3, strings as views: the table's own types, as Spark's.
        schema = pa.schema(table.schema().to_arrow())
        return found.cast(pa.schema([schema.field(n) for n in found.column_names]))

    def properties(self, path: str) -> dict[str, str]:
        return dict(self._open(path).metadata().configuration)

    def recorded(self, path: str) -> Recorded | None:
        return recorded_rs(delta_rs_uri(path), self.storage_options)

    def commits(self, path: str, layer: str = "gold", limit: int | None = None,
                up_to: int | None = None, mentioning: str | None = None) -> list[Commit]:
        uri = delta_rs_uri(path)
        if not self.exists(uri):
            return []
        return read_commits_rs(uri, self.storage_options, layer, limit, up_to, mentioning)

    def commit_time(self, path: str, version: int) -> float | None:
        return commit_time(delta_rs_uri(path), self.storage_options, version)

    def size(self, path: str) -> TableSize | None:
        return table_size(delta_rs_uri(path), self.storage_options)

    def maxima(self, path: str, columns: list[str]) -> tuple[int, dict] | None:
        import datetime as dt

        if not self.exists(path):
            return None
        table = self._open(path)
        actions = table.get_add_actions(flatten=True)
        found = {}
        for column in columns:
            name = f"max.{column}"
            values = [] if actions.num_rows == 0 or name not in actions.column_names else [
                v for v in actions.column(name).to_pylist() if v is not None]
            value = max(values) if values else None
            if isinstance(value, dt.datetime) and value.tzinfo is None:   # stored as UTC
                value = value.replace(tzinfo=dt.timezone.utc)
            found[column] = value
        return table.version(), found

    def count(self, path: str) -> int | None:
        if not self.exists(path):
            return None
        table = self._open(path)
        counts = table.get_add_actions(flatten=True).column("num_records").to_pylist()
        if all(n is not None for n in counts):
            return int(sum(counts))
        return table.to_pyarrow_dataset().count_rows()   # files without the statistic

    def stream_position(self, checkpoint_dir: str, replayed: bool = False) -> int | None:
        from core.checkpoints import stream_position

        return stream_position(checkpoint_dir, self.storage_options, replayed=replayed)

    # -- writing -------------------------------------------------------------------------
    def create(self, path: str, schema: pa.Schema, properties: dict[str, str] | None = None,
               comment: str | None = None, partitioned_by: tuple[str, ...] = ()) -> None:
        from deltalake import DeltaTable

        from core.features import PLAIN

        DeltaTable.create(delta_rs_uri(path), schema, mode="ignore",
                          partition_by=list(partitioned_by) or None,
                          configuration={**PLAIN, **(properties or {})}, description=comment,
                          storage_options=self.storage_options, raise_if_key_not_exists=False)

    def append(self, path: str, rows: pa.Table, *, meta: str | None = None,
               app: tuple[str, int] | None = None, overwrite: bool = False) -> bool:
        from deltalake import write_deltalake

        with self.handle(path) as table:
            write_deltalake(table, rows, mode="overwrite" if overwrite else "append",
                            commit_properties=rs_commit(meta, *(app or (None, None))))
        return True

    def merge(self, path: str, source: pa.Table, on: str, *, update: dict | None = None,
              insert: dict | None = None, delete: str | None = None,
              update_when: str | None = None, insert_when: str | None = None,
              delete_unmatched: bool = False, meta: str | None = None,
              app: tuple[str, int] | None = None) -> dict:
        commit = rs_commit(meta, *(app or (None, None)))
        with self.handle(path) as table:
            merge = table.merge(source, on, source_alias="s", target_alias="t",
                                commit_properties=commit)
            if delete is not None:
                merge = merge.when_matched_delete(predicate=delete)
            if update is not None:
                merge = merge.when_matched_update(updates=update, predicate=update_when)
            if insert is not None:
                merge = merge.when_not_matched_insert(updates=insert, predicate=insert_when)
            if delete_unmatched:
                merge = merge.when_not_matched_by_source_delete()
            metrics = merge_recorded(table, merge, commit)
        return {k: int(metrics.get(k) or 0) for k in (
            "num_target_rows_updated", "num_target_rows_inserted", "num_target_rows_deleted")}

    def delete(self, path: str, where: str, *, meta: str | None = None) -> None:
        with self.handle(path) as table:
            table.delete(where, commit_properties=rs_commit(meta))

    # -- keeping a table small -----------------------------------------------------------
    def maintain(self, name: str, path: str, *, retention_hours: int,
                 log_retention_minutes: int, reader_floor: int | None = None,
                 log_floor: int | None = None, now: float | None = None,
                 target_bytes: int = TARGET_BYTES, switches=NONE) -> TableReport:
        return maintain_table(name, delta_rs_uri(path), self.storage_options,
                              retention_hours=retention_hours,
                              log_retention_minutes=log_retention_minutes,
                              reader_floor=reader_floor, log_floor=log_floor,
                              target_bytes=target_bytes, now=now, switches=switches)

    def clean_log(self, path: str, *, log_retention_minutes: int,
                  log_floor: int | None = None) -> str | None:
        return clean_log(delta_rs_uri(path), self.storage_options,
                         log_retention_minutes=log_retention_minutes, log_floor=log_floor)

    def check_writable(self, root: str, lakehouse=None) -> None:
        """(``core.store_checks.check_writable``: a probe written where delta-rs writes.)"""
        from core.store_checks import check_writable

        check_writable(root, lakehouse)

    # -- handles -------------------------------------------------------------------------
    @contextmanager
    def handle(self, path: str) -> Iterator:
        """This process's kept handle on the table for one commit (``core.handle``), one
        commit at a time per table."""
        from core.handle import WriterHandle

        uri = delta_rs_uri(path)
        with self._lock:
            if uri not in self._handles:
                self._handles[uri] = (threading.Lock(),
                                      WriterHandle(uri, self.storage_options))
            lock, kept = self._handles[uri]
        with lock, kept.use() as table:
            yield table

    def sibling(self) -> "DeltaRs":
        """This engine: its handles are kept and locked per table, so a commit to one table
        never waits for another's."""
        return self

    def reset(self, path: str) -> None:
        """Open the table again at its next commit (another writer committed beside it)."""
        found = self._handles.get(delta_rs_uri(path))
        if found is not None:
            found[1].reset()

    def _open(self, path: str, version: int | None = None):
        from core.features import open_table

        return open_table(delta_rs_uri(path), self.storage_options, version=version)


def read_commits_rs(uri: str, storage_options: dict | None = None, layer: str = "gold",
                    limit: int | None = None, up_to: int | None = None,
                    mentioning: str | None = None) -> list[Commit]:
    """The commits of the table at ``uri`` (``core.engine.api.Engine.commits``) (``rs_history``)."""
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


def recorded_rs(uri: str, storage_options: dict | None = None,
                table=None) -> Recorded | None:
    """What the table at ``uri`` records (``core.engine.api.Engine.recorded``), or the open
    ``table`` (a writer's kept handle) as it stands; None if there is no table."""
    from deltalake import DeltaTable

    if table is None:
        if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
            return None
        table = DeltaTable(uri, storage_options=storage_options)
    return Recorded(table.version(), table.transaction_version)


def rs_commit(meta: str | None, app_id: str | None = None, version: int | None = None):
    """delta-rs's ``CommitProperties`` for a commit carrying lakecdc's metadata ``meta`` (as
    ``userMetadata``, where Spark's readers find it too) and, with ``app_id``, the Delta app
    transaction ``(app_id, version)``."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        custom_metadata=None if meta is None else {"userMetadata": meta},
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
