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
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable

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


@dataclass(kw_only=True)
class Probe:
    """A freshness probe: every ``every_s``, one change committed on its own (``commit``,
    which returns its key); ``watch`` looks for the keys at the far end (``looking``) every
    ``poll_s``. A probe's latency runs from its commit returning to the first look that
    finds it (the figure errs high by up to ``poll_s``)."""

    dsn: str
    every_s: float = 0.5
    poll_s: float = 0.05
    committed: dict = field(default_factory=dict)     # key -> time.time() of commit
    seen: dict = field(default_factory=dict)          # key -> time.time() first seen

    def commit(self, conn: psycopg.Connection, n: int):
        """Commit probe ``n``; its key."""
        raise NotImplementedError

    def looking(self) -> AbstractContextManager[Callable[[list], Iterable]]:
        """A look: the keys among those given that the far end holds."""
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """Commit probes until ``stop`` is set."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            n = 0
            started = time.monotonic()
            while not stop.is_set():
                key = self.commit(conn, n)
                self.committed[key] = time.time()
                n += 1
                stop.wait(max(0.0, started + n * self.every_s - time.monotonic()))

    def watch(self, stop: threading.Event) -> None:
        """Look for the probes until ``stop`` is set and every committed probe has been
        seen (or ``stop`` has been set for 120 s)."""
        given_up = None
        with self.looking() as look:
            while True:
                pending = [k for k in list(self.committed) if k not in self.seen]
                if pending:
                    found = look(pending)
                    now = time.time()
                    for key in found:
                        self.seen.setdefault(key, now)
                if stop.is_set():
                    given_up = given_up or time.monotonic() + 120
                    if not pending or time.monotonic() > given_up:
                        return
                time.sleep(self.poll_s)

    def latencies(self) -> list[tuple[float, float]]:
        """(commit time, seconds until seen) per probe seen, in commit order."""
        return sorted((t, self.seen[k] - t) for k, t in self.committed.items()
                      if k in self.seen)


@dataclass(kw_only=True)
class FreshnessProbe(Probe):
    """The dashboard's probe: a notification of a service never seen before, looked for in
    the dashboard's ``service_stats``. Probes go into ``notification_history``, which the
    traffic never changes, so no later change of the traffic can cancel one inside a batch.
    """

    dashboard_dsn: str
    tag: str

    def commit(self, conn: psycopg.Connection, n: int) -> str:
        service = str(uuid.uuid5(uuid.NAMESPACE_URL, f"lakecdc-probe/{self.tag}/{n}"))
        conn.execute(
            "INSERT INTO notification_history (id, service_id, template_id, "
            "notification_type, notification_status, key_type, created_at) "
            "VALUES (gen_random_uuid(), %s, %s, 'email', 'delivered', 'normal', now())",
            [service, service])
        return service

    @contextmanager
    def looking(self):
        with psycopg.connect(self.dashboard_dsn, autocommit=True) as conn:
            yield lambda pending: [service for (service,) in conn.execute(
                "SELECT DISTINCT service_id FROM service_stats WHERE service_id = ANY(%s)",
                [pending]).fetchall()]
