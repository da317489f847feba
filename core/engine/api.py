"""What lakecdc needs of a Delta table, whichever engine serves it (``core.engine``).

Every ``path`` is the table's location as the configuration names it (``Config.table_path``:
a local path, ``s3://``, ``abfss://``, ``gs://``); each engine spells it as it must itself
(delta-rs: ``core.storage.delta_rs_uri``; Spark: ``core.storage.spark_path``).

A commit takes lakecdc's metadata (``meta``: ``core.commits.commit_metadata``) and at most
one Delta app transaction (``app``: ``(app id, version)``). What a table holds is read from
its app transactions (``recorded``), which every checkpoint carries; the metadata only
describes, since log cleanup deletes it with its commit (``core.commits``).
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from core.commits import Commit, Recorded
from core.maintenance import TableReport, TableSize
from core.switches import NONE


class Engine(Protocol):
    """One process's reads and writes of Delta tables."""

    name: str                    # "delta-rs" or "spark", as ``LAKECDC_WRITER`` says

    # -- reading -------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        """Whether a Delta table is at ``path`` (its own folder, not one inside a table)."""

    def version(self, path: str) -> int | None:
        """The table's newest version; None: no table."""

    def read(self, path: str, columns: list[str] | None = None, where: str | None = None,
             version: int | None = None) -> pa.Table:
        """``columns`` (None: all) of the rows meeting the SQL condition ``where`` (None:
        every row), at ``version`` (None: the newest), as Arrow."""

    def properties(self, path: str) -> dict[str, str]:
        """The table's properties (its configuration)."""

    def recorded(self, path: str) -> Recorded | None:
        """The table's newest version and the app versions it records; None: no table."""

    def commits(self, path: str, layer: str = "gold", limit: int | None = None,
                up_to: int | None = None, mentioning: str | None = None) -> list[Commit]:
        """The latest ``limit`` commits (None: all the log holds) at versions ``<= up_to``,
        newest first, with lakecdc's metadata of ``layer``; ``mentioning``: only those whose
        metadata text contains it. [] when there is no table."""

    def commit_time(self, path: str, version: int) -> float | None:
        """When ``version`` was committed (seconds since the epoch); None: its entry is gone."""

    def size(self, path: str) -> TableSize | None:
        """Its live files and bytes, its log's length, its newest maintenance; None: no table."""

    def maxima(self, path: str, columns: list[str]) -> tuple[int, dict] | None:
        """The table's newest version and each of ``columns``' largest value there, from the
        per-file statistics (no data file read; a timestamp in UTC); None: no table."""

    def count(self, path: str) -> int | None:
        """The rows the table holds, from the per-file statistics where they are; None: no
        table."""

    def stream_position(self, checkpoint_dir: str, replayed: bool = False) -> int | None:
        """Where a Structured Streaming query reading a Delta table is, from its checkpoint
        (``core.checkpoints.stream_position``)."""

    # -- writing -------------------------------------------------------------------------
    def create(self, path: str, schema: pa.Schema, properties: dict[str, str] | None = None,
               comment: str | None = None, partitioned_by: tuple[str, ...] = ()) -> None:
        """Create the table for Arrow ``schema`` unless one is there (idempotent)."""

    def append(self, path: str, rows: pa.Table, *, meta: str | None = None,
               app: tuple[str, int] | None = None, overwrite: bool = False) -> bool:
        """Append ``rows`` (``overwrite``: replace the table's rows) in one commit, made even
        with no rows. False: skipped, ``app``'s version is recorded already (Spark skips
        such a write; delta-rs never does, so its writers check first)."""

    def merge(self, path: str, source: pa.Table, on: str, *, update: dict | None = None,
              insert: dict | None = None, delete: str | None = None,
              update_when: str | None = None, insert_when: str | None = None,
              delete_unmatched: bool = False, meta: str | None = None,
              app: tuple[str, int] | None = None) -> dict:
        """MERGE ``source`` (alias ``s``) into the table (alias ``t``) on ``on`` in one
        commit, made even when no row changes (the metadata and ``app`` are recorded):
        ``delete`` first for matched rows meeting it, then ``update`` (those meeting
        ``update_when``), ``insert`` for unmatched source rows (meeting ``insert_when``),
        and ``delete_unmatched``: target rows no source row matches. Returns
        ``num_target_rows_updated`` / ``…_inserted`` / ``…_deleted``."""

    def delete(self, path: str, where: str, *, meta: str | None = None) -> None:
        """Delete the rows meeting the SQL condition ``where``, in one commit with ``meta``."""

    def sibling(self) -> "Engine":
        """An engine on the same storage whose commits never wait for this one's (Spark: a
        session of its own; delta-rs: this one, its handles locked per table)."""

    # -- keeping a table small (``core.maintenance``) ---------------------------------------
    def maintain(self, name: str, path: str, *, retention_hours: int,
                 log_retention_minutes: int, reader_floor: int | None = None,
                 log_floor: int | None = None, now: float | None = None,
                 switches=NONE) -> TableReport:
        """Compact, set the retentions, checkpoint, vacuum and clean the log (``switches``:
        ``core.switches.Switches``, its fault points hit between the steps, where the engine
        has them)."""

    def clean_log(self, path: str, *, log_retention_minutes: int,
                  log_floor: int | None = None) -> str | None:
        """The retentions set and the expired log entries deleted; why not, or None."""

    def check_writable(self, root: str, lakehouse=None) -> None:
        """Fail with one sentence unless this engine can write under the lakehouse ``root``
        (``lakehouse``: its ``core.storage.Lakehouse``, for the endpoint and region)."""
