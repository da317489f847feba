"""A writer's handle on a Delta table (delta-rs), kept between its commits.

Opening a table reads its newest checkpoint and the commits after it, and lists the log.
A writer that keeps its handle skips that on most commits: delta-rs moves the handle to the
version each of its commits makes. It does so by replaying the commits since the handle was
opened, so the handle is opened again once a checkpoint has been written since
(``CHECKPOINT_INTERVAL`` of its own commits), after a failed commit, after a maintenance of
the table in this process (``core.maintenance``), and when told (``reset``: the writer
committed beside it with Spark).

A kept handle makes a commit cheaper than opening the table each time; kept and never
opened again, its commits grow slower with every commit it replays, which opening it again
bounds (a commit's cost as a table ages: docs/benchmarks/aging.md).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from deltalake import DeltaTable

from core.features import open_table
from core.maintenance import maintenances

# A checkpoint every 20 commits: a reader (a snapshot load, a kept handle opened again)
# replays at most 19 commit files after it. Each checkpoint rewrites every live file and
# tombstone, which maintenance keeps to the compacted files and the log's retention.
CHECKPOINT_INTERVAL = 20
CHECKPOINTS = {"delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}


class WriterHandle:
    """The table at ``uri`` for one writer's commits (``use``); reads that must see other
    writers' commits open the table themselves."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self._table: DeltaTable | None = None
        self._opened_at = (0, 0)            # (its version, this process's maintenances)

    @contextmanager
    def use(self) -> Iterator[DeltaTable]:
        """The handle for one commit; opened again when due, and after the block fails."""
        table = self._current()
        try:
            yield table
        except BaseException:
            self._table = None
            raise

    def reset(self) -> None:
        """Open the table again at the next commit (after a commit of another writer's)."""
        self._table = None

    def _current(self) -> DeltaTable:
        if self._table is not None:
            version, maintained = self._opened_at
            if (self._table.version() - version < CHECKPOINT_INTERVAL
                    and maintenances(self.uri) == maintained):
                return self._table
        self._table = open_table(self.uri, self.storage_options)
        self._opened_at = (self._table.version(), maintenances(self.uri))
        return self._table
