"""A big mirror's tail of changes not merged yet, and the mirror's current rows from its
table and that tail. Pure Arrow, but for ``read_mirror`` (delta-rs, no Spark): the
mirrors' stores (``silver.mirrors.store``) write and drain the tail, and every reader of a
mirror's current rows overlays it.

A copy-on-write MERGE rewrites every file a batch's keys land in: with updates spread over
the whole table, nearly the whole table, every batch, so its cost grows with the table
(docs/silver.md, "Big mirrors"). A mirror whose MERGE takes
longer than ``LAKECDC_MIRROR_MERGE_S`` is therefore kept merge-on-read:

- each batch appends its MERGE source (``silver.mirrors.typed_rows.typed_rows``: one row
  per key, with ``__lakecdc_exists`` and the ``__lakecdc_has_<i>`` flags) to the tail, a
  Delta table at ``<mirror>/_lakecdc_pending`` (``TAIL_DIR``; every Delta reader and vacuum
  passes over a folder whose name starts with ``_``), with the batch's ``_lakecdc_version``
  (its app transaction's version: batch id and part);
- ``net_tail`` nets the tail to one MERGE source row per key, in version order, and
  the store MERGEs that into the mirror's table now and then, in the background (drains
  take at most ``DRAIN_SHARE`` of the time), then drops the rows it drained from the tail;
- ``current_rows``: the mirror's table with the tail laid over it, which is what the MERGE
  would have made.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.storage import delta_rs_uri
from silver.mirrors.mirror_table import (
    COMMIT_LSN,
    COMMIT_TS,
    EXISTS,
    HAS_PREFIX,
    mirror_shape_of,
    mirrored_columns,
)

# The tail's folder in its mirror's: the on-disk name is kept ("pending") for existing
# lakehouses, whose mirrors hold their tails there.
TAIL_DIR = "_lakecdc_pending"
VERSION = "_lakecdc_version"
DRAIN_SHARE = 0.1        # the most of the mirrors' time drains take (``RsMirrors.drain_due``)
MAX_TAIL_ROWS = 1_000_000    # a tail this long is drained at once: its drain reads it whole


def tail_path(mirror: str) -> str:
    """Where the tail of the mirror at ``mirror`` lives."""
    return f"{mirror.rstrip('/')}/{TAIL_DIR}"


def net_tail(rows: pa.Table, key: tuple[str, ...], others: list[str]) -> pa.Table:
    """The tail's rows (MERGE source rows with ``_lakecdc_version``) netted to one MERGE
    source row per key: the key's last row in version order decides whether it exists and
    its commit; each column takes the value of the last row that carried it (``has``), and
    is unset where none did (the MERGE keeps the mirror's value), or NULL where none did
    since the key was last deleted in the tail. Pure."""
    names = [*key, *[c for i, n in enumerate(others) for c in (n, f"{HAS_PREFIX}{i}")],
             EXISTS, COMMIT_LSN, COMMIT_TS]
    if rows.num_rows == 0:
        return rows.select([n for n in rows.schema.names if n != VERSION])
    order = pc.sort_indices(rows, [(k, "ascending") for k in key] + [(VERSION, "ascending")])
    t = rows.take(order)
    n = t.num_rows
    first = np.zeros(n, dtype=bool)
    first[0] = True
    for k in key:
        column = t[k].combine_chunks()
        first[1:] |= pc.not_equal(column[1:], column[:-1]).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], n] - 1
    last = pa.array(ends)
    out = {k: t[k].take(last) for k in key}
    position = np.arange(n)
    exists = t[EXISTS].fill_null(False).to_numpy(zero_copy_only=False)
    # A key deleted in the tail and made again: the table's row is not its row any more.
    gone = np.maximum.accumulate(np.where(exists, -1, position))[ends]
    since = np.maximum(gone + 1, starts)
    for i, name in enumerate(others):
        has = t[f"{HAS_PREFIX}{i}"].fill_null(False).to_numpy(zero_copy_only=False)
        carried = np.maximum.accumulate(np.where(has, position, -1))[ends]
        found = carried >= since          # a row of this key carried it, since it was made
        value = t[name].take(pa.array(np.where(found, carried, ends)))
        out[name] = pc.if_else(pa.array(found), value, pa.nulls(len(ends), value.type))
        out[f"{HAS_PREFIX}{i}"] = pa.array(found | (gone >= starts))
    for name in names[len(key) + 2 * len(others):]:
        out[name] = t[name].take(last)
    return pa.table(out).select(names)


def current_rows(base: pa.Table, tail: pa.Table | None, key: tuple[str, ...],
                 others: list[str]) -> pa.Table:
    """The mirror's rows: ``base`` (its table) with ``tail`` (its tail's rows, or None) laid
    over it as its MERGE would (``silver.mirrors.merge.merge_clauses``): a key whose netted
    row does not exist is gone; one that exists takes each column the tail carried, the
    table's value for the others. In ``base``'s columns; pure."""
    if tail is None or tail.num_rows == 0:
        return base
    netted = net_tail(tail, key, others)
    types = {n: base.schema.field(n).type for n in base.schema.names}
    at = "__lakecdc_at"
    pairs = (pa.table({k: netted[k].cast(types[k]) for k in key}).append_column(at + "f", pa.array(
        np.arange(netted.num_rows)))
        .join(base.select(list(key)).append_column(at + "b", pa.array(
            np.arange(base.num_rows))), keys=list(key), join_type="left outer")
        .sort_by(at + "f"))
    f, b = pairs[at + "f"].combine_chunks(), pairs[at + "b"].combine_chunks()
    named = np.zeros(base.num_rows, dtype=bool)
    named[b.drop_null().to_numpy()] = True
    live = pc.filter(pa.array(np.arange(len(f))), netted[EXISTS].take(f))
    f, b = f.take(live), b.take(live)
    columns = {}
    for name, type_ in types.items():
        if name not in netted.schema.names:           # a column the tail does not have yet
            columns[name] = pa.nulls(len(f), type_) if name not in others else \
                base[name].take(b).cast(type_)
            continue
        value = netted[name].take(f).cast(type_)
        if name in others:
            value = pc.if_else(netted[f"{HAS_PREFIX}{others.index(name)}"].take(f), value,
                               base[name].take(b).cast(type_))
        columns[name] = value
    return pa.concat_tables([base.filter(pa.array(~named)),
                             pa.table(columns, schema=base.schema)])


def tail_schema(base: pa.Schema, key: tuple[str, ...], others: list[str]) -> pa.Schema:
    """The tail's columns for a mirror table of columns ``base``: the MERGE source's, typed
    as the mirror's, and ``_lakecdc_version``. Pure."""
    fields = [base.field(k) for k in key]
    for i, name in enumerate(others):
        fields += [base.field(name), pa.field(f"{HAS_PREFIX}{i}", pa.bool_())]
    return pa.schema([*fields, pa.field(EXISTS, pa.bool_()), base.field(COMMIT_LSN),
                      base.field(COMMIT_TS), pa.field(VERSION, pa.int64())])


