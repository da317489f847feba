"""A captured table's current rows straight into its mirror (``lakecdc tables add``), by
key-range chunks, while the change stream goes on (docs/source-tables.md, "Adding and
removing tables while running").

Why it is exact without watermarks: every change of the table committed from ``floor`` on
is in bronze (the shipper took up the set that captures it), and each chunk is read in a
snapshot taken after ``floor``. The mirrors' query holds the table's changes back while the
load runs, then applies every one from ``floor`` on, in order, onto the loaded rows
(``silver.mirrors.mirror_writer.MirrorWriter``, "replay"). For each row, that ends where the
source is: the changes a chunk already saw are applied again, but so is every change after
them, and a column an UPDATE left out (a TOASTed value) keeps what the chunk read, which is
the value no later change touched.

Per chunk (``silver.mirrors.chunk_load``): where it ends, from the key's index (the key
``chunk_rows`` rows on), then one ``COPY`` of that key range (one statement: one short
snapshot, never the whole table's), parsed by Arrow into the mirror's types and appended
to the mirror in one commit whose metadata records the load (``load`` = the table's add,
``after`` = the chunk's last key, ``floor``), so a rerun after a kill goes on after the last
committed chunk. The next chunk is read while one is parsed and written, so memory holds
three chunks at most (one written, one waiting, one being read), whatever the table's
size. The last chunk's commit completes the load: it records the floor as the mirror's
start, as the app transaction ``lakecdc-mirror-load`` (and metadata ``seed``); the mirrors'
query then applies the held changes and records that too, as ``lakecdc-mirror-replayed``
(``silver.mirrors.merge.due_replay``).

Whether the load is complete is read from that app transaction, which every checkpoint
carries, so it is known after log cleanup too. Where the next chunk starts is read from
the load's newest commit's metadata: that is only read while the table is loading, when
nothing cleans its log (its writers' own cleanup is off from its creation, and
maintenance passes over a table being loaded); were it gone, the load would start again
from its first chunk, which replaces the mirror's rows: slower, as exact.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import psycopg
import pyarrow as pa

from core.commits import Commit, commit_metadata
from core.config import READER_RETENTION_MINUTES
from core.engine.api import Engine
from core.errors import UserError
from core.postgres import connect, table_rows
from core.progress import ProgressBar
from core.switches import NONE, Switches
from silver.mirrors.chunk_load import (
    READ_SETTINGS,
    chunk_copy,
    chunk_end,
    load_column,
    parse_chunk,
)
from silver.mirrors.mirror_table import (
    COMMIT_LSN,
    COMMIT_TS,
    KEY_PROPERTY,
    LOAD_APP_ID,
    TYPES_PROPERTY,
    TableSpec,
    mirror_properties,
)
from silver.mirrors.tail import tail_path
from silver.mirrors.type_map import arrow_type

DEFAULT_CHUNK_ROWS = 100_000
HISTORY = 50                 # newest mirror commits searched for the load's last chunk
READ_TIMEOUT_S = 600         # one chunk's COPY


@dataclass
class LoadReport:
    rows: int                # in the mirror from this load, all invocations
    chunks: int
    new_rows: int            # read by this invocation
    seconds: float
    complete: bool
    floor: int


@dataclass(frozen=True)
class LoadState:
    """What the mirror records of load ``run``: chunks committed, rows, where the next
    chunk starts, its floor, and whether the load is complete."""

    chunks: int = 0
    rows: int = 0
    after: list[str] | None = None
    floor: int | None = None
    complete: bool = False


def load_state(history: list[Commit], run: int) -> LoadState:
    """The newest commit of load ``run`` among ``history`` (the mirror's commits, newest
    first, with their ``mirror`` metadata), as a ``LoadState``. Pure."""
    for commit in history:
        meta = commit.meta
        if meta is None or meta.get("load") != run:
            continue
        return LoadState(int(meta.get("chunk", 0)), int(meta.get("rows", 0)),
                         meta.get("after"), int(meta["floor"]), bool(meta.get("complete")))
    return LoadState()


class MirrorTarget:
    """The mirror's table at ``path`` (as the configuration names it), written through
    ``engine`` (None: delta-rs with ``storage_options``); created with its log kept
    ``log_retention_minutes`` (``silver.mirrors.mirror_table.mirror_properties``)."""

    def __init__(self, path: str, spec: TableSpec, engine: Engine | None = None,
                 storage_options: dict | None = None,
                 log_retention_minutes: int = READER_RETENTION_MINUTES) -> None:
        if engine is None:
            from core.engine.delta_rs import DeltaRs

            engine = DeltaRs(storage_options)
        self.path, self.spec, self.engine = path, spec, engine
        self.log_retention_minutes = log_retention_minutes
        self.schema = pa.schema([*[(n, arrow_type(t)) for n, t in spec.columns],
                                 (COMMIT_LSN, pa.int64()),
                                 (COMMIT_TS, pa.timestamp("us", tz="UTC"))])

    def ensure(self) -> None:
        """Create the mirror unless it exists; one that exists must have the table's
        columns and key (else one sentence: nothing is written)."""
        self.engine.create(self.path, self.schema,
                           {**mirror_properties(self.log_retention_minutes),
                            KEY_PROPERTY: json.dumps(list(self.spec.key)),
                            TYPES_PROPERTY: json.dumps(dict(self.spec.columns))},
                           comment=f"lakecdc mirror of {self.spec.name}")
        props = self.engine.properties(self.path)
        if (json.loads(props[KEY_PROPERTY]) != list(self.spec.key)
                or json.loads(props[TYPES_PROPERTY]) != dict(self.spec.columns)):
            raise UserError(
                f"the mirror of {self.spec.name} at {self.path} has other columns or another "
                "key than the table has now, so its rows cannot be loaded into it; move it "
                "away (or drop it) and rerun `lakecdc tables add`; nothing was changed.")

    def loaded(self) -> int | None:
        """The floor of the newest complete load the mirror records (its app transaction
        ``LOAD_APP_ID``; None: none)."""
        found = self.engine.recorded(self.path)
        return None if found is None else found.version_of(LOAD_APP_ID)

    def rows(self) -> int:
        """The rows the mirror holds (its files' statistics where they are)."""
        return self.engine.count(self.path) or 0

    def history(self) -> list[Commit]:
        """The mirror's newest ``HISTORY`` commits, newest first (``load_state``)."""
        return self.engine.commits(self.path, "mirror", HISTORY)

    def write(self, rows: pa.Table, meta: str, overwrite: bool,
              app: tuple[str, int] | None = None) -> None:
        """``rows`` in one commit with ``meta`` and ``app``; ``overwrite``: replacing the
        mirror's rows, after its tail (``silver.mirrors.tail``) is emptied, since changes
        of the rows replaced are stale."""
        rows = rows.select(self.schema.names).cast(self.schema)
        tail = tail_path(self.path)
        if overwrite and self.engine.exists(tail):
            self.engine.delete(tail, "true", meta=meta)
        self.engine.append(self.path, rows, meta=meta, app=app, overwrite=overwrite)


def load_mirror(dsn: str, target: MirrorTarget, run: int, floor: int, *,
                chunk_rows: int = DEFAULT_CHUNK_ROWS, stop: threading.Event | None = None,
                switches: Switches = NONE,
                session: Callable[[], object] | None = None,
                numbers_as_text: bool = False) -> LoadReport:
    """Load ``target``'s table into it (see the module's text), or go on with load ``run``
    where it stopped. ``floor``: the first commit LSN whose changes bronze holds for sure
    (a resumed load keeps the floor it started with). ``session``: the Spark session that
    types the columns Arrow does not (bytea, typed arrays), asked for only if there are
    such columns. ``numbers_as_text``: how the slot's wal2json prints numbers, so a NaN or
    ±Infinity is loaded as the change stream gives it (``bronze.table.numbers_as_text``)."""
    started = time.monotonic()
    stop = stop or threading.Event()
    spec = target.spec
    target.ensure()
    state = load_state(target.history(), run)
    floor = state.floor if state.floor is not None else floor
    loaded = target.loaded()
    if state.complete or (loaded is not None and loaded >= floor):
        return LoadReport(state.rows or target.rows(), state.chunks, 0,
                          time.monotonic() - started, True, floor)
    columns = [load_column(n, t, numbers_as_text) for n, t in spec.columns]
    types = dict(spec.columns)
    chunks, rows, new_rows = state.chunks, state.rows, 0
    chunks_q: queue.Queue = queue.Queue(maxsize=1)
    halt = threading.Event()
    reader = threading.Thread(target=_read_chunks, name="lakecdc-load-read", daemon=True,
                              args=(dsn, spec, columns, state.after, chunk_rows,
                                    lambda: stop.is_set() or halt.is_set(), chunks_q))
    reader.start()
    complete = False
    with ProgressBar(f"loading {spec.name}", _estimated_rows(dsn, spec.name)) as shown:
        shown(rows)                                     # a resumed load's chunks so far
        try:
            while not complete:
                item = chunks_q.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:                            # stopped between chunks
                    break
                data, end = item
                try:
                    data = parse_chunk(data, columns)
                except pa.ArrowInvalid as exc:
                    raise _bad_value(spec.name, exc) from None
                spark_typed = {c.name: data[c.name] for c in columns if c.typed}
                if spark_typed:
                    from silver.mirrors.mirror_writer import bad_values_stop
                    from silver.mirrors.typed_rows import typed_texts

                    with bad_values_stop(spec.name):
                        data = _replace(data, typed_texts(session(), spark_typed, types,
                                                          data.num_rows))
                complete = end is None                      # the rest of the table
                chunks, rows = chunks + 1, rows + data.num_rows
                new_rows += data.num_rows
                # The last chunk's commit completes the load: the mirror's start is the floor.
                done = dict(complete=True, seed=floor) if complete else {}
                target.write(data, commit_metadata("mirror", load=run, chunk=chunks, after=end,
                                                   floor=floor, rows=rows, **done),
                             overwrite=chunks == 1, app=(LOAD_APP_ID, floor) if complete else None)
                switches.hit("after_mirror_loaded" if complete else "after_mirror_chunk")
                shown(data.num_rows)
        finally:
            halt.set()
            while reader.is_alive():                        # it may wait to hand over a chunk
                try:
                    chunks_q.get(timeout=0.1)
                except queue.Empty:
                    pass
    return LoadReport(rows, chunks, new_rows, time.monotonic() - started, complete, floor)


def _estimated_rows(dsn: str, table: str) -> int | None:
    with connect(dsn, what="source") as conn:
        return table_rows(conn, table)


def typing_session(config, spark=None, spark_factory=None):
    """The Spark session that types what Arrow does not: ``spark`` when there is one, else
    ``spark_factory()``'s, else one started for it."""
    if spark is not None:
        return spark
    from importlib.util import find_spec

    if find_spec("pyspark") is None or find_spec("delta") is None:
        raise UserError("a bytea or array column is typed by Spark as it is loaded into its "
                        "mirror, and Spark is not installed here: install it with pip "
                        "install 'lakecdc[spark]' and rerun; what is loaded stays.")
    if spark_factory is not None:
        return spark_factory()
    from core.spark import get_or_create
    from core.storage import Lakehouse

    return get_or_create(lakehouse=Lakehouse.from_config(config), master=config.spark_master)


def _replace(data: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    for name, values in columns.items():
        data = data.set_column(data.schema.get_field_index(name), name, values)
    return data


def _bad_value(table: str, exc: BaseException) -> UserError:
    return UserError(
        f"a value of {table} does not convert to its mirror's type "
        f"({str(exc).splitlines()[0][:200]}); the load stopped after its last whole chunk: "
        "rerun `lakecdc tables add` once the value is fixed (docs/silver.md, \"Mirrors\": "
        "types).")


def _read_chunks(dsn: str, spec: TableSpec, columns, after: list[str] | None,
                 chunk_rows: int, halted: Callable[[], bool], out: queue.Queue) -> None:
    """The reading thread: for each chunk, where it ends (the key ``chunk_rows`` rows on,
    from the key's index), then its ``COPY``; put on ``out`` as (its CSV, the texts of its
    last key, None for the rest of the table), so the next chunk is read while this one
    is parsed and written. None once ``halted()``, or the error that ended it."""

    def put(item) -> bool:
        while not halted():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    try:
        with connect(dsn, what="source") as conn:
            for name, value in {"statement_timeout": f"{READ_TIMEOUT_S}s",
                                **READ_SETTINGS}.items():
                conn.execute("SELECT set_config(%s, %s, false)", [name, value])
            conn.autocommit = True
            while True:
                if halted():
                    put(None)
                    return
                found = conn.execute(chunk_end(spec.schema, spec.table, spec.key, after,
                                               chunk_rows)).fetchone()
                end = None if found is None else list(found)
                buffer = bytearray()
                try:
                    with conn.cursor().copy(chunk_copy(spec.schema, spec.table, columns,
                                                       spec.key, after, end)) as copy:
                        for block in copy:
                            buffer += block
                except psycopg.DataError as exc:
                    raise _bad_value(spec.name, exc) from None
                if not put((bytes(buffer), end)) or end is None:
                    return
                after = end
    except BaseException as exc:        # handed to the writing thread, which raises it
        put(exc)
