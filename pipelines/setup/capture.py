"""``lakecdc tables [list|add|remove]``: the captured set, changed while the pipeline runs
(docs/source-tables.md, "Adding and removing tables while running").

``add SCHEMA.TABLE`` (resumable: rerun it after any interruption):

1. checks the table (it exists, and a key identifies its rows: the mirror's, which the
   chunked load follows too), changing nothing if it is refused; creates its mirror, empty,
   unless there is one (when it is mirrored);
2. stores the new set (``bronze.capture_list``, state ``snapshotting``);
3. waits until the running shipper has acknowledged it in a bronze commit: from there on
   every change of the table reaches bronze (that commit's LSN is the load's floor);
4. loads the table's current rows straight into its mirror by key-range chunks
   (``pipelines.setup.mirror_loader``), while streaming goes on; the mirrors' query holds the
   table's changes back meanwhile, and applies every one from the floor on once the load
   is done;
5. stores the table as ``captured``, and commits a heartbeat, so that the mirrors' query
   has a batch to apply the held changes in even when nothing else changes.

With ``LAKECDC_CATALOG`` and ``LAKECDC_SCHEMA`` set, the mirror's name is checked before
step 1, and in step 1 the mirror is created and registered by name
(``pipelines.setup.register``); a rerun registers it if it is not.

``remove`` stores the set without the table and waits for the shipper likewise; the mirror
stays as it was. The counted tables cannot be removed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from bronze import heartbeat
from bronze.capture_list import (
    ACK_SUFFIX,
    CAPTURED,
    REMOVED,
    SNAPSHOTTING,
    CaptureList,
    CaptureSet,
    ShipperSet,
    known_set,
)
from bronze.source import identity_blocker, mirror_key
from bronze.spark_table import bronze_table
from bronze.table import numbers_as_text
from core.config import TABLE_NAME, Config
from core.engine.api import Engine
from core.engine.choose import start_engine
from core.errors import UserError
from core.layout import GOLD, mirror_path
from core.locks import locked, shipper_running
from core.lsn import fmt
from core.postgres import connect
from core.storage import gold_key, on_databricks, spark_path
from core.switches import Switches
from gold.push import MIRRORS_LAYER, read_layer
from pipelines.setup.mirror_loader import (
    DEFAULT_CHUNK_ROWS,
    MirrorTarget,
    load_mirror,
    typing_session,
)
from pipelines.source.mirror_specs import specials_note, table_specs
from silver.mirrors.mirror_table import COMMIT_TS, mirror_shape_of, mirrored_columns
from silver.mirrors.tail import current_rows, tail_path

ACK_TIMEOUT_S = 120.0


def captured_tables(config: Config, storage_options: dict | None = None,
                    engine: Engine | None = None, loaded: bool = False) -> tuple[str, ...]:
    """The tables captured now: the stored set, else ``LAKECDC_TABLES`` (read through
    ``engine``; None: delta-rs with ``storage_options``); with ``loaded``, not those whose
    rows ``tables add`` is loading (their mirrors have a writer of their own)."""
    stored = CaptureList(config.lakehouse, storage_options, engine=engine).read()
    if stored is None:
        return config.tables
    return tuple(t for t in stored.active if not loaded or stored.state(t) != SNAPSHOTTING)


def known_tables(config: Config, storage_options: dict | None = None,
                 engine: Engine | None = None):
    """A function returning every table bronze may hold changes of (silver's known tables),
    read from the stored set each time it is called (through ``engine``; None: delta-rs
    with ``storage_options``)."""
    store = CaptureList(config.lakehouse, storage_options, engine=engine)

    def known() -> tuple[str, ...]:
        return known_set(store.read(), config.tables)
    return known


def _lock_name(slot: str) -> str:
    return f"lakecdc.tables:{slot}"


def _qualified(name: str) -> str:
    if not TABLE_NAME.fullmatch(name):
        raise UserError(f"table {name!r} must be written schema.table, e.g. public.services.")
    return name


def _states(stored: CaptureSet | None, config: Config) -> dict[str, str]:
    if stored is None:                 # set up before the set was stored
        return {t: CAPTURED for t in config.tables}
    return {t: s for t, (s, _) in stored.states.items()}


def _tables_lock(conn, config: Config):
    """The slot's ``tables add`` / ``remove`` lock, held for the block."""
    return locked(conn, _lock_name(config.slot), f"lakecdc tables {config.slot}",
                  f"another `lakecdc tables add` or `remove` is running on slot {config.slot}; "
                  "wait for it to finish.")


def add_table(config: Config, name: str, storage_options: dict | None = None,
              stop: threading.Event | None = None, chunk_rows: int = DEFAULT_CHUNK_ROWS,
              timeout_s: float | None = None, spark_factory=None) -> str:
    """``lakecdc tables add``; returns the line to print. ``spark_factory``: the session
    that registers the mirror by name, called only when ``config.registers``, and that
    every write goes through with ``LAKECDC_WRITER=spark`` (None: ``core.spark``'s)."""
    table = _qualified(name)
    from pipelines.setup.register import names_session

    engine = start_engine(config, spark_factory)
    switches = Switches.from_config(config)
    spark = names_session(config, spark_factory, (table,), "tables add")
    registered = None
    stop = stop or threading.Event()
    store = CaptureList(config.lakehouse, storage_options, engine=engine)
    bronze = bronze_table(config, storage_options, engine=engine, switches=switches)
    if not bronze.exists():
        raise UserError(f"no bronze table at {config.bronze_path}: run `lakecdc setup` first.")
    started = time.monotonic()
    with connect(config.require_source(), what="source") as conn, \
            _tables_lock(conn, config):
        stored = store.read()
        if stored is not None and stored.state(table) == CAPTURED:
            registered = _register(spark, config, table)
            return f"{table} is already captured" + (f"; {registered}." if registered else ".")
        _check_addable(conn, config, table)
        registered = _register(spark, config, table)
        spec = table_specs(conn, (table,))[0]
        target = _new_mirror(config, table, spec, engine)
        states = _states(stored, config)
        if states.get(table) != SNAPSHOTTING:
            states[table] = SNAPSHOTTING
            stored = store.write(states, stored)
            switches.hit("after_capture_stored")
        assert stored is not None
        at = (_wait_acknowledged(conn, config, bronze, stored.version, stop, timeout_s)
              if switches.on("capture_ack") else _bronze_at(config, bronze))
        if at is None:
            return (f"{table}: stopped before the shipper took it up; "
                    f"rerun `lakecdc tables add {table}`.")
        report = None
        # How the shipper that took the table up gets numbers from wal2json (it recorded
        # that with the acknowledgement): the load renders NaN and ±Infinity the same way.
        text = numbers_as_text(bronze, config.slot)
        lossy = specials_note(spec, text)
        if target is not None:
            run = int(stored.since(table).timestamp() * 1e6)
            report = load_mirror(config.require_source(), target, run, at + 1,
                                 chunk_rows=chunk_rows, stop=stop,
                                 switches=switches,
                                 session=lambda: typing_session(config, spark, spark_factory),
                                 numbers_as_text=text)
            if not report.complete:
                return (f"{table}: captured from {fmt(at)}; loading its rows stopped after "
                        f"{report.rows:,} rows: rerun `lakecdc tables add {table}` to go on.")
        states[table] = CAPTURED
        store.write(states, store.read())
        # Something for the mirrors' query to start a batch with, which applies the changes
        # it held back while the table loaded, even when no table changes.
        heartbeat.emit(conn, config.slot)
    return _added(config, table, at, report, started, registered, lossy)


def _check_addable(conn, config: Config, table: str) -> None:
    """Refuse, changing nothing, a table ``tables add`` cannot take: no shipper running, no
    such table, no replica identity to capture it by, or no key to load and mirror it by."""
    if not shipper_running(conn, config.slot):
        raise UserError(f"no lakecdc shipper is running on slot {config.slot}: `tables "
                        "add` reads the table's rows through the change stream, so start "
                        "`lakecdc run` (or `lakecdc ship`) and rerun it; nothing was "
                        "changed.")
    schema_name, table_name = table.split(".", 1)
    if conn.execute("SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = "
                    "c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND "
                    "c.relkind IN ('r', 'p')", [schema_name, table_name]).fetchone() is None:
        raise UserError(f"table {table} does not exist in the source database; nothing "
                        "was changed.")
    blocker = identity_blocker(conn, table, counted=False)
    if blocker:
        raise UserError(blocker)
    if not mirror_key(conn, table)[1]:
        raise UserError(
            f"{table} has no primary key (its replica identity is FULL): `tables add` "
            "reads a table's current rows in the order of a unique key, and keeps its "
            "mirror by it; add a primary key and rerun; nothing was changed.")


def _new_mirror(config: Config, table: str, spec, engine: Engine) -> MirrorTarget | None:
    """The mirror ``table``'s rows load into, created empty unless there is one (None: the
    table is not mirrored)."""
    if table not in config.with_(tables=(*config.tables, table)).mirrored:
        return None
    target = MirrorTarget(mirror_path(config.lakehouse, table), spec, engine=engine,
                          log_retention_minutes=config.kept_minutes("mirrors"))
    target.ensure()          # before the set names it: the load is its first writer
    return target


def _added(config: Config, table: str, at: int, report, started: float,
           registered: str | None, lossy: str) -> str:
    """The line ``tables add`` prints once the table is captured (``report``: its mirror's
    load, None if it is not mirrored)."""
    if report is None:
        return (f"{table}: captured from {fmt(at)}; it is not mirrored (LAKECDC_MIRRORS), so "
                "its current rows were not read" + (f"; {registered}." if registered else ".")
                + (f"\n{lossy}" if lossy else ""))
    return (f"{table}: captured from {fmt(at)}, its {report.rows:,} current rows loaded into "
            f"its mirror in {time.monotonic() - started:.1f}s ({report.chunks:,} chunks); "
            f"the mirror is {mirror_path(config.lakehouse, table)}"
            + (f"; {registered}." if registered else ".") + (f"\n{lossy}" if lossy else ""))


def _register(spark, config: Config, table: str) -> str | None:
    """The mirror of ``table`` created and registered by name, when names are kept."""
    if spark is None:
        return None
    from pipelines.setup.register import register_mirror

    return register_mirror(spark, config, table)


def remove_table(config: Config, name: str, storage_options: dict | None = None,
                 stop: threading.Event | None = None, spark_factory=None) -> str:
    """``lakecdc tables remove``; returns the line to print. ``spark_factory``: the
    session every write goes through with ``LAKECDC_WRITER=spark``."""
    table = _qualified(name)
    if table in config.counted.names:
        raise UserError(f"{table} is counted by service_stats, so it stays captured "
                        "(LAKECDC_NOTIFICATIONS_TABLE, LAKECDC_HISTORY_TABLE).")
    engine = start_engine(config, spark_factory)
    store = CaptureList(config.lakehouse, storage_options, engine=engine)
    bronze = bronze_table(config, storage_options, engine=engine)
    if not bronze.exists():
        raise UserError(f"no bronze table at {config.bronze_path}: run `lakecdc setup` first.")
    with connect(config.require_source(), what="source") as conn, \
            _tables_lock(conn, config):
        stored = store.read()
        states = _states(stored, config)
        if states.get(table) in (None, REMOVED):
            raise UserError(f"{table} is not captured (captured: "
                            f"{', '.join(t for t, s in states.items() if s != REMOVED)}).")
        states[table] = REMOVED
        stored = store.write(states, stored)
        if shipper_running(conn, config.slot):
            at = _wait_acknowledged(conn, config, bronze, stored.version, stop or threading.Event())
            until = f"bronze holds its changes up to {fmt(at)}" if at else "stopped waiting"
        else:
            until = "the shipper leaves it out from its next start"
    return (f"{table} is no longer captured ({until}); its mirror "
            f"{mirror_path(config.lakehouse, table)} is kept as it was, not updated.")


def _wait_acknowledged(conn, config: Config, bronze, version: int,
                       stop: threading.Event, timeout_s: float | None = None) -> int | None:
    """Until bronze records that the shipper peeks with set ``version`` or a newer one;
    returns bronze's commit LSN then (None: stopped). A heartbeat transaction each time the
    shipper may have looked at the set again gives an idle shipper something to commit the
    acknowledgement with (one sent before it looked would be committed without it)."""
    app = config.slot + ACK_SUFFIX
    timeout_s = ACK_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    beat = 0.0
    while (bronze.app_version(app) or -1) < version:
        if time.monotonic() - beat >= ShipperSet.CHECK_S:
            heartbeat.emit(conn, config.slot)
            beat = time.monotonic()
        if stop.wait(0.1):
            return None
        if not shipper_running(conn, config.slot):
            raise UserError(f"the shipper on slot {config.slot} stopped before it took up the "
                            "new set of tables; start it and rerun the command (the set is "
                            "stored, nothing is lost).")
        if time.monotonic() > deadline:
            raise UserError(f"the shipper on slot {config.slot} has not taken up the new set "
                            f"of tables within {timeout_s:.0f}s (is it far behind? see "
                            "`lakecdc status`); rerun the command to wait again.")
    return _bronze_at(config, bronze)


def _bronze_at(config: Config, bronze) -> int:
    """The source commit bronze holds everything up to."""
    progress = bronze.progress(config.slot)
    return progress.commit_lsn if progress is not None else 0


@dataclass(frozen=True)
class TableLine:
    table: str
    state: str
    since: datetime | None
    mirror_rows: int | None = None
    mirror_updated: datetime | None = None
    newest_change: datetime | None = None
    # Every source transaction up to this commit (LSN, time) is in the mirror: the mirrors'
    # query's mark (``pipelines.run.mirror_progress``), for a captured table with a mirror.
    complete_as_of: tuple[int, datetime] | None = None


def list_tables(config: Config, storage_options: dict | None = None,
                spark_factory=None) -> list[TableLine]:
    """Every table captured or once captured, with its mirror's size and freshness (read
    from the Delta log: no Spark, unless every read goes through it, ``spark_factory``'s
    session) and where it is complete (the dashboard's ``lakecdc_layer_progress``; "-"
    when that cannot be read)."""
    engine = start_engine(config, spark_factory)
    stored = CaptureList(config.lakehouse, storage_options, engine=engine).read()
    entries = ([(t, s, at) for t, (s, at) in stored.states.items()] if stored is not None
               else [(t, CAPTURED, None) for t in config.tables])
    gold = gold_key(spark_path(config.table_path(GOLD), on_databricks()))
    complete = read_layer(config.dashboard, gold, MIRRORS_LAYER) if config.dashboard else None
    lines = []
    for table, state, at in entries:
        mirror = _mirror_freshness(engine, config.lakehouse, table)
        lines.append(TableLine(table, state, at, *mirror,
                               complete if state == CAPTURED and mirror[0] is not None
                               else None))
    return lines


def _mirror_freshness(engine: Engine, lakehouse: str, table: str):
    """(rows, last commit time, newest change held) of ``table``'s mirror, or Nones: from
    the per-file statistics (``Engine.count``, ``Engine.maxima``), but where the mirror has
    changes not merged into its table yet (its tail, ``silver.mirrors.tail``), counted
    over its current rows."""
    path = mirror_path(lakehouse, table)
    found = engine.maxima(path, [COMMIT_TS])
    if found is None:
        return None, None, None
    version, newest = found[0], found[1][COMMIT_TS]
    rows = engine.count(path)
    if engine.exists(tail_path(path)) and engine.count(tail_path(path)):
        current = _current_rows(engine, path, [COMMIT_TS])
        rows = current.num_rows
        newest = pc.max(current[COMMIT_TS]).as_py()
    at = engine.commit_time(path, version)
    updated = None if at is None else datetime.fromtimestamp(at, timezone.utc)
    return rows, updated, newest


def _current_rows(engine: Engine, path: str, columns: list[str]) -> pa.Table:
    """The mirror's current rows (its key and ``columns``): its table with its tail laid
    over it (``silver.mirrors.tail.current_rows``). The tail is read first: a drain
    empties it only after the table holds its rows."""
    tail = engine.read(tail_path(path))
    key, types = mirror_shape_of(engine.properties(path))
    base = engine.read(path, columns=[*key, *[c for c in columns if c not in key]])
    return current_rows(base, tail, key, mirrored_columns(key, types))


def tables_json(lines: list[TableLine]) -> list[dict]:
    """``lakecdc tables --json``: each line as a mapping, LSNs as Postgres writes them; pure."""
    out = []
    for ln in lines:
        mark = ln.complete_as_of
        out.append({**{k: v for k, v in vars(ln).items() if k != "complete_as_of"},
                    "complete_as_of": None if mark is None else
                    {"commit_lsn": fmt(mark[0]), "commit_ts": mark[1]}})
    return out


def render_tables(lines: list[TableLine], now: datetime | None = None) -> str:
    """``lakecdc tables``' table; pure."""
    now = now or datetime.now(timezone.utc)

    def ago(at: datetime | None) -> str:
        if at is None:
            return "-"
        if at.tzinfo is None:
            at = at.replace(tzinfo=timezone.utc)
        return f"{at:%Y-%m-%d %H:%M:%S}Z ({max(0.0, (now - at).total_seconds()):,.0f}s ago)"

    def complete(mark: tuple[int, datetime] | None) -> str:
        return "-" if mark is None else f"{fmt(mark[0])} {ago(mark[1])}"

    header = ("table", "state", "since", "mirror rows", "mirror updated", "newest change",
              "complete as of")
    rows = [(ln.table, ln.state, ago(ln.since),
             "-" if ln.mirror_rows is None else f"{ln.mirror_rows:,}",
             ago(ln.mirror_updated), ago(ln.newest_change), complete(ln.complete_as_of))
            for ln in lines]
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
                     for r in (header, *rows))
