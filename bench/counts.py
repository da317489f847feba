"""lakecdc's counts (gold, the dashboard, a mirror) against the source's own, read
independently of the pipeline: the benchmark's exactness checks."""

from __future__ import annotations

from datetime import datetime, timezone
from uuid import UUID

import psycopg
from deltalake import DeltaTable
from psycopg import sql

from core.captured import COUNTED
from core.config import Config
from core.layout import GOLD, mirror_path
from pipelines.source.truth import source_counts
from silver.mirrors.tail import read_mirror


def _nonzero(counts: dict) -> dict:
    return {k: v for k, v in counts.items() if v}


def compare(got: dict, truth: dict) -> dict:
    """How far ``got`` is from ``truth``: keys differing, totals, absolute error."""
    got, truth = _nonzero(got), _nonzero(truth)
    keys = set(got) | set(truth)
    expected = sum(truth.values())
    total = sum(got.values())
    abs_error = sum(abs(got.get(k, 0) - truth.get(k, 0)) for k in keys)
    return {"exact": got == truth, "keys": len(truth),
            "keys_differing": sum(1 for k in keys if got.get(k, 0) != truth.get(k, 0)),
            "expected_total": expected, "total": total,
            "total_error_pct": round(100.0 * (total - expected) / max(expected, 1), 2),
            "abs_error_pct": round(100.0 * abs_error / max(expected, 1), 2)}


def gold_counts(config: Config) -> dict:
    rows = DeltaTable(config.table_path(GOLD)).to_pyarrow_table(
        columns=["service_id", "template_id", "notification_type", "notification_status",
                 "count"]).to_pylist()
    return {(r["service_id"], r["template_id"], r["notification_type"],
             r["notification_status"]): r["count"] for r in rows}


def dashboard_counts(dsn: str) -> dict:
    with psycopg.connect(dsn) as conn:
        return dashboard_rows(conn)


def dashboard_rows(conn: psycopg.Connection) -> dict:
    """The dashboard's counts, read on an open connection (a poll's: no session start
    each time, whose cost lands on the machine the run shares)."""
    return {tuple(r[:4]): r[4] for r in conn.execute(
        "SELECT service_id, template_id, notification_type, notification_status, count "
        "FROM service_stats")}


def truth(dsn: str) -> dict:
    with psycopg.connect(dsn) as conn:
        return source_counts(conn, COUNTED)


def exactness(config: Config) -> dict:
    expected = truth(config.source_dsn)
    return {"gold": compare(gold_counts(config), expected),
            "dashboard": compare(dashboard_counts(config.dashboard), expected)}


def mirror_is_source(config: Config, table: str) -> bool:
    """Every row and column of ``table``'s mirror (read with delta-rs, its tail laid over
    its table) equals the source's (psycopg), compared as sets of rows; timestamps in UTC."""
    with psycopg.connect(config.source_dsn) as conn:
        cur = conn.execute(sql.SQL("SELECT * FROM {}").format(
            sql.Identifier(*table.split(".", 1))))
        columns = [d.name for d in cur.description]
        source = {tuple(utc(v) for v in row) for row in cur}
    mirror = read_mirror(mirror_path(config.lakehouse, table), columns=columns).to_pylist()
    return source == {tuple(utc(r[c]) for c in columns) for r in mirror}


def utc(value):
    """A value as a mirror holds it: timestamps with a zone in UTC, UUIDs as their text."""
    if isinstance(value, UUID):
        return str(value)
    return value.astimezone(timezone.utc) if isinstance(value, datetime) \
        and value.tzinfo is not None else value