def as_tail(rows: pa.Table, schema: pa.Schema, version: int) -> pa.Table:
    """A MERGE source's ``rows`` as tail rows of ``schema`` (``tail_schema``), at
    ``version``. Pure."""
    rows = rows.append_column(VERSION, pa.array(np.full(rows.num_rows, version, np.int64)))
    return rows.select(schema.names).cast(schema)


def drop_tail(path: str, storage_options: dict | None, commit) -> None:
    """(delta-rs) Empty the tail of the mirror at ``path``, if it has one, unmerged, with
    ``commit`` (``CommitProperties``): its table was replaced (a load's first chunk, a
    seed)."""
    from deltalake import DeltaTable, write_deltalake

    uri = delta_rs_uri(tail_path(path))
    if DeltaTable.is_deltatable(uri, storage_options=storage_options):
        tail = DeltaTable(uri, storage_options=storage_options)
        write_deltalake(tail, pa.schema(tail.schema().to_arrow()).empty_table(),
                        mode="overwrite", commit_properties=commit)


def read_mirror(path: str, storage_options: dict | None = None,
                columns: list[str] | None = None, where=None) -> pa.Table:
    """(delta-rs) A mirror's current rows: its table with its tail laid over it
    (``mirror_of``). The tail is read first: a drain empties it only after the table holds
    its rows."""
    from deltalake import DeltaTable

    tail_uri = delta_rs_uri(tail_path(path))
    tail = (DeltaTable(tail_uri, storage_options=storage_options)
            if DeltaTable.is_deltatable(tail_uri, storage_options=storage_options) else None)
    rows = None if tail is None else tail.to_pyarrow_dataset().to_table(filter=where)
    return mirror_of(DeltaTable(delta_rs_uri(path), storage_options=storage_options), rows,
                     columns, where)


def mirror_of(table, tail: pa.Table | None, columns: list[str] | None = None,
              where=None) -> pa.Table:
    """The current rows of the mirror whose table is ``table`` (delta-rs, opened or brought
    up to date after ``tail``, its tail's rows, was read); ``columns``: only these
    besides the key; ``where``: a pyarrow expression over the key's columns only (a column
    the tail may change cannot filter the table), or False: none of the table's rows (the
    tail's rows alone, their columns as the tail last carried them)."""
    key, types = mirror_shape_of(table.metadata().configuration)
    wanted = None if columns is None else [*key, *[c for c in columns if c not in key]]
    if where is False:      # the tail's rows alone (a probe's cheap look), in its columns
        schema = pa.schema(table.schema().to_arrow())
        base = schema.empty_table() if wanted is None else \
            pa.schema([schema.field(n) for n in wanted]).empty_table()
    else:
        base = table.to_pyarrow_dataset().to_table(columns=wanted, filter=where)
    return current_rows(base, tail, key, mirrored_columns(key, types))
