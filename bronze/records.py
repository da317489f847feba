"""Turning wal2json peek rows into bronze records: pure functions on columns, no I/O.

A peek returns rows in decode order: each transaction as ``B``, its changes, ``C`` (always
whole and contiguous), and non-transactional logical messages (``M`` with xid 0) on their
own. Every change is keyed by ``(commit_lsn, seq)``: the LSN of its transaction's commit
record (from the ``B`` row's JSON) and its position inside the transaction. A change's own
LSN is not unique (COPY and multi-row inserts share one) and is kept only as information. A
non-transactional message is a transaction of one: ``commit_lsn`` = its own LSN, ``seq`` 0.

``TransactionAssembler`` consumes the peek in chunks, so a transaction of a million rows
never has to sit in memory at once; state carried between chunks is one open transaction's
header. The transaction's change count (``tx_changes``, stored on every row so a reader
can tell it holds the whole transaction) is only known at its ``C``, so chunks carry a
transaction number (``gid``) and ``finalize`` fills the count in once the transaction is
closed (``TransactionAssembler.tx_changes``; ``open_gid`` is the one still open).

The snapshot backfill's pure parts live in ``bronze/backfill_marks.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import sliding_window_view

UTC_US = pa.timestamp("us", tz="UTC")

BRONZE_SCHEMA = pa.schema([
    pa.field("slot", pa.string(), nullable=False),
    pa.field("commit_lsn", pa.int64(), nullable=False),
    pa.field("seq", pa.int32(), nullable=False),
    pa.field("tx_changes", pa.int32(), nullable=False),
    pa.field("xid", pa.int64()),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("commit_ts", UTC_US),
    pa.field("action", pa.string(), nullable=False),
    pa.field("shipped_at", UTC_US, nullable=False),
    pa.field("data", pa.string(), nullable=False),
])

# What the assembler emits per chunk: bronze columns minus slot/tx_changes/shipped_at, plus
# the transaction number used to fill ``tx_changes`` in ``finalize``.
ASSEMBLED_SCHEMA = pa.schema(
    [BRONZE_SCHEMA.field(n) for n in ("commit_lsn", "seq")]
    + [pa.field("gid", pa.int64(), nullable=False)]
    + [BRONZE_SCHEMA.field(n) for n in ("xid", "lsn", "commit_ts", "action", "data")])

_B, _C, _M = ord("B"), ord("C"), ord("M")


class MalformedPeek(Exception):
    """The peek output broke wal2json's framing (a bug or an unsupported plugin version)."""


@dataclass
class PeekColumns:
    """One chunk of peek output, column-wise.

    ``commit_lsn`` and ``commit_ts_us`` are taken from the JSON of ``B`` rows (0 elsewhere).
    """

    lsn: np.ndarray           # int64, the row's own LSN as the peek reports it
    xid: np.ndarray           # int64, 0 for non-transactional messages
    commit_lsn: np.ndarray    # int64
    commit_ts_us: np.ndarray  # int64, microseconds since the epoch
    action: np.ndarray        # uint8, the wal2json action letter
    data: pa.StringArray      # the wal2json JSON; empty for B and C rows

    def __len__(self) -> int:
        return len(self.lsn)


@dataclass
class _Open:
    """Header of the transaction still open at the end of the previous chunk."""

    gid: int
    start: int
    commit_lsn: int
    commit_ts_us: int
    xid: int


@dataclass
class PeekSummary:
    rows: int                     # all peek rows, B/C included
    last_lsn: int | None          # the LSN the slot may be advanced to once this is stored
    max_commit_lsn: int | None    # highest commit_lsn among kept changes
    max_commit_ts_us: int | None  # its commit time (microseconds since the epoch)
    kept: int                     # change rows kept (newer than the recorded version)
    transactions: int             # transactions kept (with at least one change)
    tx_changes: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int32))


