"""The mirrors' net changes, in Arrow on the driver: what a micro-batch of ``silver/changes`` holds
per table (``tables_in_batch``), a table's key-moving UPDATEs (``key_moves``), and its
changes netted to one row per primary key (``net_changes``). Pure functions of Arrow
tables; the rules are ``silver.mirrors.mirror_writer``'s docstring.

Why Arrow: the same netting as Spark expressions (a ``groupBy`` per table, an ``aggregate`` with
lambdas, interpreted in a continuous run's low-latency session) cost a 15,000-change batch
of the benchmark's five tables 5-7 s on 2 cores, so the mirrors trailed the source by
10-37 s (docs/silver.md, "Mirrors"). Here sorting and grouping are numpy's, and the
columns an UPDATE carries are overlaid as flattened map entries, never as Python dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.captured import MARKER_PREFIX
from silver.mirrors.mirror_table import HAS_PREFIX
from silver.parse import MESSAGE_ACTION

MIRRORED_OPS = ("I", "U", "D", "R")
TEXT_MAP = pa.map_(pa.string(), pa.string())
# ``column_values``'s columns, per non-key column ``i``: its text, and whether it is set.
TEXT_PREFIX = "__lakecdc_text_"
_ENTRIES = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))
# The silver columns the mirrors read.
MIRROR_COLUMNS = ("commit_lsn", "seq", "tx_changes", "commit_ts", "op", "schema_name",
                  "table_name", "columns", "identity", "column_types", "message_prefix",
                  "error")
# Of them, what a table's changes keep for its MERGEs (``TableInBatch.rows``).
ROW_COLUMNS = ("commit_lsn", "seq", "commit_ts", "op", "columns", "identity")


@dataclass(frozen=True)
class TableInBatch:
    """What a batch holds of one table: the newest TRUNCATE (order) and the (column, type)
    pairs its changes carried."""

    schema: str
    table: str
    truncated: tuple[int, int] | None
    types: dict[str, str]
    moved: bool = False             # an UPDATE moved a row to another key (may have)
    newest: int = 0                 # the newest commit LSN among its changes
    # Its rows of the batch (ops I, U, D, R, T; ``ROW_COLUMNS``), for the writer.
    rows: pa.Table | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def _np(values) -> np.ndarray:
    return values.to_numpy(zero_copy_only=False)


def _array(table: pa.Table, name: str) -> pa.Array:
    """One column as a single array (codes and offsets are per array)."""
    return table[name].combine_chunks()


def _entries(maps: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """A map column's entries, flattened: (names, texts, the row each entry is of)."""
    lists = maps.cast(_ENTRIES)
    flat = lists.flatten()
    return flat.field("key"), flat.field("value"), _np(pc.list_parent_indices(lists))


def _lookup(maps, name: str) -> pa.Array:
    """Each row's value of ``name`` in a map column (NULL where absent or the map is), its
    first entry of that name. On the flattened entries: 3-7x faster than ``map_lookup``,
    which compares per row (300,000 of the benchmark's changes: 0.08-0.11 s -> 0.01-0.03)."""
    if isinstance(maps, pa.ChunkedArray):
        maps = maps.combine_chunks()
    lists = maps.cast(_ENTRIES)
    flat = lists.flatten()
    hits = np.nonzero(_np(pc.fill_null(pc.equal(flat.field("key"), name), False)))[0]
    rows = _np(pc.list_parent_indices(lists))[hits]
    at = np.full(len(maps), -1, np.int64)
    at[rows[::-1]] = hits[::-1]               # written last, so a row's first entry wins
    return flat.field("value").take(pa.array(at, mask=at < 0))


