"""The bronze Delta table ``bronze/wal2json_changes`` and the shipper's progress inside it.

Progress lives in the same Delta commit as the data it describes, as two Delta app
transactions (``txn`` actions):

- app id ``<slot>``: the highest ``commit_lsn`` stored (docs/bronze.md). The shipper drops
  re-delivered transactions with ``commit_lsn <=`` this version.
- app id ``<slot>:end_lsn``: the LSN the slot may be advanced to - the end of the last
  transaction stored or passed over (transactions that touched only uncaptured tables). The
  slot is never advanced past it, so a slot ahead of it means someone else moved the slot.
- app id ``<slot>:rebaseline``: where the newest ``setup --rebaseline`` restarted the slot;
  gold refuses to run until it is rebuilt from a baseline past it (``pipelines.run.pipeline``).
- app id ``lakecdc-backfill:<run>`` (only once a snapshot backfill ran): the highest chunk of
  that run whose read rows are in bronze (``bronze/snapshot_backfill.py``), written by the
  commit that holds them.

Data files are Parquet written by pyarrow as the rows come (``DataFiles``: one row group at a
time, straight to storage), then committed with their statistics by delta-rs in one log entry
(``BronzeTable.commit``); until then no reader sees them.

The table is append-only (``delta.appendOnly``): streaming readers fail on other commits.
Which source it was built from (slot, database, system identifier) is kept as JSON in the
table description (delta-rs refuses non-Delta table properties).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction

from bronze.records import BRONZE_SCHEMA
from core.engine.delta_rs import DeltaRs, read_commits_rs
from core.errors import UserError
from core.features import open_table
from core.handle import CHECKPOINTS, WriterHandle
from core.storage import filesystem

END_SUFFIX = ":end_lsn"
# Each path keeps bronze's progress its own way (delta-rs: Delta app transactions; Spark:
# its commits' metadata), so a lakehouse keeps the writer it was set up with.
WRITER_KEPT = ("bronze at {path} was set up with LAKECDC_WRITER={was}, and a lakehouse keeps "
               "the writer it was set up with (each keeps bronze's progress its own way): set "
               "LAKECDC_WRITER={was}, or set up a new lakehouse with the other writer.")
REBASELINE_SUFFIX = ":rebaseline"
# How the slot's wal2json prints numbers (``bronze.slot.prints_numbers_as_text``): 1 as text,
# NaN and ±Infinity included (2.6+); 0 (or never recorded) as JSON numbers, those as null.
# Recorded by ``setup`` and by every shipper commit, for the commands that cannot ask the
# slot while the shipper holds it (``numbers_as_text``).
NUMBERS_SUFFIX = ":numbers_as_text"
TABLE_CONFIG = {
    "delta.appendOnly": "true",
    **CHECKPOINTS,
    # Stats for the key columns only, not for the JSON payload.
    "delta.dataSkippingNumIndexedCols": "9",
}
# Data files are written by pyarrow's Parquet writer, straight to storage one row group at
# a time, and committed with delta-rs (``DataFiles``, ``BronzeTable.commit``): delta-rs's own
# writer (write_deltalake) kept a few hundred MB more than its input in memory through a
# write - 530-640 MB peak RSS for the shipper through a 1M-row transaction, 256 MB now.
ROW_GROUP_ROWS = 16_384             # ~16 MB of wal2json text
TARGET_FILE_BYTES = 32 << 20        # compressed: ~800k changes of the Notify-like tables
STATS_COLUMNS = BRONZE_SCHEMA.names[:int(TABLE_CONFIG["delta.dataSkippingNumIndexedCols"])]
_TIMESTAMPS = {f.name for f in BRONZE_SCHEMA if pa.types.is_timestamp(f.type)}
_PARQUET = dict(
    compression="zstd",
    # Every JSON payload is unique: a dictionary or statistics only cost memory and time.
    use_dictionary=[n for n in BRONZE_SCHEMA.names if n != "data"],
    write_statistics=[n for n in BRONZE_SCHEMA.names if n != "data"])


@dataclass(frozen=True)
class Progress:
    commit_lsn: int   # highest commit_lsn in bronze (0: none yet)
    end_lsn: int      # where the slot may be advanced to


@dataclass(frozen=True)
class SourceIdentity:
    slot: str
    database: str
    system_identifier: str
    timeline: int = 0          # 0: not recorded (tables made before it was)


class BronzeTable:
    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self._handle = WriterHandle(uri, storage_options)        # for ``commit``
        self._reader: DeltaTable | None = None                   # for ``app_version``

    def _table(self) -> DeltaTable:
        return open_table(self.uri, self.storage_options)

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options)

    def create(self, ident: SourceIdentity, end_lsn: int,
               app_versions: dict[str, int] | None = None) -> None:
        """Create the empty table recording the slot's starting point (and
        ``app_versions``)."""
        DeltaTable.create(
            self.uri, BRONZE_SCHEMA, mode="error", name="wal2json_changes",
            description=_describe(ident), configuration=TABLE_CONFIG,
            storage_options=self.storage_options,
            commit_properties=_progress_props(ident.slot, Progress(0, end_lsn),
                                              {"lakecdc.operation": "setup"}, app_versions))

    def identity(self) -> SourceIdentity:
        return _parse_description(self._table().metadata().description)

    def set_source(self, system_identifier: str, timeline: int) -> None:
        """After a re-baseline onto another cluster or timeline (failover, restore)."""
        ident = self.identity()
        if (ident.system_identifier, ident.timeline) != (system_identifier, timeline):
            self._table().alter.set_table_description(_describe(SourceIdentity(
                ident.slot, ident.database, system_identifier, timeline)))

    def progress(self, slot: str) -> Progress | None:
        """The slot's progress (None: none recorded); a table the Spark path set up (its
        progress in its commits' metadata, ``bronze.spark_table``) is refused with one
        sentence."""
        table = self._table()
        commit_lsn = table.transaction_version(slot)
        end_lsn = table.transaction_version(slot + END_SUFFIX)
        if commit_lsn is None or end_lsn is None:
            if any(c.meta for c in read_commits_rs(self.uri, self.storage_options, "bronze",
                                                   limit=20)):
                raise UserError(WRITER_KEPT.format(path=self.uri, was="spark"))
            return None
        return Progress(commit_lsn, end_lsn)

    def app_version(self, app_id: str) -> int | None:
        """The version recorded for a Delta app transaction (None: never recorded). Read
        through a handle kept up to date incrementally: callers poll it (the backfill waits
        for its chunks, ``tables`` for the shipper's acknowledgement)."""
        if self._reader is None:
            self._reader = self._table()
        else:
            self._reader.update_incremental()
        return self._reader.transaction_version(app_id)

    def rows_where(self, where: str, columns: list[str]) -> pa.Table:
        """``columns`` of the rows meeting the SQL condition ``where`` (the engine's
        ``read``: files pruned by their statistics)."""
        return DeltaRs(self.storage_options).read(self.uri, columns, where)

    @contextmanager
    def data_files(self) -> Iterator["DataFiles"]:
        """Data files for the next commit (``commit``); removed again if the block fails."""
        files = DataFiles(self.uri, self.storage_options)
        try:
            yield files
        except BaseException:
            files.abort()
            raise

    def commit(self, files: "DataFiles | None", slot: str, progress: Progress,
               metadata: dict | None = None, app_versions: dict[str, int] | None = None
               ) -> None:
        """One Delta commit: the rows of ``files`` (none: a progress-only commit) and the new
        progress. ``app_versions``: further Delta app transactions recorded with them (the
        backfill's chunks).

        The data files are invisible to readers until this single log entry is written; if
        the process dies before, they are orphans for VACUUM and the table is unchanged."""
        adds = files.finish() if files is not None else []
        with _storage_errors(self.uri), self._handle.use() as table:
            table.create_write_transaction(
                adds, mode="append", schema=table.schema(),
                commit_properties=_progress_props(slot, progress, metadata, app_versions))
            table.update_incremental()      # delta-rs leaves the handle where it was

    def append(self, batches: Iterator[pa.RecordBatch], slot: str, progress: Progress,
               metadata: dict | None = None, app_versions: dict[str, int] | None = None
               ) -> None:
        """Append all ``batches`` (``BRONZE_SCHEMA``) and the new progress in one commit."""
        with self.data_files() as files:
            for batch in batches:
                files.write(batch)
            self.commit(files, slot, progress, metadata, app_versions)

    def record_progress(self, slot: str, progress: Progress, metadata: dict | None = None,
                        app_versions: dict[str, int] | None = None):
        """A commit with no rows: only moves ``end_lsn`` past transactions with no changes."""
        self.commit(None, slot, progress, metadata, app_versions)

    def rebaselined_at(self, slot: str) -> int | None:
        """Where the newest ``setup --rebaseline`` restarted the slot (None: never): the
        changes between bronze's previous end and it were not captured."""
        return self.app_version(slot + REBASELINE_SUFFIX)

    def version(self) -> int:
        return self._table().version()


class DataFiles:
    """Parquet files of one bronze commit, written as batches come (``BRONZE_SCHEMA``).

    ``write`` hands the batch to a writer thread, so encoding and compressing it (pyarrow
    releases the GIL) overlaps with what the caller does next: reading the peek. Rows are
    buffered up to a row group (``ROW_GROUP_ROWS``), which goes straight to storage; a file
    is closed once it reaches ``TARGET_FILE_BYTES``. ``finish`` returns the Delta add
    actions, with the statistics readers prune files by (``delta.dataSkippingNumIndexedCols``
    = the columns before ``data``), in delta-rs's format. A failed write is raised by the
    next call.
    """

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self._fs: tuple[pafs.FileSystem, str] | None = None      # at the first file
        self._adds: list[AddAction] = []
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._file: _OpenFile | None = None
        self._written: list[str] = []           # every path opened, for abort
        # One batch (a peek chunk) at most waits for the writer thread.
        self._queue: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=1)
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._raise_error()
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="bronze-writer",
                                            daemon=True)
            self._worker.start()
        self._queue.put(batch)

    def read(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """Read back what was written so far (the files are closed first)."""
        self._drain()
        self._flush(whole_row_groups=False)
        self._close_file()
        for add in self._adds:
            with self._storage()[0].open_input_file(self._path(add.path)) as source:
                yield from pq.ParquetFile(source).iter_batches(columns=columns)

    def finish(self) -> list[AddAction]:
        """Close the last file; the files then belong to the commit (``abort`` keeps them:
        a commit that fails after writing its log entry must not lose its files)."""
        self._stop()
        self._flush(whole_row_groups=False)
        self._close_file()
        self._written = []
        return list(self._adds)

    def abort(self) -> None:
        """Close and delete what was written (best effort: orphans are harmless)."""
        self._error = self._error or RuntimeError("aborted")     # the thread skips the rest
        try:
            self._stop()
        except BaseException:
            pass
        if self._file is not None:
            try:
                self._file.writer.close()
                self._file.sink.close()
            except Exception:
                pass
            self._file = None
        for name in self._written:
            try:
                self._storage()[0].delete_file(self._path(name))
            except Exception:
                pass
        self._adds, self._written, self._pending = [], [], []

    def _work(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    self._pending.append(batch)
                    self._pending_rows += batch.num_rows
                    if self._pending_rows >= ROW_GROUP_ROWS:
                        self._flush(whole_row_groups=True)
            except BaseException as exc:
                self._error = exc
            finally:
                self._queue.task_done()

    def _drain(self) -> None:
        """Wait until the writer thread has written everything queued."""
        self._queue.join()
        self._raise_error()

    def _stop(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _storage(self) -> tuple[pafs.FileSystem, str]:
        if self._fs is None:
            self._fs = filesystem(self.uri, self.storage_options)
        return self._fs

    def _path(self, name: str) -> str:
        root = self._storage()[1]
        return f"{root}/{name}" if root else name

    def _flush(self, whole_row_groups: bool) -> None:
        if not self._pending_rows:
            return
        table = pa.Table.from_batches(self._pending, BRONZE_SCHEMA)
        n = table.num_rows
        if whole_row_groups:
            n -= n % ROW_GROUP_ROWS
        rest = table.slice(n)
        self._pending, self._pending_rows = rest.to_batches(), rest.num_rows
        with _storage_errors(self.uri):
            out = self._file or self._open_file()
            out.writer.write_table(table.slice(0, n), row_group_size=ROW_GROUP_ROWS)
            out.stats.add(table.slice(0, n))
            if out.sink.tell() >= TARGET_FILE_BYTES:
                self._close_file()

    def _open_file(self) -> "_OpenFile":
        name = f"part-{len(self._written):05d}-{uuid.uuid4()}-c000.zstd.parquet"
        self._written.append(name)
        sink = self._storage()[0].open_output_stream(self._path(name))
        self._file = _OpenFile(name, sink, pq.ParquetWriter(sink, BRONZE_SCHEMA, **_PARQUET),
                               _Stats())
        return self._file

    def _close_file(self) -> None:
        out, self._file = self._file, None
        if out is None:
            return
        with _storage_errors(self.uri):
            out.writer.close()
            size = out.sink.tell()
            out.sink.close()
        self._adds.append(AddAction(out.name, size, {}, int(time.time() * 1000), True,
                                    out.stats.json()))


@dataclass
class _OpenFile:
    name: str
    sink: pa.NativeFile
    writer: pq.ParquetWriter
    stats: "_Stats"


class _Stats:
    """Delta file statistics of ``STATS_COLUMNS``, as delta-rs writes them (timestamps as
    UTC ISO-8601, truncated to milliseconds)."""

    def __init__(self) -> None:
        self.rows = 0
        self.nulls = dict.fromkeys(STATS_COLUMNS, 0)
        self.low: dict = {}
        self.high: dict = {}

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for name in STATS_COLUMNS:
            column = table.column(name)
            self.nulls[name] += column.null_count
            bounds = pc.min_max(column)
            if not bounds["min"].is_valid:
                continue
            low, high = (bounds[k].value if name in _TIMESTAMPS else bounds[k].as_py()
                         for k in ("min", "max"))
            self.low[name] = min(low, self.low.get(name, low))
            self.high[name] = max(high, self.high.get(name, high))

    def json(self) -> str:
        def value(name, v):
            return _timestamp(v) if name in _TIMESTAMPS else v
        return json.dumps({"numRecords": self.rows,
                           "minValues": {k: value(k, v) for k, v in self.low.items()},
                           "maxValues": {k: value(k, v) for k, v in self.high.items()},
                           "nullCount": self.nulls}, separators=(",", ":"))


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _timestamp(us: int) -> str:
    t = _EPOCH + timedelta(microseconds=us - us % 1000)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


# What the OS / object store say when the lakehouse's storage refuses a write (errno text).
_UNWRITABLE = ("No space left on device", "Read-only file system", "Disk quota exceeded",
               "Permission denied")


def unwritable_reason(exc: BaseException) -> str | None:
    """The storage problem behind a failed write, if it is one a person fixes."""
    text = str(exc)
    return next((reason for reason in _UNWRITABLE if reason in text), None)


@contextmanager
def _storage_errors(uri: str) -> Iterator[None]:
    """A write the storage refused becomes one sentence (nothing is committed then, so the
    slot is not advanced either)."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        reason = unwritable_reason(exc)
        if reason is None:
            raise
        raise UserError(f"the lakehouse at {uri} cannot be written ({reason}); nothing was "
                        "committed and the slot was not advanced: free space or fix the "
                        "mount, then rerun.") from None


_DESCRIPTION = "lakecdc bronze: raw wal2json v2 changes keyed (commit_lsn, seq). source="


def _describe(ident: SourceIdentity) -> str:
    return _DESCRIPTION + json.dumps(asdict(ident), sort_keys=True)


def numbers_as_text(bronze, slot: str) -> bool:
    """Whether the slot's wal2json prints numbers as text, as bronze (either writer's table)
    last recorded it (``NUMBERS_SUFFIX``)."""
    return bronze.app_version(slot + NUMBERS_SUFFIX) == 1


def _parse_description(text: str | None) -> SourceIdentity:
    if not text or not text.startswith(_DESCRIPTION):
        return SourceIdentity("", "", "")
    return SourceIdentity(**json.loads(text[len(_DESCRIPTION):]))


def _progress_props(slot: str, progress: Progress, metadata: dict | None,
                    app_versions: dict[str, int] | None = None) -> CommitProperties:
    return CommitProperties(
        app_transactions=[Transaction(slot, progress.commit_lsn),
                          Transaction(slot + END_SUFFIX, progress.end_lsn),
                          *[Transaction(app, version)
                            for app, version in sorted((app_versions or {}).items())]],
        custom_metadata={k: str(v) for k, v in (metadata or {}).items()})


__all__ = ["BronzeTable", "Progress", "SourceIdentity", "TableNotFoundError"]
