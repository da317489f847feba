"""SpillBuffer: batches come back whole and in order, and a spill file never outlives the
process that wrote it - not even one killed with SIGKILL while it had spilled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa

from bronze.buffer import SpillBuffer

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("n", pa.int64(), nullable=False), pa.field("text", pa.string())])


def make_batch(i: int, rows: int = 1000) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(range(i * rows, (i + 1) * rows), pa.int64()),
         pa.array([f"batch {i} row {r} " + "x" * 200 for r in range(rows)])], schema=SCHEMA)


def open_files_under(pid: int, directory: Path) -> list[str]:
    """What ``pid``'s open file descriptors point to inside ``directory`` (Linux /proc)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            found.append(target)
    return found


def test_batches_round_trip_in_order_in_memory_and_spilled(tmp_path):
    batches = [make_batch(i) for i in range(12)]
    for budget, spills in ((1 << 30, False), (2 * batches[0].nbytes, True)):
        with SpillBuffer(SCHEMA, budget, str(tmp_path)) as buf:
            for b in batches:
                buf.append(b)
            buf.append(make_batch(99, rows=0))                  # empty batches are skipped
            assert buf.spilled is spills and buf.rows == 12_000
            # Read twice: the backfill re-reads a batch before it is written.
            for _ in range(2):
                back = list(buf.batches())
                assert pa.Table.from_batches(back, SCHEMA).equals(
                    pa.Table.from_batches(batches, SCHEMA))
        assert not list(tmp_path.iterdir())


def test_spill_file_has_no_name_and_leaves_nothing_when_killed(tmp_path):
    """A shipper killed with SIGKILL mid-spill must not leave its spill file behind."""
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    child = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.unit.test_buffer import SCHEMA, make_batch
        from bronze.buffer import SpillBuffer
        buf = SpillBuffer(SCHEMA, 1 << 20, {str(spill_dir)!r})
        for i in range(20):
            buf.append(make_batch(i))
        print("spilled" if buf.spilled else "not spilled", flush=True)
        sys.stdin.read()                       # hold the buffer open until killed
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "spilled"
        # The child's spill file is in spill_dir (so the checks below mean something).
        assert open_files_under(proc.pid, spill_dir)
        named_while_open = list(spill_dir.iterdir())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert not list(spill_dir.iterdir())
    assert not named_while_open            # it never had a name to leave behind
