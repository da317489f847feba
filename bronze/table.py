"""The bronze Delta table ``bronze/wal2json_changes`` and the shipper's progress inside it.

Progress lives in the same Delta commit as the data it describes, as two Delta app
transactions (``txn`` actions):

- app id ``<slot>``: the highest ``commit_lsn`` stored (DESIGN §3.1). The shipper drops
  re-delivered transactions with ``commit_lsn <=`` this version.
- app id ``<slot>:end_lsn``: the LSN the slot may be advanced to - the end of the last
  transaction stored or passed over (transactions that touched only uncaptured tables). The
  slot is never advanced past it, so a slot ahead of it means someone else moved the slot.
- app id ``<slot>:rebaseline``: where the newest ``setup --rebaseline`` restarted the slot;
  gold refuses to run until it is rebuilt from a baseline past it (``pipelines.run``).
- app id ``lakecdc-backfill:<run>`` (only once a snapshot backfill ran): the highest chunk of
  that run whose read rows are in bronze (``bronze/backfill.py``), written by the commit that
  holds them.

The table is append-only (``delta.appendOnly``): streaming readers fail on other commits.
Which source it was built from (slot, database, system identifier) is kept as JSON in the
table description (delta-rs refuses non-Delta table properties).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterator

import pyarrow as pa
from deltalake import (ColumnProperties, CommitProperties, DeltaTable, Transaction,
                       WriterProperties, write_deltalake)
from deltalake.exceptions import TableNotFoundError

from bronze.records import BRONZE_SCHEMA
from pipelines.errors import UserError

END_SUFFIX = ":end_lsn"
REBASELINE_SUFFIX = ":rebaseline"
# The Parquet writer holds whole row groups in memory: with ~1 kB of JSON per row, small
# row groups keep the shipper's peak RSS near 500 MB through a 1M-row transaction
# (measured: 1.8 GB with the defaults and a memory-mapped spill file).
ROW_GROUP_ROWS = 8192
TARGET_FILE_BYTES = 64 << 20
_WRITER = WriterProperties(
    max_row_group_size=ROW_GROUP_ROWS, compression="ZSTD",
    # Every JSON payload is unique: a dictionary only costs memory and time.
    column_properties={"data": ColumnProperties(dictionary_enabled=False,
                                                statistics_enabled="NONE")})
TABLE_CONFIG = {
    "delta.appendOnly": "true",
    "delta.checkpointInterval": "20",
    # Stats for the key columns only, not for the JSON payload.
    "delta.dataSkippingNumIndexedCols": "9",
    "delta.logRetentionDuration": "interval 30 days",
}


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

    def _table(self) -> DeltaTable:
        return DeltaTable(self.uri, storage_options=self.storage_options)

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options)

    def create(self, ident: SourceIdentity, end_lsn: int) -> None:
        """Create the empty table recording the slot's starting point."""
        DeltaTable.create(
            self.uri, BRONZE_SCHEMA, mode="error", name="wal2json_changes",
            description=_describe(ident), configuration=TABLE_CONFIG,
            storage_options=self.storage_options,
            commit_properties=_progress_props(ident.slot, Progress(0, end_lsn),
                                              {"lakecdc.operation": "setup"}))

    def identity(self) -> SourceIdentity:
        return _parse_description(self._table().metadata().description)

    def set_source(self, system_identifier: str, timeline: int) -> None:
        """After a re-baseline onto another cluster or timeline (failover, restore)."""
        ident = self.identity()
        if (ident.system_identifier, ident.timeline) != (system_identifier, timeline):
            self._table().alter.set_table_description(_describe(SourceIdentity(
                ident.slot, ident.database, system_identifier, timeline)))

    def progress(self, slot: str) -> Progress | None:
        table = self._table()
        commit_lsn = table.transaction_version(slot)
        end_lsn = table.transaction_version(slot + END_SUFFIX)
        if commit_lsn is None or end_lsn is None:
            return None
        return Progress(commit_lsn, end_lsn)

    def app_version(self, app_id: str) -> int | None:
        """The version recorded for a Delta app transaction (None: never recorded)."""
        return self._table().transaction_version(app_id)

    def changes_dataset(self, file_pruning_predicate: str | None = None):
        """The table as a pyarrow dataset, files pruned by their statistics (a superset:
        filter the rows too)."""
        return self._table().to_pyarrow_dataset(file_pruning_predicate=file_pruning_predicate)

    def append(self, batches: Iterator[pa.RecordBatch], slot: str, progress: Progress,
               metadata: dict | None = None, app_versions: dict[str, int] | None = None
               ) -> None:
        """Append all ``batches`` and the new progress in one Delta commit.

        Data files are streamed out as the batches come; nothing is visible to readers
        until the single log entry is written. If the process dies before that, the files
        are orphans for VACUUM and the table is unchanged. ``app_versions``: further Delta
        app transactions recorded in the same commit (the backfill's chunks).
        """
        reader = pa.RecordBatchReader.from_batches(BRONZE_SCHEMA, batches)
        try:
            write_deltalake(self.uri, reader, mode="append",
                            storage_options=self.storage_options,
                            target_file_size=TARGET_FILE_BYTES,
                            writer_properties=_WRITER,
                            commit_properties=_progress_props(slot, progress, metadata,
                                                              app_versions))
        except Exception as exc:
            reason = unwritable_reason(exc)
            if reason is None:
                raise
            raise UserError(f"the lakehouse at {self.uri} cannot be written ({reason}); "
                            "nothing was committed and the slot was not advanced: free "
                            "space or fix the mount, then rerun.") from None

    def record_progress(self, slot: str, progress: Progress, metadata: dict | None = None,
                        app_versions: dict[str, int] | None = None):
        """A commit with no rows: only moves ``end_lsn`` past transactions with no changes."""
        self.append(iter(()), slot, progress, metadata, app_versions)

    def rebaselined_at(self, slot: str) -> int | None:
        """Where the newest ``setup --rebaseline`` restarted the slot (None: never): the
        changes between bronze's previous end and it were not captured."""
        return self.app_version(slot + REBASELINE_SUFFIX)

    def version(self) -> int:
        return self._table().version()


# What delta-rs / the OS say when the lakehouse's storage refuses a write (errno text).
_UNWRITABLE = ("No space left on device", "Read-only file system", "Disk quota exceeded",
               "Permission denied")


def unwritable_reason(exc: BaseException) -> str | None:
    """The storage problem behind a failed write, if it is one a person fixes."""
    text = str(exc)
    return next((reason for reason in _UNWRITABLE if reason in text), None)


_DESCRIPTION = "lakecdc bronze: raw wal2json v2 changes keyed (commit_lsn, seq). source="


def _describe(ident: SourceIdentity) -> str:
    return _DESCRIPTION + json.dumps(asdict(ident), sort_keys=True)


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
