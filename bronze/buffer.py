"""A batch buffer that spills to a local Arrow IPC stream past a memory budget.

One peek is written to bronze in one Delta commit, but its size is unbounded (one source
transaction can hold millions of rows). Batches stay in memory up to the budget; past it
they go to a temporary file and are read back one at a time for the write.

The spill file never has a name: ``tempfile.TemporaryFile`` creates it unlinked (``O_TMPFILE``,
or unlinked right after creation where that is missing), and it is written and read back
through that one open file. The kernel frees it when the buffer is closed or the process
ends, however it ends - a shipper killed with ``kill -9`` leaves nothing in ``spill_dir``.
"""

from __future__ import annotations

import tempfile
from typing import IO, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc


class SpillBuffer:
    def __init__(self, schema: pa.Schema, budget_bytes: int, spill_dir: str | None = None):
        self.schema = schema
        self.budget = budget_bytes
        self.spill_dir = spill_dir
        self._memory: list[pa.RecordBatch] = []
        self._bytes = 0
        self._file: IO[bytes] | None = None
        self._writer: ipc.RecordBatchStreamWriter | None = None
        self.rows = 0

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def append(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.rows += batch.num_rows
        if self._file is None and self._bytes + batch.nbytes <= self.budget:
            self._memory.append(batch)
            self._bytes += batch.nbytes
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="lakecdc-spill-", suffix=".arrow",
                                                dir=self.spill_dir)
            self._writer = ipc.new_stream(pa.PythonFile(self._file, mode="w"), self.schema)
            for held in self._memory:
                self._writer.write_batch(held)
            self._memory, self._bytes = [], 0
        self._writer.write_batch(batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The batches in order, read back one at a time if spilled. May be called again
        once a previous iteration is finished."""
        if self._file is None:
            yield from self._memory
            return
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._file.seek(0)
        # Read, not memory-mapped: mapped pages would count as the shipper's memory.
        yield from ipc.open_stream(pa.PythonFile(self._file, mode="r"))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()          # the kernel frees the unnamed file
        self._memory, self._file, self._writer = [], None, None

    def __enter__(self) -> "SpillBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
