"""The snapshot backfill's pure parts (``bronze/snapshot_backfill.py``): no I/O.

``high_marks`` finds the HIGH watermark messages among the rows the shipper assembled,
``Window`` / ``changed_keys`` the keys changed inside a chunk's watermark window, with the
columns those changes carried, ``partial_read`` what of such a key's read row is kept, and
``read_records`` turns a chunk's rows into bronze rows (action ``R``) of the HIGH's
transaction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bronze.records import BRONZE_SCHEMA, UTC_US

BACKFILL_PREFIX = "lakecdc.backfill"
READ_ACTION = "R"
_WINDOW_ACTIONS = ("I", "U", "D")


@dataclass(frozen=True)
class HighMark:
    """A HIGH watermark message of the snapshot backfill, as the shipper kept it."""

    gid: int                  # transaction number in this peek (index into tx_changes)
    commit_lsn: int
    seq: int
    xid: int | None
    lsn: int                  # the message's own LSN
    commit_ts_us: int | None
    run: str
    table: str
    chunk: int


@dataclass(frozen=True)
class Window:
    """The watermark window of one staged chunk.

    A chunk row of ``table`` with key ``k`` is stale, and must be dropped (or cut to the
    columns no such change carried: ``partial_read``), if a captured change of ``k``
    committed before ``high_lsn`` is not visible to the chunk's snapshot.
    Such a change either has ``low_lsn < commit_lsn`` (it committed after the LOW
    watermark), or - when Postgres made a transaction visible after a later-committing one,
    which commit order does not forbid (synchronous replication waits between writing the
    commit record and becoming visible) - its xid is one of ``in_progress``, the
    transactions running when the chunk's snapshot was taken. Dropping is always safe: the
    dropped key has a change in the stream before ``high_lsn`` that carries its row.
    """

    run: str
    chunk: int
    table: str                # schema.table
    key_columns: tuple[str, ...]
    low_lsn: int
    high_lsn: int
    in_progress: frozenset[int] = frozenset()

    def covers(self, commit_lsn: np.ndarray, xid: np.ndarray) -> np.ndarray:
        hit = (commit_lsn > self.low_lsn) & (commit_lsn < self.high_lsn)
        if self.in_progress:
            hit |= (commit_lsn <= self.low_lsn) & np.isin(xid, list(self.in_progress))
        return hit


# A HIGH or LOW mark is ``{"run": …, "table": …, "chunk": …, "mark": …}``, well under this
# size; anything larger under lakecdc's prefix is not lakecdc's and is never parsed.
MAX_MARK_BYTES = 1024
_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")
_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*")
_MARK_KEYS = frozenset({"run", "table", "chunk", "mark"})


def parse_mark(text: str) -> tuple[str, str, int, str] | None:
    """``(run, table, chunk, mark)`` of a backfill watermark's content, or None for anything
    that is not exactly one: total (never raises) and O(1) - the size is checked before
    anything is parsed, and only a flat object of the four expected keys and types passes."""
    if not isinstance(text, str) or len(text) > MAX_MARK_BYTES:
        return None
    try:
        content = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(content, dict) or content.keys() != _MARK_KEYS:
        return None
    run, table, chunk, mark = (content[k] for k in ("run", "table", "chunk", "mark"))
    if not (isinstance(run, str) and _RUN_ID.fullmatch(run) and isinstance(table, str)
            and _TABLE.fullmatch(table) and type(chunk) is int and 0 < chunk < 2**31
            and mark in ("low", "high")):
        return None
    return run, table, chunk, mark


def high_marks(batch: pa.RecordBatch) -> tuple[list[HighMark], int]:
    """The backfill HIGH watermarks among assembled rows (``ASSEMBLED_SCHEMA``), and how many
    messages under the backfill prefix were not well-formed marks (skipped, never raised:
    any role allowed to emit logical messages can write under lakecdc's prefixes).

    Cheap on ordinary batches: one vectorised comparison finds the (rare) message rows;
    only those are looked at, each at a bounded cost (``parse_mark``).
    """
    if batch.num_rows == 0:
        return [], 0
    is_m = np.asarray(pc.fill_null(pc.equal(batch.column("action"), "M"), False))
    idx = np.flatnonzero(is_m)
    if len(idx) == 0:
        return [], 0
    marks, rejected = [], 0
    data = batch.column("data")
    for i in idx.tolist():
        text = data[i].as_py()
        if len(text) > MAX_MARK_BYTES + 512 or f'"{BACKFILL_PREFIX}"' not in text:
            rejected += f'"prefix":"{BACKFILL_PREFIX}"' in text[:200]
            continue
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            rejected += 1
            continue
        if not isinstance(doc, dict) or doc.get("prefix") != BACKFILL_PREFIX:
            continue
        parsed = parse_mark(doc.get("content")) if doc.get("transactional") is True else None
        if parsed is None:
            rejected += 1
            continue
        run, table, chunk, mark = parsed
        if mark != "high":
            continue
        ts = batch.column("commit_ts")[i]
        marks.append(HighMark(
            gid=int(batch.column("gid")[i].as_py()),
            commit_lsn=int(batch.column("commit_lsn")[i].as_py()),
            seq=int(batch.column("seq")[i].as_py()),
            xid=batch.column("xid")[i].as_py(),
            lsn=int(batch.column("lsn")[i].as_py()),
            commit_ts_us=None if not ts.is_valid else ts.cast(pa.int64()).as_py(),
            run=run, table=table, chunk=chunk))
    return marks, rejected


def changed_keys(commit_lsn: pa.Array, xid: pa.Array, action: pa.Array, data: pa.Array,
                 windows: list[Window]) -> dict[tuple[str, int], dict[str, set[str] | None]]:
    """Keys of each window's table changed inside the window, per ``(run, chunk)``: key →
    the names of the columns those changes carried, or None when one of them took the row
    away from the key (a DELETE, or an UPDATE that moved it to another key).

    Rows are change rows (bronze or assembled columns); only ``I``/``U``/``D`` count. The
    key is read from ``columns`` (new value) and ``identity`` (old value: a DELETE, or an
    UPDATE that changed the key), as text - exactly as the chunk's ``key::text`` is stored
    (JSON numbers are taken as their text).
    """
    result: dict[tuple[str, int], dict[str, set[str] | None]] = {
        (w.run, w.chunk): {} for w in windows}
    if not windows or len(commit_lsn) == 0:
        return result
    lsn = np.asarray(commit_lsn.to_numpy(zero_copy_only=False), dtype=np.int64)
    xids = np.asarray(pc.fill_null(xid, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    changes = np.asarray(pc.fill_null(pc.is_in(action, pa.array(_WINDOW_ACTIONS)), False))
    hits = {(w.run, w.chunk): w.covers(lsn, xids) & changes for w in windows}
    any_hit = np.zeros(len(lsn), dtype=bool)
    for hit in hits.values():
        any_hit |= hit
    by_table: dict[str, list[Window]] = {}
    for w in windows:
        by_table.setdefault(w.table, []).append(w)
    for i in np.flatnonzero(any_hit).tolist():
        doc = json.loads(data[i].as_py(), parse_int=str, parse_float=str)
        table = f"{doc.get('schema')}.{doc.get('table')}"
        for w in by_table.get(table, ()):
            if not hits[(w.run, w.chunk)][i]:
                continue
            found = result[(w.run, w.chunk)]
            new, old = (_key_value(doc.get(part), w.key_columns)
                        for part in ("columns", "identity"))
            if old is not None and (new is None or new != old):
                note_change(found, old, None)           # the row left this key
            if new is not None:
                note_change(found, new, {c.get("name") for c in doc.get("columns") or ()})
    return result


def note_change(found: dict[str, set[str] | None], key: str, carried: set[str] | None) -> None:
    """Add to ``found`` (``changed_keys``'s key → carried columns) a change of ``key``
    carrying ``carried`` (None: it took the row away): a key once left stays left, and
    the columns of its changes add up."""
    if found.get(key, ()) is None:
        return
    if carried is None:
        found[key] = None
    else:
        found.setdefault(key, set()).update(carried)


def _key_value(columns, key_columns: tuple[str, ...]) -> str | None:
    values = {col.get("name"): col.get("value") for col in columns or ()}
    if any(values.get(k) is None for k in key_columns):
        return None
    return key_text(tuple(str(values[k]) for k in key_columns))


def key_text(values: tuple[str, ...]) -> str:
    """A row's key as the backfill stages and compares it: the text of its one column's
    value, or a compact JSON array of the texts of a composite key's."""
    if len(values) == 1:
        return values[0]
    return json.dumps(list(values), ensure_ascii=False, separators=(",", ":"))


def key_values(text: str, columns: int) -> tuple[str, ...]:
    """``key_text`` read back, for a key of ``columns`` columns."""
    return (text,) if columns == 1 else tuple(json.loads(text))


def key_columns_text(columns: tuple[str, ...]) -> str:
    """A key's column names as staged: the name, or a JSON array of a composite key's."""
    return columns[0] if len(columns) == 1 else json.dumps(list(columns), ensure_ascii=False)


def key_columns_of(text: str) -> tuple[str, ...]:
    """``key_columns_text`` read back."""
    if text.startswith('["') and text.endswith("]"):
        try:
            return tuple(json.loads(text))
        except ValueError:
            pass
    return (text,)


class _Number(str):
    """A JSON number kept as its text, written back unchanged (``partial_read``)."""


def partial_read(text: str, key_columns: tuple[str, ...],
                 carried: set[str] | None) -> str | None:
    """What to keep of a read row (``text``, as staged) whose key changed inside its
    chunk's window, its changes having carried ``carried`` (``changed_keys``): None (drop
    it) when the row left the key, or when the changes carried every column; else the row
    with only the key and the columns no change carried.

    Those columns held the read's values all through the window: an UPDATE that changes a
    column carries it, and so does an INSERT, so the only values a change in the window
    leaves out are unchanged TOASTed ones (wal2json omits them). Appended after the
    window's changes, such a row sets them on the row those changes left, where dropping
    the read whole would leave them unset (NULL) in a mirror that had no earlier change."""
    if carried is None:
        return None
    doc = json.loads(text, parse_int=_Number, parse_float=_Number)
    kept = [c for c in doc.get("columns") or ()
            if c.get("name") in key_columns or c.get("name") not in carried]
    if all(c.get("name") in key_columns for c in kept):
        return None
    head = ",".join(f"{json.dumps(k)}:{_json(v)}" for k, v in doc.items() if k != "columns")
    columns = ",".join("{" + ",".join(f"{json.dumps(k)}:{_json(v)}" for k, v in c.items())
                       + "}" for c in kept)
    return "{" + head + "," + json.dumps("columns") + ":[" + columns + "]}"


def _json(value) -> str:
    return str(value) if isinstance(value, _Number) else json.dumps(value)


def read_records(data: pa.Array, mark: HighMark, first_seq: int, tx_changes: int, slot: str,
                 shipped_at: pa.TimestampScalar) -> pa.RecordBatch:
    """Chunk rows as bronze rows of the HIGH watermark's transaction: same ``commit_lsn``,
    ``seq`` from ``first_seq`` on, its (grown) ``tx_changes``, action ``R``."""
    n = len(data)
    ts = pa.array([mark.commit_ts_us] * n, pa.int64()).cast(UTC_US)
    return pa.RecordBatch.from_arrays([
        pa.array([slot] * n, pa.string()),
        pa.array(np.full(n, mark.commit_lsn, dtype=np.int64), pa.int64()),
        pa.array(np.arange(first_seq, first_seq + n, dtype=np.int32), pa.int32()),
        pa.array(np.full(n, tx_changes, dtype=np.int32), pa.int32()),
        pa.array([mark.xid] * n, pa.int64()),
        pa.array(np.full(n, mark.lsn, dtype=np.int64), pa.int64()),
        ts,
        pa.array([READ_ACTION] * n, pa.string()),
        pa.array(np.full(n, shipped_at.value, dtype=np.int64), pa.int64()).cast(UTC_US),
        data.cast(pa.string()),
    ], schema=BRONZE_SCHEMA)
