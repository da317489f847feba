"""A batch buffer that spills to a local Arrow IPC file past a memory budget.

One peek is written to bronze in one Delta commit, but its size is unbounded (one source
transaction can hold millions of rows). Batches stay in memory up to the budget; past it
they go to a temporary file and are read back one at a time for the write.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

import pyarrow as pa
import pyarrow.ipc as ipc


class SpillBuffer:
    def __init__(self, schema: pa.Schema, budget_bytes: int, spill_dir: str | None = None):
        self.schema = schema
        self.budget = budget_bytes
        self.spill_dir = spill_dir
        self._memory: list[pa.RecordBatch] = []
        self._bytes = 0
        self._path: str | None = None
        self._writer: ipc.RecordBatchFileWriter | None = None
        self.rows = 0

    @property
    def spilled(self) -> bool:
        return self._path is not None

    def append(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.rows += batch.num_rows
        if self._writer is None and self._bytes + batch.nbytes <= self.budget:
            self._memory.append(batch)
            self._bytes += batch.nbytes
            return
        if self._writer is None:
            fd, self._path = tempfile.mkstemp(prefix="lakecdc-spill-", suffix=".arrow",
                                              dir=self.spill_dir)
            os.close(fd)
            self._writer = ipc.new_file(self._path, self.schema)
            for held in self._memory:
                self._writer.write_batch(held)
            self._memory, self._bytes = [], 0
        self._writer.write_batch(batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The batches in order; memory-mapped from the spill file when there is one."""
        if self._writer is None:
            yield from self._memory
            return
        self._writer.close()
        with pa.OSFile(self._path) as source:   # not mmap: mapped pages would stay resident
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:   # already closed by batches()
                pass
        if self._path and os.path.exists(self._path):
            os.unlink(self._path)
        self._memory, self._path, self._writer = [], None, None

    def __enter__(self) -> "SpillBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
