"""Benchmark workloads on the Notify-like schema (``infra/postgres/source_schema.sql``).

Four kinds of workload, all sized by parameters:

- ``write_backlog``: a deterministic backlog of about ``changes`` changes in rounds of
  inserts, status transitions, archival moves (INSERT history + DELETE in one transaction)
  and hard deletes of about 10% of the inserted rows. Deterministic means: ids and dims come
  from the round and row number, and every choice of rows is a hash of the row's id, never
  ``random()``; the same call on two databases with the same schema leaves the same rows in
  both (the PoC's twin database relies on it).
- ``populate``: ``rows`` notifications spread over ``rows // rows_per_service`` services and
  every status, written before ``setup`` (they reach gold through the baseline), and
  ``fixed_batch``: a batch of exactly ``changes`` status changes of existing rows. The gold
  scaling benchmark uses them: the same batch against a source (and gold) ten times larger.
- ``SteadyTraffic``: the same mix of operations at a steady rate of changes per second, for
  the freshness benchmark.
- ``Shape`` and ``write_shape``: catch-up backlogs of one kind each (inserts, updates, or
  inserts then updates of the same rows), in transactions of 1 to 10,000 rows, narrow or
  wide (``shapes``, the catch-up section's).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

import psycopg

STATUSES = ("created", "sending", "delivered", "permanent-failure", "temporary-failure",
            "technical-failure")
FINAL = STATUSES[2:]
TEMPLATES = 4

# A row's service, template and type from hashes of its row number, in SQL.
_DIMS_SQL = """
    ('5e000000-0000-0000-0000-' || lpad(to_hex(({n_service}) %% %(services)s::int), 12,
                                        '0'))::uuid,
    ('7e000000-0000-0000-0000-' || lpad(to_hex(({n_template}) %% {templates}), 12, '0'))::uuid,
    (ARRAY['email','sms','letter'])[1 + ({n_type}) %% 3]::notification_type"""

_INSERT = """
INSERT INTO notifications (id, service_id, template_id, notification_type, notification_status,
                           key_type, created_at, "to", reference, billable_units{wide_columns})
SELECT md5(%(tag)s || '-' || g)::uuid, {dims}, {status}, 'normal', now(),
       'someone@example.com', 'ref-' || g, 1{wide_values}
