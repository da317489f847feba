"""bronze → silver as pure Arrow transforms: wal2json v2 text to typed change rows.

``parse_table(bronze, known_tables, counted_tables)`` contract (an Arrow table of bronze
rows in, ``SILVER_CHANGES`` out):

- **One row out per row in**, in the same order, never filtered, keyed by bronze's
  ``(commit_lsn, seq)`` and carrying ``tx_changes``, so a reader can tell when it holds a
  whole transaction.
- **Deterministic**: the output depends only on the bronze row and ``known_tables``. A
  replayed micro-batch produces the same rows, which is what lets a write's skip of an
  already-committed batch be exact.
- **Never raises on data**. A row that cannot be trusted gets ``error`` set and ``op`` and
  every parsed column NULL (so ``op IS NULL`` ⇔ ``error IS NOT NULL``); its raw JSON goes to
  quarantine through ``quarantine_table``, which takes the failed rows of the same parse.

``parse_changes`` and ``quarantine_rows`` are the same transform over a Spark DataFrame
(``mapInArrow``: each task parses its own rows), for batch jobs (``backfill
reprocess-silver``) and notebooks. The stream parses on the driver (``silver.writer``).

Why Arrow and not Spark expressions: the same parse in Spark (``from_json``, maps built
with ``map_from_arrays``, the checks as column expressions) cost about 45 CPU-µs a row,
the biggest part of a catch-up; this one costs about a fifth of that (figures in
docs/silver.md, "Parsing").

Which rows fail, and which are carried through (messages, truncates, added columns, numeric
``NaN``): docs/silver.md, "Quarantine policy". The ``error`` texts, first match wins, are
``_errors`` below. A change of a counted table that gold cannot attribute (no id or dims, an
identity without them) fails here so that gold stops loudly rather than count NULL dims
(docs/gold.md); other captured tables need no such columns. Snapshot reads (op ``R``) are
parsed and checked like inserts; gold counts them 0.

Numbers and booleans: wal2json 2.5 writes numerics, integers and booleans as bare JSON
values, and a JSON reader that types them loses what Postgres printed (a double cannot hold
``12345678901234567890.123456789012345``; ``1.50`` would become ``1.5``). So bare scalar
column values are quoted in the text first and reach silver exactly as Postgres printed
them. (wal2json 2.5 prints numeric NaN/±Infinity as ``null``; a bare ``NaN`` from elsewhere
is carried as the text ``NaN``.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

from core.captured import IDENTITY_COLUMNS
from silver.schema import SILVER_CHANGES, SILVER_QUARANTINE

CHANGE_ACTIONS = ("I", "U", "D", "T", "R")    # R: a snapshot backfill read
WRITE_ACTIONS = ("I", "U", "R")                 # carry the new row in ``columns``
MESSAGE_ACTION = "M"
KEY_COLUMNS = IDENTITY_COLUMNS      # id + the four dims, new (I/U/R) and old (identity)
# The bronze columns the parse reads (framing copied through, and the JSON).
BRONZE_COLUMNS = ("commit_lsn", "seq", "tx_changes", "xid", "lsn", "commit_ts", "action",
                  "shipped_at", "data")
CHANGES_ARROW = to_arrow_schema(SILVER_CHANGES)
QUARANTINE_ARROW = to_arrow_schema(SILVER_QUARANTINE)
# Rows parsed per JSON read: the unit of parallel work, and of the row-by-row retry a
# malformed row causes.
CHUNK_ROWS = 4096

_COLUMN = pa.struct([("name", pa.string()), ("type", pa.string()), ("value", pa.string())])
_DOCUMENT = pa.struct([("action", pa.string()), ("schema", pa.string()),
                       ("table", pa.string()), ("columns", pa.list_(_COLUMN)),
                       ("identity", pa.list_(_COLUMN)), ("transactional", pa.bool_()),
                       ("prefix", pa.string()), ("content", pa.string())])
# Each row's JSON as member ``_d`` of an object that carries its index (``_documents``).
_ROW, _DOC = "_r", "_d"
_NUMBERED = pa.schema([(_ROW, pa.int64()), (_DOC, _DOCUMENT)])

# A bare JSON scalar (number, NaN, Infinity, true, false) as the value of a "value" key. In
# wal2json v2 "value" is only ever a key of a column object, and the text `"value":` cannot
# occur inside a JSON string (its quotes would be escaped), so only column values are
# touched. wal2json writes no whitespace there; text with some is quoted by the row-by-row
# retry (``_WHITESPACE_VALUE``), where the whole-chunk read failed on it.
_BARE_VALUE = r'"value":(-?[0-9][0-9.eE+\-]*|NaN|-?Infinity|true|false)([,}])'
_WHITESPACE_VALUE = (r'"value":\s*(-?[0-9][0-9.eE+\-]*|NaN|-?Infinity|true|false)'
                     r'(\s*[,}])')
_QUOTED_VALUE = r'"value":"\1"\2'


def parse_table(bronze: pa.Table, known_tables: Iterable[str],
                counted_tables: Iterable[str] | None = None) -> pa.Table:
    """Bronze rows (``BRONZE_COLUMNS`` at least) as silver change rows (``CHANGES_ARROW``),
    row for row. ``counted_tables``: the known tables whose changes must carry ``id`` and
    the dims (gold counts them); None: every known table."""
    tables = _Tables(tuple(known_tables),
                     None if counted_tables is None else tuple(counted_tables))
    chunks = [bronze.slice(at, CHUNK_ROWS) for at in range(0, bronze.num_rows, CHUNK_ROWS)]
    if len(chunks) <= 1:
        return _parse_chunk(bronze, tables)
    with ThreadPoolExecutor(2, thread_name_prefix="lakecdc-parse") as pool:
        return pa.concat_tables(pool.map(lambda chunk: _parse_chunk(chunk, tables), chunks))


def quarantine_table(bronze: pa.Table, parsed: pa.Table) -> pa.Table:
    """The rows ``parse_table`` failed (``parsed`` is its result for ``bronze``), with their
    raw JSON and the error (``QUARANTINE_ARROW``)."""
    failed = pc.is_valid(parsed.column("error"))
    rows = bronze.filter(failed)
    columns = {name: (parsed.column("error").filter(failed) if name == "error"
                      else rows.column(name)) for name in QUARANTINE_ARROW.names}
    return pa.table(columns).cast(QUARANTINE_ARROW)


def parse_changes(bronze: DataFrame, known_tables: Iterable[str],
                  counted_tables: Iterable[str] | None = None) -> DataFrame:
    """``parse_table`` over a Spark DataFrame of bronze rows (``SILVER_CHANGES``)."""
    known, counted = _sets(known_tables, counted_tables)

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from parse_table(pa.Table.from_batches([batch]), known,
                                   counted).to_batches()

    return bronze.select(*BRONZE_COLUMNS).mapInArrow(parse, SILVER_CHANGES)


def quarantine_rows(bronze: DataFrame, known_tables: Iterable[str],
                    counted_tables: Iterable[str] | None = None) -> DataFrame:
    """``quarantine_table`` over a Spark DataFrame of bronze rows (``SILVER_QUARANTINE``):
    exactly the rows of ``parse_changes`` with ``error`` set."""
    known, counted = _sets(known_tables, counted_tables)

    def failed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = pa.Table.from_batches([batch])
            yield from quarantine_table(rows, parse_table(rows, known, counted)).to_batches()

    return bronze.select(*BRONZE_COLUMNS).mapInArrow(failed, SILVER_QUARANTINE)


def _sets(known_tables, counted_tables) -> tuple:
    return tuple(known_tables), None if counted_tables is None else tuple(counted_tables)


class _Tables:
    """The captured tables as Arrow value sets."""

    def __init__(self, known: tuple[str, ...], counted: tuple[str, ...] | None) -> None:
        self.known = pa.array(known, pa.string())
        self.counted = None if counted is None else pa.array(counted, pa.string())


def _parse_chunk(bronze: pa.Table, tables: _Tables) -> pa.Table:
    n = bronze.num_rows
    doc = _documents(bronze.column("data").combine_chunks())
    action, schema, table, columns, identity, _, prefix, content = doc.flatten()
    new = _NameMap(columns, n)
    old = _NameMap(identity, n)
    error = _errors(bronze.column("action").combine_chunks(), doc, action, schema, table,
                    columns, identity, new, old, tables)
    ok = np.asarray(pc.is_null(error))
    change = _np(pc.is_in(action, value_set=pa.array(CHANGE_ACTIONS)))
    message = _np(pc.equal(action, MESSAGE_ACTION))
    # The types of the new row's columns, else of the identity's (a delete).
    types = _pick(np.asarray(pc.is_valid(columns)), new.types(), old.types())
    parsed = {
        "op": action,
        "schema_name": _where(change, schema),
        "table_name": _where(change, table),
        **{c: new.value(c) for c in KEY_COLUMNS},
        **{f"old_{c}": old.value(c) for c in KEY_COLUMNS},
        "columns": new.values(),
        "message_prefix": _where(message, prefix),
        "message_content": _where(message, content),
        "identity": old.values(),
        "column_types": types,
    }
    out = {}
    for field in CHANGES_ARROW:
        if field.name == "error":
            out["error"] = error
        elif field.name in parsed:
            # Everything parsed is NULL on a failed row: consumers filter on one column.
            out[field.name] = _where(ok, parsed[field.name])
        else:
            out[field.name] = bronze.column(field.name)
    return pa.table(out).cast(CHANGES_ARROW)


def _documents(data: pa.StringArray) -> pa.StructArray:
    """Each row's JSON as a ``_DOCUMENT`` struct; NULL where it is not one JSON object of
    that shape.

    One JSON read per chunk: every row's text is wrapped with its index (``{"_r":i,"_d":``
    text ``}``) and the wrappers are read back to back. The chunk is taken as read only if
    it yields exactly the wrappers ``0 … n-1`` in order: text that is not one object
    (empty, ``null``, two objects, a truncated one) breaks that or the read, and the chunk
    is then read row by row (``_one_by_one``), so a bad row never shifts another. (Wrapping
    copies each row once; cutting its ``{`` to put the index inside it cost as much again.)
    """
    n = len(data)
    if n == 0:
        return pa.array([], _DOCUMENT)
    data = data.fill_null("")
    index = pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string())
    numbered = pc.binary_join_element_wise('{"_r":', index, ',"_d":', data, "}", "")
    numbered = pc.replace_substring_regex(numbered, _BARE_VALUE, _QUOTED_VALUE)
    offsets = np.frombuffer(numbered.buffers()[1], np.int32, n + 1, numbered.offset * 4)
    text = numbered.buffers()[2][offsets[0]:offsets[-1]]
    try:
        read = _read(text, _NUMBERED)
    except pa.ArrowInvalid:
        read = None
    if read is not None and read.num_rows == n and \
            read.column(_ROW).null_count == 0 and \
            np.array_equal(read.column(_ROW).to_numpy(), np.arange(n)):
        return read.column(_DOC).combine_chunks().cast(_DOCUMENT)
    return _one_by_one(data)


def _one_by_one(data: pa.StringArray) -> pa.StructArray:
    """Each row read on its own: NULL unless its text (blanks around it aside) is exactly
    one JSON object of the ``_DOCUMENT`` shape."""
    texts = pc.replace_substring_regex(data, _WHITESPACE_VALUE, _QUOTED_VALUE).to_pylist()
    docs = []
    for text in texts:
        text = (text or "").strip()
        doc = pa.nulls(1, _DOCUMENT)
        # Only text starting with an object is read: Arrow's reader must never start on a
        # bare top-level `null` (pyarrow 26 crashes on it).
        if text.startswith("{"):
            try:
                read = _read(pa.py_buffer(text.encode()), pa.schema(list(_DOCUMENT)))
            except pa.ArrowInvalid:
                read = None
            if read is not None and read.num_rows == 1:
                doc = read.to_struct_array().combine_chunks().cast(_DOCUMENT)
        docs.append(doc)
    return pa.concat_arrays(docs)


def _read(text: pa.Buffer, schema: pa.Schema) -> pa.Table:
    return pj.read_json(
        pa.BufferReader(text),
        read_options=pj.ReadOptions(use_threads=False, block_size=max(text.size, 1 << 16) + 1),
        parse_options=pj.ParseOptions(explicit_schema=schema, newlines_in_values=True,
                                      unexpected_field_behavior="ignore"))


class _NameMap:
    """A ``[{name, type, value}, ...]`` list per row as name → value and name → type maps;
    NULL where the list is NULL, or where names are missing or repeat."""

    def __init__(self, entries: pa.ListArray, n: int) -> None:
        self.n = n
        parent = np.asarray(pc.list_parent_indices(entries))
        names, types, values = entries.flatten().flatten()
        bad = np.zeros(n, bool)
        unnamed = _np(pc.is_null(names))
        bad[parent[unnamed]] = True
        encoded = pc.dictionary_encode(names)
        codes = np.asarray(encoded.indices.fill_null(-1))
        key = parent * (len(names) + 1) + codes + 1
        distinct, counts = np.unique(key, return_counts=True)
        bad[distinct[counts > 1] // (len(names) + 1)] = True
        self.ok = _np(pc.is_valid(entries)) & ~bad
        keep = self.ok[parent]
        self.parent = parent[keep]
        self.names = names.filter(pa.array(keep))
        self._codes, self._dictionary = codes[keep], encoded.dictionary
        self._types = types.filter(pa.array(keep))
        self._values = values.filter(pa.array(keep))
        counts = np.bincount(self.parent, minlength=n).astype(np.int32)
        self.offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        self._found: dict[str, pa.Array] = {}

    def values(self) -> pa.MapArray:
        return self._map(self._values)

    def types(self) -> pa.MapArray:
        return self._map(self._types)

    def _map(self, items: pa.Array) -> pa.MapArray:
        return pa.MapArray.from_arrays(self.offsets, self.names, items,
                                       mask=pa.array(~self.ok))

    def value(self, name: str) -> pa.Array:
        """The value of column ``name`` per row (NULL where absent or the map is)."""
        if name not in self._found:
            code = self._dictionary.index(name).as_py()
            found = (self._codes == code) if code >= 0 else np.zeros(len(self._codes), bool)
            at = np.full(self.n, -1, np.int64)
            at[self.parent[found]] = np.flatnonzero(found)
            self._found[name] = self._values.take(pa.array(at, mask=at < 0))
        return self._found[name]

    def missing(self, row: int) -> list[str]:
        """The key columns row ``row`` has no value for."""
        return [c for c in KEY_COLUMNS if not self.value(c)[row].is_valid]


def _errors(bronze_action, doc, action, schema, table, columns, identity,
            new: _NameMap, old: _NameMap, tables: _Tables) -> pa.Array:
    """Each row's error text (NULL if none): the first rule that matches, in this order.
    Every test is NULL-safe: a NULL never lets a bad row through as a good one."""
    n = len(action)
    change = _np(pc.is_in(action, value_set=pa.array(CHANGE_ACTIONS)))
    writes = _np(pc.is_in(action, value_set=pa.array(WRITE_ACTIONS)))
    qualified = pc.binary_join_element_wise(schema, table, ".")
    keyed = np.ones(n, bool) if tables.counted is None else \
        _np(pc.is_in(qualified, value_set=tables.counted))
    has_identity = np.asarray(pc.is_valid(identity))
    sized = {name: np.asarray(pc.fill_null(pc.list_value_length(entries), 0)) > 0
             for name, entries in (("columns", columns), ("identity", identity))}
    new_set, old_set = _all_set(new), _all_set(old)
    a, q, b = (_Texts(x) for x in (action, qualified, bronze_action))
    rules = [
        (~np.asarray(pc.is_valid(doc)), lambda i: "malformed JSON"),
        (~np.asarray(pc.is_valid(action)), lambda i: "no action in JSON"),
        (~_np(pc.equal(action, bronze_action)),
         lambda i: f"JSON action {a[i]} differs from bronze action {b[i]}"),
        (~change & (~_np(pc.equal(action, MESSAGE_ACTION))),
         lambda i: f"unknown action {a[i]}"),
        (change & (~np.asarray(pc.is_valid(schema)) | ~np.asarray(pc.is_valid(table))),
         lambda i: "change without schema or table"),
        (change & ~_np(pc.is_in(qualified, value_set=tables.known)),
         lambda i: f"unknown table {q[i]}"),
        (writes & ~sized["columns"], lambda i: f"{a[i]} without columns"),
        (_np(pc.equal(action, "D")) & ~sized["identity"], lambda i: "D without identity"),
        (writes & ~new.ok, lambda i: "duplicate or unnamed column in columns"),
        (has_identity & ~old.ok, lambda i: "duplicate or unnamed column in identity"),
        (writes & keyed & ~new_set,
         lambda i: f"{a[i]} without {', '.join(new.missing(i))} in columns"),
        (_np(pc.is_in(action, value_set=pa.array(["U", "D"]))) & keyed & has_identity
         & ~old_set,
         lambda i: f"{a[i]} identity lacks {', '.join(old.missing(i))}: the replica "
                   "identity must cover id and the dims"),
    ]
    texts: list[str | None] = [None] * n
    open_ = np.ones(n, bool)
    for matches, text in rules:
        for i in np.flatnonzero(matches & open_):
            texts[i] = text(i)
        open_ &= ~matches
        if not open_.any():
            break
    return pa.array(texts, pa.string())


class _Texts:
    """An Arrow string array's values as Python text, converted on first use (only rows
    that fail need them)."""

    def __init__(self, values: pa.Array) -> None:
        self._values, self._list = values, None

    def __getitem__(self, i: int):
        if self._list is None:
            self._list = self._values.to_pylist()
        return self._list[i]


def _all_set(names: _NameMap) -> np.ndarray:
    """Every key column has a value (in a well-formed map)."""
    found = np.ones(names.n, bool)
    for c in KEY_COLUMNS:
        found &= np.asarray(pc.is_valid(names.value(c)))
    return found


def _np(mask: pa.Array) -> np.ndarray:
    """A boolean Arrow array as numpy, NULL as False."""
    return np.asarray(pc.fill_null(mask, False))


def _where(keep: np.ndarray, values: pa.Array) -> pa.Array:
    """``values`` where ``keep``, NULL elsewhere."""
    if keep.all():
        return values
    return pc.if_else(pa.array(keep), values, pa.nulls(len(values), values.type))


def _pick(first: np.ndarray, a: pa.Array, b: pa.Array) -> pa.Array:
    """``a`` where ``first``, else ``b``, row by row."""
    at = np.arange(len(a)) + np.where(first, 0, len(a))
    return pa.concat_arrays([a, b]).take(pa.array(at))