class TransactionAssembler:
    """Groups peek rows into whole transactions and keys them ``(commit_lsn, seq)``.

    Transactions with ``commit_lsn <= after_commit_lsn`` (already in bronze) are dropped:
    this is what makes a re-delivered transaction harmless.
    """

    def __init__(self, after_commit_lsn: int) -> None:
        self.after = after_commit_lsn
        self._open: _Open | None = None
        self._groups = 0
        self._rows = 0
        self._counts = np.zeros(1024, dtype=np.int32)    # tx_changes by gid, known at ends
        self._last_lsn: int | None = None
        self._max_commit: int | None = None
        self._max_commit_ts_us: int | None = None
        self._kept = 0
        self._kept_groups: set[int] = set()

    def add(self, cols: PeekColumns) -> pa.RecordBatch:
        """One chunk of the peek: its kept changes, keyed, with their transaction numbers."""
        n = len(cols)
        if n == 0:
            return pa.RecordBatch.from_pylist([], schema=ASSEMBLED_SCHEMA)
        action = cols.action
        is_b, is_c = action == _B, action == _C
        is_solo = (action == _M) & (cols.xid == 0)
        ends = is_c | is_solo
        starts = is_b | is_solo
        idx = np.arange(self._rows, self._rows + n, dtype=np.int64)
        self._check_framing(cols, starts, ends)

        # Per-transaction headers: slot 0 is the transaction carried in from the last chunk.
        local = np.cumsum(starts) - 1 + 1          # 0 = carried-in, 1.. = started here
        sidx = np.flatnonzero(starts)
        g_gid, g_start, g_commit, g_ts, g_xid, g_solo = self._headers(cols, sidx, is_solo, idx)

        row_commit = g_commit[local]
        row_start = g_start[local]
        seq = idx - row_start - np.where(g_solo[local], 0, 1)
        self._check_xids(cols, is_solo, g_xid[local])

        # Change counts, known at each end row: C (rows since B) or a solo message (1).
        eidx = np.flatnonzero(ends)
        self._grow_counts(self._groups + len(sidx))
        if len(eidx):
            gl = local[eidx]
            self._counts[g_gid[gl]] = np.where(is_solo[eidx], 1, idx[eidx] - g_start[gl] - 1)

        keep = ~is_b & ~is_c & (row_commit > self.after)
        kidx = np.flatnonzero(keep)
        if len(kidx):
            self._note_kept(kidx, row_commit, local, g_ts, g_gid)

        # Carry the last transaction over if it is still open.
        last = n - 1
        if ends[last]:
            self._open = None
        else:
            gl = local[last]
            self._open = _Open(int(g_gid[gl]), int(g_start[gl]), int(g_commit[gl]),
                               int(g_ts[gl]), int(g_xid[gl]))
        self._groups += len(sidx)
        self._rows += n
        self._last_lsn = int(cols.lsn[last])

        xid = g_xid[local][kidx]
        ts = g_ts[local][kidx]
        return pa.RecordBatch.from_arrays([
            pa.array(row_commit[kidx], pa.int64()),
            pa.array(seq[kidx].astype(np.int32), pa.int32()),
            pa.array(g_gid[local][kidx], pa.int64()),
            pa.array(xid, pa.int64(), mask=xid == 0),
            pa.array(cols.lsn[kidx], pa.int64()),
            pa.array(ts, pa.int64(), mask=g_solo[local][kidx]).cast(UTC_US),
            pa.array(action[kidx].view("S1")).cast(pa.string()),
            _kept_text(cols.data, kidx, n_changes=int(np.count_nonzero(~is_b & ~is_c))),
        ], schema=ASSEMBLED_SCHEMA)

    def _check_framing(self, cols: PeekColumns, starts: np.ndarray, ends: np.ndarray) -> None:
        """Raises unless a start comes only after an end (or at a clean boundary), and every
        other row inside an open transaction."""
        prev_end = np.empty(len(cols), dtype=bool)
        prev_end[0] = self._open is None
        prev_end[1:] = ends[:-1]
        if np.any(starts & ~prev_end) or np.any(~starts & prev_end):
            bad = int(np.flatnonzero((starts & ~prev_end) | (~starts & prev_end))[0])
            raise MalformedPeek(f"row {self._rows + bad} breaks transaction framing: "
                                f"{cols.data[bad].as_py()[:120]}")

    def _headers(self, cols: PeekColumns, sidx: np.ndarray, is_solo: np.ndarray,
                 idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """The chunk's transactions' gid, start row, commit LSN, commit time, xid and whether
        it is a solo message: the one carried in from the last chunk, then each started at
        ``sidx``."""
        carried = self._open or _Open(-1, -1, 0, 0, 0)
        return (np.concatenate(([carried.gid], self._groups + np.arange(len(sidx)))),
                np.concatenate(([carried.start], idx[sidx])),
                np.concatenate(([carried.commit_lsn], np.where(is_solo[sidx], cols.lsn[sidx],
                                                               cols.commit_lsn[sidx]))),
                np.concatenate(([carried.commit_ts_us], cols.commit_ts_us[sidx])),
                np.concatenate(([carried.xid], cols.xid[sidx])),
                np.concatenate(([False], is_solo[sidx])))

    def _check_xids(self, cols: PeekColumns, is_solo: np.ndarray, tx_xid: np.ndarray) -> None:
        """Raises unless every row but a solo message carries its transaction's xid
        (``tx_xid``, by row)."""
        if np.any((~is_solo) & (cols.xid != tx_xid)):
            bad = int(np.flatnonzero((~is_solo) & (cols.xid != tx_xid))[0])
            raise MalformedPeek(f"row {self._rows + bad} has xid {cols.xid[bad]} inside "
                                f"transaction {tx_xid[bad]}")

    def _grow_counts(self, groups: int) -> None:
        """Room in the change counts for ``groups`` transactions."""
        if groups > len(self._counts):
            grown = np.zeros(2 * groups, dtype=np.int32)
            grown[:self._groups] = self._counts[:self._groups]
            self._counts = grown

    def _note_kept(self, kidx: np.ndarray, row_commit: np.ndarray, local: np.ndarray,
                   g_ts: np.ndarray, g_gid: np.ndarray) -> None:
        """Count the kept rows ``kidx`` and their transactions; keep the newest commit."""
        self._kept += len(kidx)
        newest = kidx[int(np.argmax(row_commit[kidx]))]
        if self._max_commit is None or int(row_commit[newest]) > self._max_commit:
            self._max_commit = int(row_commit[newest])
            self._max_commit_ts_us = int(g_ts[local[newest]])
        self._kept_groups.update(np.unique(g_gid[local[kidx]]).tolist())

    @property
    def open_gid(self) -> int | None:
        """The transaction still open after the last chunk (its rows are the last ones
        ``add`` returned); None at a transaction boundary."""
        return None if self._open is None else self._open.gid

    @property
    def tx_changes(self) -> np.ndarray:
        """Change counts by ``gid``, so far: valid for every transaction already closed."""
        return self._counts[:self._groups]

    def finish(self) -> PeekSummary:
        """Close the peek. Raises if it ended inside a transaction (wal2json never does)."""
        if self._open is not None:
            raise MalformedPeek("peek ended inside a transaction")
        return PeekSummary(rows=self._rows, last_lsn=self._last_lsn,
                           max_commit_lsn=self._max_commit,
                           max_commit_ts_us=self._max_commit_ts_us, kept=self._kept,
                           transactions=len(self._kept_groups), tx_changes=self.tx_changes)


def _kept_text(data: pa.StringArray, kidx: np.ndarray, n_changes: int) -> pa.StringArray:
    """The text of the kept rows. B/C rows carry empty text, so when every change row is
    kept (the normal case) the kept rows are back to back in the buffer: no copy."""
    if len(kidx) != n_changes or len(kidx) == 0 or data.offset != 0:
        return data.take(pa.array(kidx))
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int32, count=len(data) + 1)
    kept = np.append(offsets[kidx], offsets[kidx[-1] + 1]).astype(np.int32)
    return pa.StringArray.from_buffers(len(kidx), pa.py_buffer(kept), data.buffers()[2])