FROM generate_series(%(first)s::bigint, %(last)s::bigint) g"""
# A wide row's personalisation: about 1.8 KB of JSON, as a letter's fills it.
_WIDE = (", personalisation",
         """, repeat('{"name": "A Person", "reference": "' || g || '"}', 40)""")

# Deterministic choice of a fraction of rows: a hash of the id and a salt per statement.
_PICK = "abs(hashtext(id::text || %(salt)s)) %% 1000 < %(per_mille)s"


def _insert_sql(status: str, wide: bool = False) -> str:
    # One hash per dim: a shared one would tie the dims together (h % 8 fixes h % 4).
    columns, values = _WIDE if wide else ("", "")
    return _INSERT.format(dims=_DIMS_SQL.format(
        n_service="abs(hashtext(g::text || %(tag)s || 's'))",
        n_template="abs(hashtext(g::text || %(tag)s || 't'))",
        n_type="abs(hashtext(g::text || %(tag)s || 'y'))", templates=TEMPLATES),
        status=status, wide_columns=columns, wide_values=values)


@dataclass
class Written:
    """What a workload wrote, by kind of change."""

    inserts: int = 0
    updates: int = 0
    archived: int = 0        # rows moved to history: 2 changes each
    deletes: int = 0
    transactions: int = 0

    @property
    def changes(self) -> int:
        return self.inserts + self.updates + 2 * self.archived + self.deletes

    def as_dict(self) -> dict:
        return {"inserts": self.inserts, "updates": self.updates, "archived": self.archived,
                "deletes": self.deletes, "transactions": self.transactions,
                "changes": self.changes}


def _insert(conn: psycopg.Connection, tag: str, first: int, last: int, services: int,
            status_sql: str = "'created'", wide: bool = False) -> int:
    return conn.execute(_insert_sql(status_sql, wide),
                        {"tag": tag, "first": first, "last": last,
                         "services": services}).rowcount


def _transition(conn: psycopg.Connection, old: str, new: str, per_mille: int,
                salt: str) -> int:
    return conn.execute(
        "UPDATE notifications SET notification_status = %(new)s, updated_at = now() "
        f"WHERE notification_status = %(old)s AND {_PICK}",
        {"new": new, "old": old, "salt": salt, "per_mille": per_mille}).rowcount


def _archive(conn: psycopg.Connection, per_mille: int, salt: str) -> int:
    """Move a share of finished rows to history: INSERT history + DELETE in one statement
    (so one transaction); returns the rows moved."""
    return conn.execute(
        "WITH moved AS (INSERT INTO notification_history SELECT * FROM notifications "
        f"WHERE notification_status = ANY(%(final)s) AND {_PICK} RETURNING id) "
        "DELETE FROM notifications WHERE id IN (SELECT id FROM moved)",
        {"final": list(FINAL), "salt": salt, "per_mille": per_mille}).rowcount


def write_backlog(dsn: str, changes: int, tx_size: int = 1000, services: int = 8,
                  round_rows: int = 5000, tag: str = "b") -> Written:
    """About ``changes`` changes (at least that many), in rounds of ``round_rows`` inserts
    in transactions of ``tx_size`` rows, then transitions, an archival move and hard
    deletes (≈10% of the rows inserted). Each statement is one transaction."""
    done = Written()
    with psycopg.connect(dsn, autocommit=True) as conn:
        r = 0
        while done.changes < changes:
            first = r * round_rows + 1
            for start in range(first, first + round_rows, tx_size):
                done.inserts += _insert(conn, tag, start,
                                        min(start + tx_size, first + round_rows) - 1, services)
                done.transactions += 1
            salt = f"{tag}{r}"
            done.updates += _transition(conn, "created", "sending", 600, salt + "s")
            for i, final in enumerate(FINAL):
                share = 400 if final == "delivered" else 40
                done.updates += _transition(conn, "sending", final, share, f"{salt}f{i}")
            done.archived += _archive(conn, 250, salt + "a")
            done.deletes += conn.execute(
                f"DELETE FROM notifications WHERE {_PICK}",
                {"salt": salt + "d", "per_mille": _delete_share(conn, round_rows)}).rowcount
            done.transactions += 4 + len(FINAL)
            r += 1
    return done


def _delete_share(conn: psycopg.Connection, round_rows: int) -> int:
    """Per mille of the live rows to delete so that a round deletes ≈10% of its inserts."""
    live = conn.execute("SELECT count(*) FROM notifications").fetchone()[0]
    return max(1, min(1000, round(100 * round_rows / max(live, 1))))


def insert_rows(conn: psycopg.Connection, tag: str, rows: int, services: int = 8) -> int:
    """``rows`` new notifications in one statement (one transaction)."""
    return _insert(conn, tag, 1, rows, services)


def populate(dsn: str, rows: int, rows_per_service: int = 2000, chunk: int = 200_000,
             tag: str = "p") -> int:
    """``rows`` notifications in every status; returns the number of services used."""
    services = max(1, rows // rows_per_service)
    status = "(ARRAY[{}])[1 + abs(hashtext(g::text || 's')) %% {}]".format(
        ", ".join(f"'{s}'" for s in STATUSES), len(STATUSES))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(1, rows + 1, chunk):
            _insert(conn, tag, start, min(start + chunk, rows + 1) - 1, services, status)
        conn.execute("VACUUM ANALYZE notifications")
    return services


# Keys per service of ``populate_keys``: 4 templates x 3 types x 6 statuses.
KEYS_PER_SERVICE = TEMPLATES * 3 * len(STATUSES)


def populate_keys(dsn: str, keys: int, rows_per_key: int = 2, chunk: int = 200_000,
                  tag: str = "k") -> int:
    """``rows_per_key`` notifications on each of ``keys`` distinct gold keys; returns the
    number of services. Row ``g`` gets key ``g * step mod keys`` (``step`` prime, so each
    key gets its rows): rows next to each other on disk, which the traffic's ``LIMIT``
    updates take together, belong to keys far apart, as a busy service's traffic does."""
    step = 1_000_003
    assert keys % step, "keys must not be a multiple of the step"
    k = "((g * %(step)s) %% %(keys)s)"          # row g's key number, 0 <= k < keys
    sql = _INSERT.format(
        dims=_DIMS_SQL.format(n_service=f"{k} / {KEYS_PER_SERVICE}",
                              n_template=f"{k} / 18", n_type=f"{k} / 6",
                              templates=TEMPLATES),
        status=f"(%(statuses)s::text[])[1 + {k} %% {len(STATUSES)}]")
    services = -(-keys // KEYS_PER_SERVICE)
    rows = keys * rows_per_key
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(1, rows + 1, chunk):
            conn.execute(sql, {"tag": tag, "first": start,
                               "last": min(start + chunk, rows + 1) - 1, "step": step,
                               "keys": keys, "services": services,
                               "statuses": list(STATUSES)})
        conn.execute("VACUUM ANALYZE notifications")
    return services


def fixed_batch(dsn: str, changes: int, salt: str, tx_size: int = 1000) -> int:
    """Exactly ``changes`` status changes of existing rows (each moves a count between two
    keys), in transactions of ``tx_size``; rows picked by a hash of their id."""
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while done < changes:
            n = min(tx_size, changes - done)
            done += conn.execute(
                "UPDATE notifications SET notification_status = (%(statuses)s::text[])"
                "[1 + abs(hashtext(id::text || %(salt)s || 'to')) %% %(ns)s] "
                "WHERE id IN (SELECT id FROM notifications ORDER BY "
                "hashtext(id::text || %(salt)s) LIMIT %(n)s)",
                {"statuses": list(STATUSES), "ns": len(STATUSES), "salt": f"{salt}{done}",
                 "n": n}).rowcount
    return done


@dataclass
class SteadyTraffic:
    """Notify-like changes at ``rate`` changes per second, in ticks of ``tick_s``.

    Per tick: inserts (40% of the tick's changes), created → sending and sending → final
    transitions, one archival move and hard deletes of about 10%. Paced on the changes
    actually written, so a slow tick is caught up by the next ones.
    """

    dsn: str
    rate: float
    tag: str = "t"           # prefix of the ids it inserts: one per run on a database
    services: int = 8
    tick_s: float = 0.1
    written: Written = field(default_factory=Written)
    started: float | None = None
    elapsed_s: float = 0.0

    def run(self, stop: threading.Event,
            on_tick: Callable[[datetime], None] | None = None) -> None:
        """Write until ``stop`` is set. ``on_tick`` gets each tick's stamp (``_tick``)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self.started = time.monotonic()
            n = 0
            while not stop.is_set():
                due = (time.monotonic() - self.started + self.tick_s) * self.rate
                budget = int(due - self.written.changes)
                if budget > 0:
                    stamp = self._tick(conn, budget, n)
                    if on_tick is not None:
                        on_tick(stamp)
                n += 1
                stop.wait(max(0.0, self.started + n * self.tick_s - time.monotonic()))
            self.elapsed_s = time.monotonic() - self.started

    def _tick(self, conn: psycopg.Connection, budget: int, n: int) -> datetime:
        """One tick's changes; returns the start time of its last transaction (an insert,
        so it always reaches the slot): the tick is in any gold watermark at or past it."""
        w = self.written
        limited = ("UPDATE notifications SET notification_status = %s, updated_at = now() "
                   "WHERE id IN (SELECT id FROM notifications WHERE notification_status = %s "
                   "LIMIT %s)")
        w.updates += conn.execute(limited, ["sending", "created", int(budget * 0.2)]).rowcount
        w.updates += conn.execute(limited, [FINAL[n % len(FINAL)] if n % 5 == 0 else
                                            "delivered", "sending", int(budget * 0.2)]).rowcount
        w.archived += conn.execute(
            "WITH moved AS (INSERT INTO notification_history SELECT * FROM notifications "
            "WHERE id IN (SELECT id FROM notifications WHERE notification_status = ANY(%s) "
            "LIMIT %s) RETURNING id) DELETE FROM notifications WHERE id IN "
            "(SELECT id FROM moved)", [list(FINAL), max(0, int(budget * 0.05))]).rowcount
        w.deletes += conn.execute(
            "DELETE FROM notifications WHERE id IN (SELECT id FROM notifications "
            "WHERE notification_status = 'created' LIMIT %s)",
            [max(0, int(budget * 0.1))]).rowcount
        inserted, stamp = conn.execute(
            "WITH i AS (" + _insert_sql("'created'") + " RETURNING 1) "
            "SELECT count(*), now() FROM i",
            {"tag": f"{self.tag}{n}", "first": 1, "last": max(1, int(budget * 0.4)),
             "services": self.services}).fetchone()
        w.inserts += inserted
        w.transactions += 5
        return stamp


# Three captured tables beside the counted two, none of them counted: the neighbours whose
# mirrors ``lakecdc run`` keeps while the dashboard's freshness is measured (the
# gold path keeps its freshness while they change at 100 rows/s each). One has a composite
# key and one a TOASTed column.
NEIGHBOURS_SQL = """
CREATE TABLE services (id bigint PRIMARY KEY, name text NOT NULL, active boolean NOT NULL,
                       message_limit bigint, updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE templates (id bigint PRIMARY KEY, service_id bigint NOT NULL, name text NOT NULL,
                        version integer NOT NULL, content text);
ALTER TABLE templates ALTER COLUMN content SET STORAGE EXTERNAL;
CREATE TABLE service_users (service_id bigint, user_id bigint, role text NOT NULL,
                            since date NOT NULL, PRIMARY KEY (service_id, user_id));
"""
NEIGHBOURS = ("public.services", "public.templates", "public.service_users")
_NEIGHBOUR_ROWS = {
    # table: (insert of rows %(first)s..%(last)s, update of %(n)s rows, delete of %(n)s rows)
    "services": (
        "INSERT INTO services (id, name, active, message_limit) SELECT g, 'service ' || g, "
        "g %% 2 = 0, g * 1000 FROM generate_series(%(first)s::bigint, %(last)s::bigint) g",
        "UPDATE services SET name = name || '+', active = NOT active, updated_at = now() "
        "WHERE id IN (SELECT id FROM services WHERE id > 0 ORDER BY random() LIMIT %(n)s)",
        "DELETE FROM services WHERE id IN (SELECT id FROM services WHERE id > 0 "
        "ORDER BY random() LIMIT %(n)s)"),
    "templates": (
        "INSERT INTO templates SELECT g, g %% 97, 'template ' || g, 1, repeat(md5(g::text), "
        "80) FROM generate_series(%(first)s::bigint, %(last)s::bigint) g",
        # The TOASTed content is left alone: wal2json omits it, the mirror keeps it.
        "UPDATE templates SET version = version + 1, name = name || '+' "
        "WHERE id IN (SELECT id FROM templates ORDER BY random() LIMIT %(n)s)",
        "DELETE FROM templates WHERE id IN (SELECT id FROM templates ORDER BY random() "
        "LIMIT %(n)s)"),
    "service_users": (
        "INSERT INTO service_users SELECT g %% 97, g, 'member', "
        "DATE '2026-01-01' + (g %% 300)::int "
        "FROM generate_series(%(first)s::bigint, %(last)s::bigint) g",
        "UPDATE service_users SET role = CASE role WHEN 'member' THEN 'admin' ELSE 'member' "
        "END WHERE (service_id, user_id) IN (SELECT service_id, user_id FROM service_users "
        "ORDER BY random() LIMIT %(n)s)",
        "DELETE FROM service_users WHERE (service_id, user_id) IN (SELECT service_id, user_id "
        "FROM service_users ORDER BY random() LIMIT %(n)s)"),
}


@dataclass
class NeighbourTraffic:
    """``rate`` changed rows per second on each of the ``NEIGHBOURS`` tables, in ticks of
    ``tick_s``, one transaction per table and tick: inserts (half of them), updates and
    deletes (a quarter each). Paced like ``SteadyTraffic``. ``first_id``: where this run's
    inserted ids start (one range per run on a database)."""

    dsn: str
    rate: float = 100.0
    first_id: int = 1
    tick_s: float = 0.1
    changes: int = 0
    elapsed_s: float = 0.0

    def run(self, stop: threading.Event) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            started = time.monotonic()
            next_id, n = self.first_id, 0
            while not stop.is_set():
                due = (time.monotonic() - started + self.tick_s) * self.rate
                budget = int(due - self.changes / len(_NEIGHBOUR_ROWS))
                if budget > 0:
                    inserts, others = budget - budget // 2, budget // 4
                    for insert, update, delete in _NEIGHBOUR_ROWS.values():
                        with conn.transaction():
                            self.changes += conn.execute(insert, {
                                "first": next_id, "last": next_id + inserts - 1}).rowcount
                            self.changes += conn.execute(update, {"n": others}).rowcount
                            self.changes += conn.execute(delete, {"n": others}).rowcount
                    next_id += inserts
                n += 1
                stop.wait(max(0.0, started + n * self.tick_s - time.monotonic()))
            self.elapsed_s = time.monotonic() - started


@dataclass(frozen=True)
class Shape:
    """A catch-up backlog of about ``changes`` changes of one kind: ``inserts``;
    ``updates`` of rows inserted before it (``prepare_shape``), each row's status moved
    twice; or ``inserts+updates``, a third of the changes inserted, then each of those rows'
    status moved twice. Each statement is one transaction of ``tx_size`` rows; ``wide``
    rows carry about 1.8 KB of personalisation."""

    name: str
    kind: str
    tx_size: int
    changes: int
    wide: bool = False

    def rows(self) -> int:
        """The rows the shape inserts (before it, for ``updates``)."""
        return self.changes // {"inserts": 1, "updates": 2, "inserts+updates": 3}[self.kind]

    @property
    def tag(self) -> str:
        """Its rows' ids' prefix (``_insert``), the same before it and in it."""
        return "u" if self.kind == "updates" else "i"


def shapes(changes: int) -> tuple[Shape, ...]:
    """The catch-up section's shapes, each about ``changes`` changes (a tenth for the
    single-row transactions, which the bench itself commits one by one)."""
    return (Shape("single-row inserts", "inserts", 1, changes // 10),
            Shape("inserts, 10,000 a transaction", "inserts", 10_000, changes),
            Shape("updates only", "updates", 1000, changes),
            Shape("wide inserts", "inserts", 1000, changes, wide=True),
            Shape("wide inserts, then updates", "inserts+updates", 1000, changes, wide=True))


def prepare_shape(dsn: str, shape: Shape, services: int = 8) -> None:
    """What a shape's backlog needs before it: the rows an ``updates`` shape moves."""
    if shape.kind == "updates":
        with psycopg.connect(dsn, autocommit=True) as conn:
            for first in range(1, shape.rows() + 1, 10_000):
                _insert(conn, shape.tag, first, min(first + 9_999, shape.rows()), services,
                        wide=shape.wide)


def write_shape(dsn: str, shape: Shape, services: int = 8) -> Written:
    """``shape``'s backlog (``prepare_shape`` first)."""
    done, rows, size, tag = Written(), shape.rows(), shape.tx_size, shape.tag
    with psycopg.connect(dsn, autocommit=True) as conn:
        if shape.kind != "updates":
            for first in range(1, rows + 1, size):
                done.inserts += _insert(conn, tag, first, min(first + size, rows + 1) - 1,
                                        services, wide=shape.wide)
                done.transactions += 1
        if shape.kind != "inserts":
            for old, new in (("created", "sending"), ("sending", "delivered")):
                for first in range(1, rows + 1, size):
                    done.updates += conn.execute(
                        "UPDATE notifications SET notification_status = %(new)s, "
                        "updated_at = now() WHERE id IN (SELECT md5(%(tag)s || '-' || g)::uuid"
                        " FROM generate_series(%(first)s::bigint, %(last)s::bigint) g) "
                        "AND notification_status = %(old)s",
                        {"new": new, "old": old, "tag": tag, "first": first,
                         "last": min(first + size, rows + 1) - 1}).rowcount
                    done.transactions += 1
    return done