def _differs(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Null-safe inequality of two text columns."""
    equal = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return ~_np(pc.or_(equal, both_null))


def _moving(changes: pa.Table, key: tuple[str, ...] | None) -> np.ndarray:
    """Per change: an UPDATE that moves its row to another key (``key`` None: any UPDATE
    carrying an identity may)."""
    update = _np(pc.fill_null(pc.equal(changes["op"], "U"), False))
    identity = _np(pc.is_valid(changes["identity"]))
    if key is None:
        return update & identity
    differs = np.zeros(changes.num_rows, dtype=bool)
    for k in key:
        differs |= _differs(_lookup(changes["identity"], k), _lookup(changes["columns"], k))
    return update & identity & differs


def first_failure(batch: pa.Table, accept_upto: int) -> tuple[int, str] | None:
    """(commit LSN, error) of a row silver could not parse, above ``accept_upto``."""
    failed = batch.filter(pc.and_(pc.is_valid(batch["error"]),
                                  pc.greater(batch["commit_lsn"], accept_upto)))
    if not failed.num_rows:
        return None
    return failed["commit_lsn"][0].as_py(), failed["error"][0].as_py()


def tables_in_batch(batch: pa.Table, keys: dict[str, tuple[str, ...]] | None = None
                    ) -> tuple[list[TableInBatch], int | None]:
    """The batch's tables, and the newest verify marker in it (None: none). ``keys``
    (schema.table → its mirror's key): an UPDATE of such a table counts as moving its row
    only if its identity's key differs from its new row's; of any other table, if it
    carries an identity at all."""
    op = batch["op"]
    marker = pc.fill_null(pc.and_(pc.equal(op, MESSAGE_ACTION),
                                  pc.equal(batch["message_prefix"], MARKER_PREFIX)), False)
    markers = batch.filter(marker)["commit_lsn"]
    newest_marker = pc.max(markers).as_py() if len(markers) else None
    is_change = _np(pc.fill_null(pc.is_in(op, pa.array([*MIRRORED_OPS, "T"])), False))
    tables = pc.dictionary_encode(pc.binary_join_element_wise(       # NUL: in no name
        _array(batch, "schema_name"), _array(batch, "table_name"), "\0"))
    codes = np.where(is_change, _np(pc.fill_null(tables.indices, -1)), -1)
    # Each table's column types: the distinct (table, column, type) of the entries.
    names, texts, parent = _entries(_array(batch, "column_types"))
    triples = pa.table({"code": codes[parent], "name": names, "type": texts}).filter(
        pc.greater_equal(pc.field("code"), 0)).group_by(["code", "name", "type"]).aggregate([])
    types: dict[int, dict[str, str]] = {}
    for code, name, text in zip(*(triples[c].to_pylist() for c in ("code", "name", "type"))):
        types.setdefault(code, {})[name] = text
    # Each table's rows: one stable sort of the changes by their table's code, one take of
    # the columns the writer reads, in that order, then a slice per table. (A filter, then
    # a take of every column per table: this function took 0.71 s of the benchmark's
    # 342,178-row batch; now 0.26 s.)
    order = np.argsort(codes, kind="stable")
    order = order[codes[order] >= 0]           # neither other rows nor a change without a table
    codes = codes[order]
    changes = batch.select(list(ROW_COLUMNS)).take(pa.array(order)).combine_chunks()
    starts = np.nonzero(np.r_[True, codes[1:] != codes[:-1]])[0] if len(order) else order
    found = []
    for start, end in zip(starts, np.r_[starts[1:], len(order)]):
        code = int(codes[start])
        schema, table = tables.dictionary[code].as_py().split("\0")
        mine = changes.slice(start, end - start)
        truncates = mine.filter(pc.equal(mine["op"], "T"))
        truncated = None
        if truncates.num_rows:
            at = np.lexsort((_np(truncates["seq"]), _np(truncates["commit_lsn"])))[-1]
            truncated = (truncates["commit_lsn"][int(at)].as_py(),
                         truncates["seq"][int(at)].as_py())
        moved = bool(_moving(mine, (keys or {}).get(f"{schema}.{table}")).any())
        found.append(TableInBatch(schema, table, truncated, types.get(code, {}), moved,
                                  pc.max(mine["commit_lsn"]).as_py(), mine))
    return found, newest_marker


def complete_through(batch: pa.Table) -> tuple[int, object] | None:
    """(commit LSN, commit time) of the newest transaction the batch holds whole (as many
    rows as its ``tx_changes``), or None. Silver is in commit order, so once the batch is
    merged every mirror holds every transaction up to that one; a transaction split across
    batches (a big one) is passed over until a later one ends a batch whole."""
    if not batch.num_rows:
        return None
    counts = batch.group_by("commit_lsn").aggregate([("tx_changes", "max"),
                                                     ("commit_lsn", "count")])
    whole = counts.filter(pc.greater_equal(counts["commit_lsn_count"],
                                           counts["tx_changes_max"]))
    if not whole.num_rows:
        return None
    lsn = pc.max(whole["commit_lsn"]).as_py()
    return lsn, batch.filter(pc.equal(batch["commit_lsn"], lsn))["commit_ts"][0].as_py()


def key_moves(changes: pa.Table, key: tuple[str, ...]) -> list[tuple]:
    """The key-changing UPDATEs among one table's changes, in order: (commit_lsn, seq, old
    key, new key), key values as text."""
    moving = changes.filter(pa.array(_moving(changes, key)))
    if not moving.num_rows:
        return []
    order = np.lexsort((_np(moving["seq"]), _np(moving["commit_lsn"])))
    moving = moving.take(pa.array(order))
    old = list(zip(*[_lookup(_array(moving, "identity"), k).to_pylist() for k in key]))
    new = list(zip(*[_lookup(_array(moving, "columns"), k).to_pylist() for k in key]))
    return [(lsn, seq, o, n) for lsn, seq, o, n in zip(
        moving["commit_lsn"].to_pylist(), moving["seq"].to_pylist(), old, new)]


def in_order_range(changes: pa.Table, lo: tuple[int, int] | None,
                   hi: tuple[int, int] | None) -> pa.Table:
    """The changes ordered from ``lo`` (inclusive) to ``hi`` (exclusive); None: open."""
    lsn, seq = _np(changes["commit_lsn"]), _np(changes["seq"])
    keep = np.ones(changes.num_rows, dtype=bool)
    if lo is not None:
        keep &= (lsn > lo[0]) | ((lsn == lo[0]) & (seq >= lo[1]))
    if hi is not None:
        keep &= (lsn < hi[0]) | ((lsn == hi[0]) & (seq < hi[1]))
    return changes.filter(pa.array(keep))


def after(changes: pa.Table, at: tuple[int, int]) -> pa.Table:
    """The changes ordered after ``at`` (a TRUNCATE's (commit_lsn, seq))."""
    lsn, seq = _np(changes["commit_lsn"]), _np(changes["seq"])
    return changes.filter(pa.array((lsn > at[0]) | ((lsn == at[0]) & (seq > at[1]))))


def _codes(values: pa.Array) -> np.ndarray:
    """Integer codes of a text column (equal text, equal code; NULL: -1)."""
    return _np(pc.fill_null(pc.dictionary_encode(values).indices, -1)).astype(np.int64)


def net_changes(changes: pa.Table, key: tuple[str, ...], key_moves: bool = True
                 ) -> pa.Table:
    """One table's changes (ops I, U, D, R) netted to one row per key: ``_key`` (struct of
    the key's text values), ``_exists`` (False: delete it), ``_values`` (column → text of
    every column some change after the last delete carried; later changes win), ``_from``
    (the old key when the row's state begins with an UPDATE that moved it there), ``_lsn``
    / ``_ts`` (its newest change). ``key_moves=False``: no change moves a row (the caller
    checked), so the old key's values before a move are not looked for."""
    changes = changes.combine_chunks()
    identity, columns = _array(changes, "identity"), _array(changes, "columns")
    moved = _moving(changes, key)
    deletes = _np(pc.fill_null(pc.equal(changes["op"], "D"), False))
    old_rows, new_rows = np.nonzero(deletes | moved)[0], np.nonzero(~deletes)[0]
    n_old = len(old_rows)
    # Events: a delete of the old key (DELETE, a moving UPDATE), an upsert of the new key.
    rows = np.concatenate([old_rows, new_rows])
    sub = np.concatenate([np.zeros(n_old, np.int8), np.ones(len(new_rows), np.int8)])
    upsert = sub == 1
    moved_in = np.concatenate([np.zeros(n_old, bool), moved[new_rows]])
    keys = [pa.concat_arrays([_lookup(identity, k).take(pa.array(old_rows)),
                              _lookup(columns, k).take(pa.array(new_rows))])
            for k in key]
    lsn, seq = _np(changes["commit_lsn"])[rows], _np(changes["seq"])[rows]
    order = np.lexsort((sub, seq, lsn, *[_codes(k) for k in reversed(keys)]))
    rows, upsert, moved_in, lsn, seq = (a[order] for a in (rows, upsert, moved_in, lsn, seq))
    keys = [k.take(pa.array(order)) for k in keys]
    codes = np.stack([_codes(k) for k in keys]) if keys else np.zeros((0, len(rows)))
    events = len(rows)
    starts_mask = np.ones(events, dtype=bool)
    if events:
        starts_mask[1:] = (codes[:, 1:] != codes[:, :-1]).any(axis=0)
    starts = np.nonzero(starts_mask)[0]
    group = np.cumsum(starts_mask) - 1
    groups = len(starts)
    ends = np.r_[starts[1:], events] - 1 if groups else starts
    position = np.arange(events)
    # A delete, or the arrival of a moved row, starts the row's state afresh.
    reset = ~upsert | moved_in
    last_reset = np.full(groups, -1)
    np.maximum.at(last_reset, group[reset], position[reset])
    live = upsert & (position >= last_reset[group])

    # Each column's value from the last live upsert that carried it.
    live_at = np.nonzero(live)[0]
    names, texts, parent = _entries(columns.take(pa.array(rows[live_at])))
    # Entries come in event order, so a (row, column)'s last entry is its newest value:
    # ``np.unique`` of the reversed (row, column) numbers finds it, in row-major order.
    name_codes = _codes(names)
    slot = group[live_at[parent]] * (int(name_codes.max(initial=0)) + 1) + name_codes
    _, first_from_end = np.unique(slot[::-1], return_index=True)
    kept = len(slot) - 1 - first_from_end
    offsets = np.r_[0, np.cumsum(np.bincount(group[live_at[parent[kept]]],
                                             minlength=groups))]
    values = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), names.take(pa.array(kept)),
                                     texts.take(pa.array(kept)))

    from_rows = np.where(last_reset >= 0, last_reset, 0)
    from_moved = (last_reset >= 0) & moved_in[from_rows]
    key_type = pa.struct([pa.field(k, pa.string()) for k in key])
    source_rows = pa.array(rows[from_rows])
    moved_from = pa.StructArray.from_arrays(
        [_lookup(identity, k).take(source_rows) for k in key], fields=list(key_type),
        mask=pa.array(~from_moved))
    if key_moves and from_moved.any():
        values = _inherit(values, identity, columns, key, rows, starts, ends, upsert,
                          moved_in, lsn, seq, keys, last_reset, from_moved)
    lsn_max = np.maximum.reduceat(lsn, starts) if groups else lsn
    return pa.table({
        "_key": pa.StructArray.from_arrays([k.take(pa.array(starts)) for k in keys],
                                           fields=list(key_type)),
        "_exists": pa.array(upsert[ends]),
        "_values": values,
        "_from": moved_from,
        "_lsn": pa.array(lsn_max, pa.int64()),
        "_ts": _array(changes, "commit_ts").take(pa.array(rows[ends])),
    })


