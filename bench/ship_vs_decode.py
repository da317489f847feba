"""The shipper's drain rate against Postgres's own decode and its own client, on the same
slot content.

Starts a throw-away Postgres and, in each of ``--runs`` rounds, writes a Notify-like backlog
and measures, on that same backlog:
- raw decode: ``SELECT count(*) FROM pg_logical_slot_peek_changes(...)`` with the
  shipper's wal2json options on a witness slot that saw the same WAL;
- ``pg_recvlogical``, Postgres's own streaming client, draining a second witness to
  ``/dev/null``;
- psycopg's replication protocol (``bench.decode.replication_drain``) draining a third,
  discarding every row, with the CPU its reading thread used;
- ``lakecdc ship --once`` (a subprocess) draining the lakecdc slot into bronze, with its
  peak RSS.
Prints one JSON line per round, then one with the medians. Usage:
``python -m bench.ship_vs_decode --rows 300000 [--tx-size 1000] [--runs 3]``.
The same measurement, on the benchmark's mixed workload and next to every other layer, is
the ``backlog`` section of ``python -m bench`` (``bench.decode``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import psycopg

from bench.decode import (
    create_witness,
    current_lsn,
    drop_slot,
    raw_decode,
    recvlogical,
    replication_drain,
    ship_once,
)
from core.config import Config
from infra.localpg import LocalPostgres
from pipelines.setup.prepare import setup

SCHEMA = Path(__file__).resolve().parents[1] / "infra" / "postgres" / "source_schema.sql"


def write_backlog(dsn: str, rows: int, tx_size: int, update_fraction: float) -> None:
    """``rows`` inserts in ``tx_size``-row transactions, then one transaction updating about
    ``update_fraction`` of them (of these rows only: each round's backlog is alike)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        since = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        for start in range(0, rows, tx_size):
            n = min(tx_size, rows - start)
            conn.execute("""
                INSERT INTO notifications (id, service_id, template_id, notification_type,
                    notification_status, key_type, created_at, "to", reference, billable_units)
                SELECT gen_random_uuid(),
                       ('00000000-0000-0000-0000-00000000000' || (g %% 8))::uuid,
                       ('10000000-0000-0000-0000-00000000000' || (g %% 5))::uuid,
                       (ARRAY['email','sms','letter'])[1 + g %% 3]::notification_type,
                       'created', 'normal', now(), 'someone@example.com', 'ref-' || g, 1
                FROM generate_series(1, %s) g""", [n])
        if update_fraction:
            conn.execute("UPDATE notifications SET notification_status = 'sending' "
                         "WHERE created_at >= %s AND random() < %s", [since, update_fraction])


def one_round(config: Config, rows: int, tx_size: int, update_fraction: float) -> dict:
    dsn = config.source_dsn
    witnesses = ("witness", "witness_recv", "witness_repl")
    for witness in witnesses:
        drop_slot(dsn, witness)
        create_witness(dsn, witness)
    load = os.getloadavg()[0]
    write_backlog(dsn, rows, tx_size, update_fraction)
    endpos = current_lsn(dsn)
    changes, raw = raw_decode(dsn, "witness", config.tables)
    recv = recvlogical(dsn, "witness_recv", config.tables, endpos)
    drain = replication_drain(dsn, "witness_repl", config.tables, endpos)
    ship = ship_once(config)
    for witness in witnesses:
        drop_slot(dsn, witness)
    return {"peek_rows": changes, "raw_decode_s": round(raw, 3),
            "pg_recvlogical_s": round(recv, 3),
            "psycopg_replication_s": round(drain.seconds, 3),
            "psycopg_replication_rows": drain.messages,
            "psycopg_replication_cpu_s": round(drain.client_cpu_s, 3),
            "ship_s": round(ship.seconds, 3),
            "ship_vs_recvlogical": round(recv / ship.seconds, 3),
            "ship_vs_raw": round(raw / ship.seconds, 3),
            "ship_rows_per_s": round(changes / ship.seconds),
            "ship_peak_rss_mb": round(ship.peak_rss_mb), "load_before": round(load, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--tx-size", type=int, default=1000)
    parser.add_argument("--update-fraction", type=float, default=0.5)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="lakecdc-bench-"))
    pg = LocalPostgres(Path(tempfile.mkdtemp(prefix="lakecdc-bench-pg-"))).start()
    try:
        dsn = pg.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA.read_text())
        config = Config.load(env={}, source_dsn=dsn, lakehouse=str(base / "lakehouse"),
                             slot="bench")
        setup(config)
        rounds = []
        for _ in range(args.runs):
            rounds.append(one_round(config, args.rows, args.tx_size, args.update_fraction))
            print(json.dumps(rounds[-1]), flush=True)
        print(json.dumps({"median": {key: statistics.median(r[key] for r in rounds)
                                     for key in ("raw_decode_s", "pg_recvlogical_s",
                                                 "psycopg_replication_s",
                                                 "psycopg_replication_cpu_s", "ship_s",
                                                 "ship_vs_recvlogical", "ship_vs_raw",
                                                 "ship_peak_rss_mb")}}))
    finally:
        pg.destroy()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