def finalize(batch: pa.RecordBatch, tx_changes: np.ndarray, slot: str,
             shipped_at: pa.TimestampScalar) -> pa.RecordBatch:
    """An assembled batch as bronze rows: slot, ``tx_changes`` filled in, ``shipped_at``."""
    n = batch.num_rows
    gid = batch.column("gid").to_numpy()
    return pa.RecordBatch.from_arrays([
        pa.array([slot] * n, pa.string()) if n else pa.array([], pa.string()),
        batch.column("commit_lsn"),
        batch.column("seq"),
        pa.array(tx_changes[gid], pa.int32()),
        batch.column("xid"),
        batch.column("lsn"),
        batch.column("commit_ts"),
        batch.column("action"),
        pa.array(np.full(n, shipped_at.value, dtype=np.int64), pa.int64()).cast(UTC_US),
        batch.column("data"),
    ], schema=BRONZE_SCHEMA)


# --- Binary COPY decoding -------------------------------------------------------------

COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
COPY_HEADER_LEN = len(COPY_SIGNATURE) + 8   # flags int32 + header extension length int32
# Each tuple: int16 field count, four int64 fields, the int16 action, then the text.
_ROW_HEAD = np.dtype([("n", ">i2"),
                      ("l1", ">i4"), ("lsn", ">i8"), ("l2", ">i4"), ("xid", ">i8"),
                      ("l3", ">i4"), ("commit_lsn", ">i8"), ("l4", ">i4"), ("ts", ">i8"),
                      ("l5", ">i4"), ("action", ">i2"), ("l6", ">i4")])
ROW_HEAD_LEN = _ROW_HEAD.itemsize


