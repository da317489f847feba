"""One writer at a time where exactness needs it, with Postgres advisory locks.

- the shipper holds ``lakecdc.ship:<slot>`` on the source (``bronze.ship``);
- whoever writes gold - the stream of ``lakecdc stream`` / ``lakecdc run``, a rebuild,
  ``verify --repair``, ``backfill reprocess-silver`` - holds ``lakecdc.gold:<gold path>`` on
  the dashboard database (every gold writer already talks to it to push);
- the mirrors' query holds ``lakecdc.mirrors:<lakehouse>`` there too;
- ``lakecdc maintain`` takes each of these in turn for the tables of that writer
  (``pipelines.maintain.once``), and passes over the tables of a writer that is running:
  that writer maintains them itself.

Session-level locks: held while the connection is open, released by the server when the
process dies, so a ``kill -9`` never leaves a stale lock behind. A session of another role
holding one of these names cannot keep lakecdc from running (``acquire``).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import sha256
from typing import Iterator

import psycopg

from core.errors import UserError
from core.postgres import connect
from core.storage import gold_key

log = logging.getLogger("lakecdc.locks")


def gold_lock_name(gold_path: str) -> str:
    """One name per gold table, however an engine spells its path (``core.storage.gold_key``:
    ``s3a://`` locally and ``s3://`` on Databricks are the same table)."""
    return f"lakecdc.gold:{gold_key(gold_path)}"


def ship_lock_name(slot: str) -> str:
    return f"lakecdc.ship:{slot}"


def mirrors_lock_name(lakehouse: str) -> str:
    """Held by the mirrors' query (``lakecdc mirrors``, ``run``): one writer of the mirrors."""
    return f"lakecdc.mirrors:{gold_key(lakehouse)}"


def ship_application(slot: str) -> str:
    """The ``application_name`` of the shipper's source session on ``slot``."""
    return f"lakecdc ship {slot}"[:63]


def shipper_running(conn: psycopg.Connection, slot: str) -> bool:
    """Whether a shipper of this connection's role runs on ``slot``: it holds the ship lock,
    or - when a session of another role took the lock first and the shipper passed it over
    (``acquire``) - its session is there under its application name."""
    return is_held(conn, ship_lock_name(slot)) or bool(
        _own_sessions(conn, ship_application(slot)))


def is_held(conn: psycopg.Connection, name: str, any_role: bool = False) -> bool:
    """Whether a session of this connection's role (``any_role``: of any role) holds the
    advisory lock ``name`` on ``conn``'s database. Sessions of other roles are not the
    pipeline's own (see ``acquire``)."""
    return any(any_role or h.same_role for h in holders(conn, name))


@dataclass(frozen=True)
class Holder:
    pid: int
    role: str
    application: str
    client: str | None
    same_role: bool

    def describe(self) -> str:
        return (f"PID {self.pid}, role {self.role}, application {self.application!r}"
                + (f", from {self.client}" if self.client else ""))


def holders(conn: psycopg.Connection, name: str) -> list[Holder]:
    """The sessions holding advisory lock ``name`` on ``conn``'s database."""
    rows = conn.execute("""
        WITH k AS (SELECT hashtextextended(%s, 0) AS key)
        SELECT l.pid, coalesce(a.usename, '?'), coalesce(a.application_name, ''),
               host(a.client_addr), a.usename = current_user
        FROM pg_locks l CROSS JOIN k LEFT JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::text::bigint = (k.key >> 32) & 4294967295
          AND l.objid::text::bigint = k.key & 4294967295
          AND l.pid <> pg_backend_pid()""", [name]).fetchall()
    return [Holder(pid, role, app, client, bool(same)) for pid, role, app, client, same in rows]


def acquire(conn: psycopg.Connection, name: str, application: str, busy: str) -> None:
    """Take advisory lock ``name`` for ``conn``'s session, which is named ``application``;
    ``UserError(busy …)`` saying who holds it when another lakecdc process does.

    Advisory locks have no privileges: any role that can connect can take any key, and
    lakecdc's names are public. Every lakecdc process of a pipeline connects as the
    pipeline's role, so a lock held only by sessions of *other* roles is a squatter's: it
    is passed over (and named in a warning), and exclusion then rests on what a squatter
    cannot fake - a session of our own role with this lock's application name.
    """
    conn.execute("SELECT set_config('application_name', %s, false)", [application[:63]])
    if conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                    [name]).fetchone()[0]:
        return
    found = holders(conn, name)
    ours = [h for h in found if h.same_role] or _own_sessions(conn, application)
    if ours:
        raise UserError(f"{busy} It is held by {ours[0].describe()}.")
    log.warning("the lock %s is held by %s, a session of another role: not a lakecdc "
                "process of this pipeline, so it is passed over (end that session and "
                "restrict who can connect: docs/security.md)", name,
                "; ".join(h.describe() for h in found) or "a session that has ended")


@contextmanager
def locked(conn: psycopg.Connection, name: str, application: str, busy: str) -> Iterator[None]:
    """Hold advisory lock ``name`` on ``conn`` for the block (``acquire``), and give it back
    at its end however it ends (``release``), so a command refused inside it leaves no
    lock behind for the next one to trip over."""
    acquire(conn, name, application, busy)
    try:
        yield
    finally:
        release(conn, name)


def _own_sessions(conn: psycopg.Connection, application: str) -> list[Holder]:
    """Other sessions of this connection's role on its database named ``application``."""
    return [Holder(pid, role, app, client, True) for pid, role, app, client in conn.execute(
        "SELECT pid, usename, application_name, host(client_addr) FROM pg_stat_activity "
        "WHERE usename = current_user AND datname = current_database() AND "
        "application_name = %s AND pid <> pg_backend_pid()", [application[:63]]).fetchall()]


@contextmanager
def exclusive(dsn: str, name: str, busy: str, what: str = "dashboard") -> Iterator[None]:
    """Hold advisory lock ``name`` for the block (see ``acquire``)."""
    with connect(dsn, what=what) as conn, locked(
            conn, name, f"lakecdc {name.split(':', 1)[0].split('.')[-1]} "
            f"{sha256(name.encode()).hexdigest()[:16]}", busy):
        yield


def release(conn: psycopg.Connection, name: str) -> None:
    """Give advisory lock ``name`` back now. Closing the connection releases it too, but
    only once the server's backend has exited, a moment after the client left: the next
    process (``run --once`` right after another) could still find it held and refuse."""
    try:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [name])
    except psycopg.Error:
        pass    # the session is gone (server restart): so is its lock


@contextmanager
def mirrors_writer_lock(dashboard_dsn: str, lakehouse: str) -> Iterator[None]:
    with exclusive(dashboard_dsn, mirrors_lock_name(lakehouse),
                   f"another lakecdc process is writing the mirrors of {lakehouse} "
                   "(`lakecdc run` or `lakecdc mirrors`); stop it first, only one may."):
        yield


@contextmanager
def gold_writer_lock(dashboard_dsn: str, gold_path: str) -> Iterator[None]:
    with exclusive(dashboard_dsn, gold_lock_name(gold_path),
                   f"another lakecdc process is writing gold at {gold_path} (`lakecdc run`, "
                   "`lakecdc stream` or a rebuild); stop it first, only one may write gold."):
        yield
