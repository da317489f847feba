"""Independent truth for exactness checks. Nothing here uses the pipeline's own code paths.

- ``Witness``: a second logical slot that sees the same WAL as the shipper's and is never
  advanced. Its plain-SQL peek, parsed row by row with ``json.loads``, says which
  transactions committed and exactly which change rows wal2json emitted for each.
- ``check_bronze``: bronze must hold every witnessed transaction exactly once, in order,
  with nothing else (invariant I1, docs/reliability.md). Raises ``AssertionError``.
- ``source_truth`` / ``check_gold``: service_stats by a ``GROUP BY`` over the source tables
  at a quiet point, plus the history rows the test purged itself (I3, I4).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import psycopg
from psycopg import sql
from deltalake import DeltaTable

CAPTURED = "public.notifications,public.notification_history"


def lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


class Witness:
    def __init__(self, dsn: str, name: str, tables: str = CAPTURED) -> None:
        self.dsn, self.name, self.tables = dsn, name, tables
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", [name])

    def transactions(self) -> dict[int, list[str]]:
        """commit LSN → the JSON of its change rows in order (messages: their own LSN)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
                "'format-version', '2', 'include-xids', '1', 'include-timestamp', '1', "
                "'include-lsn', '1', 'add-tables', %s, "
                "'add-msg-prefixes', 'lakecdc.backfill,lakecdc.marker', "
                "'filter-msg-prefixes', 'lakecdc.heartbeat')",   # as the shipper asks
                [self.name, self.tables]).fetchall()
        result: dict[int, list[str]] = {}
        current: list[str] | None = None
        commit = None
        for (data,) in rows:
            action = json.loads(data)["action"]
            if action == "B":
                current, commit = [], lsn_int(json.loads(data)["lsn"])
            elif action == "C":
                if current:
                    result[commit] = current
                current = None
            elif current is None:          # non-transactional message
                result[lsn_int(json.loads(data)["lsn"])] = [data]
            else:
                current.append(data)
        return result

    def drop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s", [self.name])


def bronze_rows(path: str, storage_options: dict | None = None) -> list[dict]:
    return DeltaTable(path, storage_options=storage_options).to_pyarrow_table().to_pylist()


def check_bronze(path: str, witnessed: dict[int, list[str]],
                 storage_options: dict | None = None) -> None:
    """I1: every witnessed transaction exactly once and whole; nothing else."""
    rows = bronze_rows(path, storage_options)
    keys = [(r["commit_lsn"], r["seq"]) for r in rows]
    dupes = len(keys) - len(set(keys))
    assert dupes == 0, f"bronze holds {dupes} duplicate (commit_lsn, seq) keys"
    by_tx: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_tx[r["commit_lsn"]].append(r)
    missing = sorted(set(witnessed) - set(by_tx))
    extra = sorted(set(by_tx) - set(witnessed))
    assert not missing, f"{len(missing)} committed transactions missing from bronze"
    assert not extra, f"{len(extra)} bronze transactions the source never committed"
    for commit, expected in witnessed.items():
        got = sorted(by_tx[commit], key=lambda r: r["seq"])
        assert [r["seq"] for r in got] == list(range(len(got))), f"gap in seq at {commit}"
        assert all(r["tx_changes"] == len(expected) for r in got), f"tx_changes wrong at {commit}"
        assert [r["data"] for r in got] == expected, f"transaction {commit} differs"


def source_truth(dsn: str, purged: Counter | None = None, schema: str = "public") -> Counter:
    """The GROUP BY of the dims over ``<schema>.notifications`` and
    ``<schema>.notification_history``, plus the history rows the test purged itself."""
    query = sql.SQL("""
            SELECT service_id::text, template_id::text, notification_type::text,
                   notification_status::text, count(*)
            FROM (SELECT service_id, template_id, notification_type, notification_status
                  FROM {live} UNION ALL
                  SELECT service_id, template_id, notification_type, notification_status
                  FROM {history}) t
            GROUP BY 1, 2, 3, 4""").format(
        live=sql.Identifier(schema, "notifications"),
        history=sql.Identifier(schema, "notification_history"))
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    truth = Counter({tuple(r[:4]): r[4] for r in rows})
    truth.update(purged or Counter())
    return truth


def gold_counts(lakehouse: str) -> Counter:
    rows = DeltaTable(f"{lakehouse}/gold/service_stats").to_pyarrow_table().to_pylist()
    return Counter({(r["service_id"], r["template_id"], r["notification_type"],
                     r["notification_status"]): r["count"] for r in rows})


def dashboard_counts(dsn: str) -> Counter:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT service_id, template_id, notification_type, "
                            "notification_status, count FROM service_stats").fetchall()
    return Counter({tuple(r[:4]): r[4] for r in rows})


def _nonzero(c: Counter) -> dict:
    return {k: v for k, v in c.items() if v != 0}


def check_gold(lakehouse: str, source_dsn: str, dashboard_dsn: str,
               purged: Counter | None = None, schema: str = "public") -> None:
    """I3 and I4: gold = truth exactly (no clamps: negatives would show), dashboard = gold."""
    truth = _nonzero(source_truth(source_dsn, purged, schema))
    gold = _nonzero(gold_counts(lakehouse))
    differ = {k: (gold.get(k), truth.get(k)) for k in set(gold) | set(truth)
              if gold.get(k) != truth.get(k)}
    assert not differ, f"gold differs from the source on {len(differ)} keys: " \
                       f"{list(differ.items())[:3]}"
    dashboard = _nonzero(dashboard_counts(dashboard_dsn))
    apart = {k: (dashboard.get(k), gold.get(k)) for k in set(dashboard) | set(gold)
             if dashboard.get(k) != gold.get(k)}
    assert not apart, f"the dashboard differs from gold on {len(apart)} keys " \
                      f"(dashboard, gold): {list(apart.items())[:3]}" \
                      f"{_dashboard_trail(dashboard_dsn, lakehouse, list(apart)[:20])}"


def _dashboard_trail(dsn: str, lakehouse: str, keys: list[tuple]) -> str:
    """Where a dashboard that differs from gold came from, for the failure's message: its
    progress rows, the watermark each differing key was last written at, and gold's
    watermark per version (which push, ahead or from gold, wrote it)."""
    with psycopg.connect(dsn) as conn:
        progress = conn.execute("SELECT gold_version, source_commit_lsn FROM "
                                "lakecdc_push_progress").fetchall()
        written = sorted({r[0] for r in conn.execute(
            "SELECT source_commit_lsn FROM service_stats WHERE (service_id, template_id, "
            "notification_type, notification_status) IN (SELECT * FROM unnest("
            "%s::text[], %s::text[], %s::text[], %s::text[]))",
            [list(c) for c in zip(*keys)] if keys else [[], [], [], []]).fetchall()})
    history = sorted((h["version"], json.loads(h.get("userMetadata") or "{}").get("commit_lsn"))
                     for h in DeltaTable(f"{lakehouse}/gold/service_stats").history())
    return (f"; dashboard progress (gold_version, lsn) {progress}; differing keys last "
            f"written at lsn {written}; gold (version, lsn) {history}")
