"""The shipper's drain rate against Postgres's own decode of the same slot content.

Starts a throw-away Postgres, writes a Notify-like backlog, then measures in one run:
- raw decode: ``SELECT count(*) FROM pg_logical_slot_peek_changes(...)`` with the
  shipper's wal2json options on a witness slot that saw the same WAL;
- ``lakecdc ship --once`` (a subprocess) draining the lakecdc slot into bronze, with its
  peak RSS.
Prints one JSON line. Usage: ``python -m bench.ship_vs_decode --rows 200000 [--tx-size 1000]``.
The same measurement, on the benchmark's mixed workload and next to every other layer, is
the ``backlog`` section of ``python -m bench`` (``bench.decode``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import psycopg

from bench.decode import create_witness, raw_decode, ship_once
from core.config import Config
from infra.localpg import LocalPostgres
from pipelines.setup.prepare import setup

SCHEMA = Path(__file__).resolve().parents[1] / "infra" / "postgres" / "source_schema.sql"


def write_backlog(dsn: str, rows: int, tx_size: int, update_fraction: float) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
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
                         "WHERE random() < %s", [update_fraction])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--tx-size", type=int, default=1000)
    parser.add_argument("--update-fraction", type=float, default=0.5)
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
        create_witness(dsn, "witness")
        write_backlog(dsn, args.rows, args.tx_size, args.update_fraction)
        changes, raw = raw_decode(dsn, "witness", config.tables)
        ship = ship_once(config)
        print(json.dumps({"peek_rows": changes, "raw_decode_s": round(raw, 3),
                          "ship_s": round(ship.seconds, 3), "ratio": round(raw / ship.seconds, 3),
                          "raw_rows_per_s": round(changes / raw),
                          "ship_rows_per_s": round(changes / ship.seconds),
                          "ship_peak_rss_mb": round(ship.peak_rss_mb)}))
    finally:
        pg.destroy()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
