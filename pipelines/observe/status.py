"""``lakecdc status``: how far each layer has got, read without Spark on delta-rs.

- slot: ``wal_status``, lag in bytes (current WAL position − confirmed position), positions;
- per Delta layer: table version, the newest source ``commit_lsn`` it holds, that change's
  source commit time and the freshness (now − that time). Values come from the Delta log
  and per-file statistics, so status stays cheap on large tables;
- dashboard: the pushed gold version and the newest source commit it reflects;
- quarantine: the rows in ``silver/quarantine``, from the Delta log's per-file row counts;
- tables: every table lakecdc maintains, with its live files, bytes, log entries and its
  newest maintenance (``pipelines.maintain``).

The parts are separate functions (``slot_status``, ``layer_status``, ``quarantine_rows``) so the
Prometheus exporter (``pipelines.observe.metrics``) reads exactly what ``lakecdc status``
shows, each part on its own (one unreachable database does not hide the others).

The lakehouse is read by the engine given (``core.engine``): delta-rs, or Spark's Delta
where only Spark reaches storage (``LAKECDC_WRITER=spark``); either answers the newest
change and the row count from the per-file statistics, without reading the files.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass

import psycopg
from psycopg import sql

from bronze import slot as slots
from core.config import Config
from core.engine.api import Engine
from core.layout import BRONZE, GOLD, QUARANTINE, SILVER
from core.lsn import fmt
from core.postgres import connect
from core.units import byte_size
from gold.push import LAYERS

GOLD_HISTORY = 200          # gold's commits read for its watermark (``gold.push.gold_position``)


@dataclass
class LayerStatus:
    layer: str
    version: int | None = None
    commit_lsn: int | None = None
    commit_ts: dt.datetime | None = None
    note: str = ""

    def freshness_s(self, now: dt.datetime) -> float | None:
        return None if self.commit_ts is None else round((now - self.commit_ts).total_seconds(), 3)


@dataclass
class SlotStatus:
    """The slot as ``pg_replication_slots`` shows it (positions as integers)."""

    name: str
    wal_status: str | None
    lag_bytes: int | None                 # current WAL position - confirmed_flush_lsn
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    active_pid: int | None
    safe_wal_size: int | None = None      # bytes before the slot is at risk (PG >= 13)
    current_wal_lsn: int | None = None
    max_slot_wal_keep_size: int | None = None    # bytes; None: unlimited (or PG < 13)


def slot_status(config: Config) -> SlotStatus | None:
    """The configured slot, or None if it does not exist. ``UserError`` if the source
    cannot be reached."""
    with connect(config.require_source()) as conn:
        state = slots.slot_state(conn, config.slot)
        if state is None:
            return None
        try:
            row = conn.execute("""
                SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, s.safe_wal_size,
                       (SELECT nullif(setting::bigint, -1) * 1024 * 1024 FROM pg_settings
                        WHERE name = 'max_slot_wal_keep_size')
                FROM pg_replication_slots s WHERE s.slot_name = %s""",
                               [config.slot]).fetchone()
        except psycopg.errors.UndefinedColumn:      # safe_wal_size: PostgreSQL >= 13
            row = None
        current, safe, keep = row or (None, None, None)
    return SlotStatus(config.slot, state.wal_status, state.lag_bytes,
                      state.confirmed_flush_lsn, state.restart_lsn, state.active_pid,
                      safe, current, keep)


def delta_layer(layer: str, path: str, lsn_column: str, ts_column: str,
                engine: Engine) -> LayerStatus:
    """An append-only layer: the newest change it holds, from per-file statistics
    (``Engine.maxima``)."""
    found = engine.maxima(path, [lsn_column, ts_column])
    if found is None:
        return LayerStatus(layer, note="not created yet")
    version, newest = found
    return LayerStatus(layer, version, newest[lsn_column], newest[ts_column])


def gold_layer(path: str, engine: Engine) -> LayerStatus:
    """Gold's watermark is recorded in its commits: exact as of that source commit."""
    from gold.feed import position_of

    version = engine.version(path)
    if version is None:
        return LayerStatus("gold", note="not created yet")
    commit_lsn, commit_ts = position_of(engine.commits(path, "gold", limit=GOLD_HISTORY,
                                                       up_to=version))
    if commit_ts is not None and commit_ts.tzinfo is None:
        commit_ts = commit_ts.replace(tzinfo=dt.timezone.utc)
    return LayerStatus("gold", version, commit_lsn, commit_ts)


def dashboard_layer(dsn: str) -> LayerStatus:
    from gold.push import PROGRESS_TABLE  # the name lives with the push

    try:
        with connect(dsn, what="dashboard") as conn:
            row = conn.execute(sql.SQL(
                "SELECT gold_version, source_commit_lsn, source_commit_ts FROM {} "
                "ORDER BY pushed_at DESC NULLS LAST LIMIT 1").format(
                    sql.Identifier(PROGRESS_TABLE))).fetchone()
    except psycopg.errors.UndefinedTable:
        return LayerStatus("dashboard", note="not created yet")
    if row is None or row[0] is None or row[0] < 0:
        return LayerStatus("dashboard", note="nothing pushed yet")
    return LayerStatus("dashboard", *row)


def quarantine_rows(path: str, engine: Engine) -> int | None:
    """Rows in the quarantine table (None: not created yet), from the Delta log's per-file
    row counts (``Engine.count``)."""
    return engine.count(path)


