"""Notify-like source traffic for the demo and benchmarks.

Each ``step`` does what a Notify day does, in small transactions: create notifications,
move some through their statuses (created → sending → delivered / failures), archive
finished ones to ``notification_history`` (INSERT history + DELETE in one transaction), hard
delete a few, and roll one transaction back. Deterministic for a given seed (up to the
random row choices Postgres makes).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg

SERVICES = [uuid.UUID(int=(0x5E << 120) + i) for i in range(6)]
# The demo writes these into its source's ``services`` table; its summary reads them back
# from that table's mirror.
SERVICE_NAMES = dict(zip(SERVICES, ("Passport Office", "Vehicle Licensing", "Tax Credits",
                                    "Court Bookings", "School Admissions", "Flood Alerts")))
TEMPLATES = [uuid.UUID(int=(0x7E << 120) + i) for i in range(4)]
TYPES = ("email", "sms", "letter")
FINAL = ("delivered", "permanent-failure", "temporary-failure", "technical-failure")

_INSERT = """
INSERT INTO notifications (id, service_id, template_id, notification_type,
                           notification_status, key_type, created_at, "to", billable_units)
SELECT gen_random_uuid(), (%(services)s::uuid[])[1 + floor(random() * %(ns)s)::int],
       (%(templates)s::uuid[])[1 + floor(random() * %(nt)s)::int],
       (%(types)s::notification_type[])[1 + floor(random() * 3)::int],
       'created', 'normal', now(), 'someone@example.com', 1
FROM generate_series(1, %(n)s)"""


def _insert(conn: psycopg.Connection, n: int) -> None:
    conn.execute(_INSERT, {"services": SERVICES, "templates": TEMPLATES, "types": list(TYPES),
                           "ns": len(SERVICES), "nt": len(TEMPLATES), "n": n})


class Traffic:
    def __init__(self, dsn: str, seed: int = 1) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.steps = 0

    def step(self, conn: psycopg.Connection, inserts: int = 20) -> None:
        rng = self.rng
        _insert(conn, inserts)
        conn.execute("UPDATE notifications SET notification_status = 'sending', "
                     "sent_at = now() WHERE notification_status = 'created' AND "
                     "random() < 0.5")
        final = rng.choices(FINAL, weights=(90, 4, 4, 2))[0]
        conn.execute("UPDATE notifications SET notification_status = %s, updated_at = now() "
                     "WHERE notification_status = 'sending' AND random() < 0.4", [final])
        if rng.random() < 0.3:
            with conn.transaction():
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS moving (id uuid) ON COMMIT DROP")
                conn.execute("INSERT INTO moving SELECT id FROM notifications WHERE "
                             "notification_status = ANY(%s) AND random() < 0.3",
                             [list(FINAL)])
                conn.execute("INSERT INTO notification_history SELECT n.* FROM notifications n "
                             "JOIN moving USING (id)")
                conn.execute("DELETE FROM notifications n USING moving m WHERE n.id = m.id")
        if rng.random() < 0.2:
            conn.execute("DELETE FROM notifications WHERE id IN (SELECT id FROM notifications "
                         "ORDER BY random() LIMIT 2)")
        if rng.random() < 0.2:
            try:
                with conn.transaction():
                    _insert(conn, 5)
                    raise _Rollback
            except _Rollback:
                pass
        self.steps += 1

    def run(self, stop: threading.Event, interval_s: float = 0.2, inserts: int = 20) -> None:
        """Steps until ``stop`` is set (for a background thread)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not stop.is_set():
                started = time.monotonic()
                self.step(conn, inserts)
                stop.wait(max(0.0, interval_s - (time.monotonic() - started)))


class _Rollback(Exception):
    pass


@dataclass
class FreshnessProbe:
    """The freshness probe: every ``every_s``, one notification of a service never seen
    before, committed on its own; ``watch`` polls the dashboard for those services.

    A probe's latency runs from its commit returning to the first dashboard poll that shows
    its service (polls every ``poll_s``: the figure errs high by up to that much). Probes go
    into ``notification_history``, which the traffic never changes, so no later change of
    the traffic can cancel one inside a batch.
    """

    dsn: str
    dashboard_dsn: str
    tag: str
    every_s: float = 0.5
    poll_s: float = 0.05
    committed: dict = field(default_factory=dict)     # service id -> time.time() of commit
    seen: dict = field(default_factory=dict)          # service id -> time.time() first seen

    def run(self, stop: threading.Event) -> None:
        """Commit probes until ``stop`` is set."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            n = 0
            started = time.monotonic()
            while not stop.is_set():
                service = str(uuid.uuid5(uuid.NAMESPACE_URL, f"lakecdc-probe/{self.tag}/{n}"))
                conn.execute(
                    "INSERT INTO notification_history (id, service_id, template_id, "
                    "notification_type, notification_status, key_type, created_at) "
                    "VALUES (gen_random_uuid(), %s, %s, 'email', 'delivered', 'normal', now())",
                    [service, service])
                self.committed[service] = time.time()
                n += 1
                stop.wait(max(0.0, started + n * self.every_s - time.monotonic()))

    def watch(self, stop: threading.Event) -> None:
        """Poll the dashboard for probe services until ``stop`` is set and every committed
        probe has been seen (or ``stop`` has been set for 120 s)."""
        given_up = None
        with psycopg.connect(self.dashboard_dsn, autocommit=True) as conn:
            while True:
                pending = [s for s in list(self.committed) if s not in self.seen]
                if pending:
                    found = conn.execute(
                        "SELECT DISTINCT service_id FROM service_stats "
                        "WHERE service_id = ANY(%s)", [pending]).fetchall()
                    now = time.time()
                    for (service,) in found:
                        self.seen.setdefault(service, now)
                if stop.is_set():
                    given_up = given_up or time.monotonic() + 120
                    if not pending or time.monotonic() > given_up:
                        return
                time.sleep(self.poll_s)

    def latencies(self) -> list[tuple[float, float]]:
        """(commit time, seconds until seen) per probe seen, in commit order."""
        return sorted((t, self.seen[s] - t) for s, t in self.committed.items()
                      if s in self.seen)