def decode_copy_rows(rows: list) -> PeekColumns:
    """Decode binary-COPY tuples (one buffer each, file header already removed).

    The tuples must come from the shipper's peek query (four ``bigint`` columns, the
    ``int2`` action and the wal2json text). The tuples are joined into one buffer, once;
    the fixed-size heads are gathered from it into one structured numpy array, and the
    texts are addressed where they lie (Arrow string views) and packed by one Arrow cast.
    No per-row work in Python but taking each tuple's length: slicing each tuple in two
    cost about 2.4 µs a tuple, as much as reading it from the connection (docs/bronze.md).
    """
    n = len(rows)
    if n == 0:
        return PeekColumns(*(np.zeros(0, np.int64) for _ in range(4)), np.zeros(0, np.uint8),
                           pa.array([], pa.string()))
    lengths = np.fromiter(map(len, rows), np.int64, n)
    if np.any(lengths < ROW_HEAD_LEN):
        raise MalformedPeek("binary COPY tuple shorter than its fixed fields")
    joined = b"".join([*rows, bytes(_INLINE)])   # padded: a text's first bytes are in reach
    ends = np.cumsum(lengths)
    starts = ends - lengths
    tuples = np.frombuffer(joined, np.uint8)
    head = sliding_window_view(tuples, ROW_HEAD_LEN)[starts].view(_ROW_HEAD).ravel()
    data_len = head["l6"].astype(np.int64)
    if (np.any(head["n"] != 6) or np.any(head["l1"] != 8)
            or np.any(head["l2"] != 8) or np.any(head["l3"] != 8) or np.any(head["l4"] != 8)
            or np.any(head["l5"] != 2) or np.any(data_len != lengths - ROW_HEAD_LEN)):
        raise MalformedPeek("unexpected binary COPY tuple layout")
    texts = _texts(joined, starts + ROW_HEAD_LEN, data_len)
    offsets = np.frombuffer(texts.buffers()[1], np.int32, n + 1)
    action = head["action"].astype(np.uint8)
    packed = texts.buffers()[2]
    data, offsets = _valid_messages(b"" if packed is None else memoryview(packed), offsets,
                                    action)
    return PeekColumns(lsn=head["lsn"].astype(np.int64), xid=head["xid"].astype(np.int64),
                       commit_lsn=head["commit_lsn"].astype(np.int64),
                       commit_ts_us=head["ts"].astype(np.int64),
                       action=action,
                       data=pa.StringArray.from_buffers(n, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)))


# An Arrow binary view: its length, then up to 12 bytes inline, or else its first 4 bytes,
# its buffer's index and its offset in that buffer (little-endian).
_VIEW = np.dtype([("length", "<i4"), ("prefix", "V4"), ("buffer", "<i4"), ("offset", "<i4")])
_INLINE = 12


def _texts(joined: bytes, at: np.ndarray, length: np.ndarray) -> pa.BinaryArray:
    """The ``length`` bytes at each offset ``at`` of ``joined`` (which has ``_INLINE``
    bytes more after the last text), packed back to back."""
    n = len(at)
    first = sliding_window_view(np.frombuffer(joined, np.uint8), _INLINE)[at]  # or a prefix
    first[np.arange(_INLINE) >= length[:, None]] = 0            # nothing past a short text
    views = np.zeros(n, _VIEW)
    views["length"] = length
    raw = views.view(np.uint8).reshape(n, _VIEW.itemsize)
    raw[:, 4:] = first
    long = length > _INLINE
    views["buffer"][long] = 0
    views["offset"][long] = at[long]
    array = pa.Array.from_buffers(pa.binary_view(), n,
                                  [None, pa.py_buffer(views), pa.py_buffer(joined)])
    return array.cast(pa.binary())


def _valid_messages(data: bytes | memoryview, offsets: np.ndarray, action: np.ndarray
                    ) -> tuple[bytes | memoryview, np.ndarray]:
    """``data`` and ``offsets`` with every logical message's text made valid UTF-8.

    wal2json prints the column values of changes as valid text, but a message's content as
    the raw bytes it was given - and anyone allowed to call ``pg_logical_emit_message(…,
    bytea)`` can give it any. An invalid byte becomes U+FFFD: the row is still shipped (a
    message counts 0) and nothing downstream meets bytes that are not text. Messages are
    rare, so only they are checked.
    """
    fixed: dict[int, bytes] = {}
    for i in np.flatnonzero(action == _M).tolist():
        text = bytes(data[int(offsets[i]):int(offsets[i + 1])])
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            fixed[i] = text.decode("utf-8", errors="replace").encode("utf-8")
    if not fixed:
        return data, offsets
    lengths = np.diff(offsets).astype(np.int64)
    parts, start = [], 0
    for i, text in fixed.items():
        parts += [data[start:int(offsets[i])], text]
        start = int(offsets[i + 1])
        lengths[i] = len(text)
    parts.append(data[start:])
    new = np.zeros_like(offsets)
    np.cumsum(lengths, out=new[1:])
    return b"".join(parts), new