def layer_status(config: Config, layer: str, engine: Engine) -> LayerStatus:
    """One of ``LAYERS``, read by ``engine`` (see the module's text)."""
    if layer in ("bronze", "silver"):
        return delta_layer(layer, config.table_path(BRONZE if layer == "bronze" else SILVER),
                           "commit_lsn", "commit_ts", engine)
    if layer == "gold":
        return gold_layer(config.table_path(GOLD), engine)
    if layer == "dashboard":
        return dashboard_layer(config.dashboard)
    raise ValueError(f"unknown layer {layer}")


def quarantine_path(config: Config) -> str:
    return config.table_path(QUARANTINE)


def table_sizes(config: Config, engine: Engine) -> list[dict]:
    """Every table lakecdc maintains (``pipelines.maintain.owners``) with its live files and
    bytes, its log's entries and its newest maintenance (``Engine.size``); tables not
    created yet are left out."""
    from core.storage import Lakehouse
    from pipelines.maintain.owners import GROUPS, tables_of
    from pipelines.setup.capture import captured_tables

    options = Lakehouse.from_config(config).delta_rs_options()
    mirrored = tuple(t for t in captured_tables(config, options, engine=engine)
                     if t in config.mirrored)
    rows = []
    for group in GROUPS:
        for table in tables_of(config, group, mirrored):
            size = engine.size(table.uri)
            if size is not None:
                last = size.last_maintained or {}
                rows.append({"table": table.name, "live_files": size.live_files,
                             "live_bytes": size.live_bytes, "log_entries": size.log_entries,
                             "last_maintained": last.get("at")})
    return rows


def collect(config: Config, engine: Engine) -> dict:
    """Everything ``status`` shows; the lakehouse read by ``engine``."""
    state = slot_status(config)
    layers = [layer_status(config, layer, engine) for layer in LAYERS]
    quarantined = quarantine_rows(quarantine_path(config), engine)
    now = dt.datetime.now(dt.timezone.utc)
    return {
        "slot": None if state is None else {
            "name": state.name, "wal_status": state.wal_status, "lag_bytes": state.lag_bytes,
            "confirmed_flush_lsn": fmt(state.confirmed_flush_lsn),
            "restart_lsn": fmt(state.restart_lsn), "active_pid": state.active_pid,
            "safe_wal_size": state.safe_wal_size,
            "max_slot_wal_keep_size": state.max_slot_wal_keep_size},
        "layers": [{**asdict(l), "commit_lsn": fmt(l.commit_lsn) if l.commit_lsn else None,
                    "commit_ts": l.commit_ts.isoformat() if l.commit_ts else None,
                    "freshness_s": l.freshness_s(now)} for l in layers],
        "quarantine_rows": quarantined,
        "tables": table_sizes(config, engine),
    }


# ``lakecdc status``'s exit codes beyond 0 (all well), for scripts and probes.
SLOT_MISSING = 4          # the slot does not exist, or Postgres invalidated it (lost)
LAYER_EMPTY = 5           # a layer is not created yet, or holds nothing yet


def exit_code(report: dict) -> int:
    """What ``status`` exits with: ``SLOT_MISSING``, else ``LAYER_EMPTY``, else 0; pure."""
    slot = report["slot"]
    if slot is None or slot["wal_status"] == "lost":
        return SLOT_MISSING
    return LAYER_EMPTY if any(layer["note"] for layer in report["layers"]) else 0


def render(report: dict) -> str:
    slot = report["slot"]
    lines = []
    if slot is None:
        lines.append("slot: MISSING (run `lakecdc setup`, or `lakecdc setup --rebaseline`)")
    else:
        lines.append(f"slot {slot['name']}: wal_status={slot['wal_status']}  "
                     f"lag={byte_size(slot['lag_bytes'])}  confirmed={slot['confirmed_flush_lsn']}"
                     f"  restart={slot['restart_lsn']}")
    lines.append(f"{'layer':<10} {'version':>8} {'commit_lsn':>14}  {'source commit (UTC)':<26}"
                 f" {'freshness':>10}")
    for l in report["layers"]:
        if l["note"]:
            lines.append(f"{l['layer']:<10} {l['note']}")
            continue
        ts = (l["commit_ts"] or "-")[:26].replace("T", " ")
        fresh = "-" if l["freshness_s"] is None else f"{l['freshness_s']:.1f}s"
        lines.append(f"{l['layer']:<10} {l['version'] if l['version'] is not None else '-':>8} "
                     f"{l['commit_lsn'] or '-':>14}  {ts:<26} {fresh:>10}")
    quarantined = report.get("quarantine_rows")
    lines.append("quarantine: " + ("not created yet" if quarantined is None
                                   else f"{quarantined:,} rows in silver/quarantine"))
    tables = report.get("tables") or []
    if tables:
        now = dt.datetime.now(dt.timezone.utc).timestamp()
        width = max(len("table"), *(len(t["table"]) for t in tables))
        lines.append(f"{'table':<{width}} {'live files':>10} {'bytes':>10} {'log entries':>11}"
                     "  last maintained")
        for t in tables:
            ago = "never" if t["last_maintained"] is None else \
                f"{_age(now - t['last_maintained'])} ago"
            lines.append(f"{t['table']:<{width}} {t['live_files']:>10,} "
                         f"{byte_size(t['live_bytes']):>10} {t['log_entries']:>11,}  {ago}")
    return "\n".join(lines)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str)
