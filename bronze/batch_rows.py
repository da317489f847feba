"""One peek's rows on their way into a bronze commit (``bronze.ship``'s ``ship_batch``)."""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bronze.backfill_marks import HighMark, high_marks
from bronze.buffer import SpillBuffer
from bronze.records import ASSEMBLED_SCHEMA, TransactionAssembler, finalize
from bronze.table import DataFiles
from core.config import Config


class BatchRows:
    """Routes one peek's assembled rows into the commit's data files as their transactions
    close, so the Parquet is written while the peek streams, not after it.

    Held back until their count is known: the transaction still open at the end of a chunk
    (``open_rows``, spilled to disk past the memory budget: one transaction of millions of
    rows), and transactions carrying a backfill HIGH watermark (``marked``: the backfill
    plan grows their ``tx_changes``; written by ``finish``)."""

    def __init__(self, files: DataFiles, assembler: TransactionAssembler, config: Config,
                 shipped_at: pa.TimestampScalar,
                 hook: Callable[[pa.RecordBatch], pa.RecordBatch]) -> None:
        self.files = files
        self.assembler = assembler
        self.config = config
        self.shipped_at = shipped_at
        self.hook = hook
        self.marks: list[HighMark] = []
        self.rejected_marks = 0             # malformed or forged, under lakecdc's prefix
        self._marked_gids: set[int] = set()
        self.marked = self._buffer()
        self.open_rows = self._buffer()
        self._open_gid: int | None = None

    def _buffer(self) -> SpillBuffer:
        return SpillBuffer(ASSEMBLED_SCHEMA, self.config.memory_budget_mb << 20,
                           self.config.spill_dir)

    def add(self, batch: pa.RecordBatch) -> None:
        """The rows ``TransactionAssembler.add`` returned for the latest chunk."""
        found, rejected = high_marks(batch)
        self.marks += found
        self.rejected_marks += rejected
        self._marked_gids.update(m.gid for m in found)
        open_gid = self.assembler.open_gid
        if self.open_rows.rows and open_gid != self._open_gid:      # it closed: write it
            for held in self.open_rows.batches():
                self._write(held)
            self.open_rows.close()
            self.open_rows = self._buffer()
        closed = batch.num_rows if open_gid is None else int(
            np.searchsorted(batch.column("gid").to_numpy(), open_gid))
        self._write(batch.slice(0, closed))
        self.open_rows.append(batch.slice(closed))
        self._open_gid = open_gid

    def _write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows and self._marked_gids:
            marked = pc.is_in(batch.column("gid"), pa.array(sorted(self._marked_gids)))
            self.marked.append(batch.filter(marked))
            batch = batch.filter(pc.invert(marked))
        if batch.num_rows:
            self.files.write(self.hook(finalize(batch, self.assembler.tx_changes,
                                                self.config.slot, self.shipped_at)))

    def written(self) -> Iterator[pa.RecordBatch]:
        """Every kept row of the peek, once it is complete (the backfill plan's windows)."""
        yield from self.files.read(["commit_lsn", "xid", "action", "data"])
        yield from self.marked.batches()

    def finish(self, tx_changes: np.ndarray) -> None:
        """Write the marked transactions' rows with their final ``tx_changes``."""
        for batch in self.marked.batches():
            self.files.write(self.hook(finalize(batch, tx_changes, self.config.slot,
                                                self.shipped_at)))

    def __enter__(self) -> "BatchRows":
        return self

    def __exit__(self, *exc) -> None:
        self.open_rows.close()
        self.marked.close()