def column_values(final: pa.Table, names: list[str]) -> pa.Table:
    """``net_changes``'s rows with ``_values`` spread into flat columns, per ``names[i]``:
    ``__lakecdc_text_<i>`` (its text; NULL where not set or NULL) and ``__lakecdc_has_<i>``
    (whether the row sets it). Flat strings cross into Spark and are typed there cheaper
    than a map: a catch-up batch of 48,380 rows took 3.1 s to type from maps, 1.6-1.9 s
    from flat columns (2 cores, beside another table's)."""
    values = _array(final, "_values")
    entry_names, texts, parent = _entries(values)
    encoded = pc.dictionary_encode(entry_names)
    code_of = {name: i for i, name in enumerate(encoded.dictionary.to_pylist())}
    codes = _np(encoded.indices)
    out = final.drop_columns(["_values"])
    rows = final.num_rows
    for i, name in enumerate(names):
        at = np.nonzero(codes == code_of[name])[0] if name in code_of else np.zeros(0, int)
        has = np.zeros(rows, dtype=bool)
        has[parent[at]] = True
        entry = np.zeros(rows, dtype=np.int64)
        entry[parent[at]] = at
        out = out.append_column(f"{TEXT_PREFIX}{i}", texts.take(pa.array(entry, mask=~has)))
        out = out.append_column(f"{HAS_PREFIX}{i}", pa.array(has))
    return out


def _inherit(values: pa.MapArray, identity: pa.Array, columns: pa.Array, key, rows, starts,
             ends, upsert, moved_in, lsn, seq, keys, last_reset, from_moved) -> pa.Array:
    """A moved row takes the columns its UPDATE left out from the old key's values in the
    batch before the move (and, in ``merge_source``, from the mirror's old row). Only the
    moved rows are visited, in Python: key moves are rare."""
    texts = [k.to_pylist() for k in keys]
    group_of = {tuple(t[s] for t in texts): g for g, s in enumerate(starts)}
    out = values.to_pylist()
    for g in np.nonzero(from_moved)[0]:
        at_event = last_reset[g]
        row = rows[at_event]
        old = tuple(_lookup(identity.slice(row, 1), k)[0].as_py() for k in key)
        before: dict = {}
        src = group_of.get(old)
        if src is not None:
            for e in range(starts[src], ends[src] + 1):
                if (lsn[e], seq[e]) >= (lsn[at_event], seq[at_event]):
                    break
                carried = dict(columns[int(rows[e])].as_py() or []) if upsert[e] else {}
                before = carried if (not upsert[e] or moved_in[e]) else {**before, **carried}
        mine = dict(out[g])
        out[g] = list({**{k: v for k, v in before.items() if k not in mine}, **mine}.items())
    return pa.array(out, TEXT_MAP)
