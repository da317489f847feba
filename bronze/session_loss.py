"""When the shipper's source session is lost: which errors mean "gone, reconnect", the word
for why (``lakecdc_ship_reconnects_total``'s ``reason``), and what any other error of a
batch means (``diagnose``)."""

from __future__ import annotations

from typing import Callable

import psycopg

from bronze import slot as slots
from bronze.failover import slot_lost, slot_missing
from bronze.table import Progress
from core.errors import UserError

# SQLSTATEs after which the session is gone or the server is (re)starting: reconnect.
TRANSIENT_STATES = {"57P01", "57P02", "57P03", "57P05", "53300"}


def transient(exc: BaseException, conn: psycopg.Connection | None) -> bool:
    """The source session is gone or the server is not accepting it right now."""
    if not isinstance(exc, psycopg.Error) or isinstance(exc, psycopg.errors.QueryCanceled):
        return False
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = getattr(exc, "sqlstate", None)
    if state is None:          # raised by the client: refused, reset, closed, timed out
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return state.startswith("08") or state in TRANSIENT_STATES


# Why a source session was lost, by SQLSTATE (PostgreSQL's condition names): the label of
# ``lakecdc_ship_reconnects_total``.
_REASONS = {"57P01": "admin_shutdown",        # pg_terminate_backend, a fast/smart shutdown
            "57P02": "crash_shutdown",        # another backend crashed: the server restarts
            "57P03": "cannot_connect_now",    # starting up, shutting down, in recovery
            "57P05": "idle_session_timeout",
            "53300": "too_many_connections"}


# Every label ``reconnect_reason`` returns: a fixed set, so every metric series exists from 0.
RECONNECT_REASONS = (*_REASONS.values(), "connection_failure", "connection_lost")


def reconnect_reason(exc: BaseException) -> str:
    """One of a fixed set of words for why ``exc`` ended the source session: the server's
    reason when it sent one, ``connection_failure`` for SQLSTATE class 08, otherwise
    ``connection_lost`` (reset, refused, timed out, keepalives; the client's own report)."""
    state = getattr(exc, "sqlstate", None) or ""
    if state in _REASONS:
        return _REASONS[state]
    if state.startswith("08"):
        return "connection_failure"
    return "connection_lost"


def diagnose(exc: Exception, conn: psycopg.Connection, *, slot: str, peek_timeout_s: float,
             bronze_progress: Callable[[str], Progress | None], session_pid: int | None) -> None:
    """Return if ``exc`` means the source went away (reconnect); otherwise raise the error a
    person can act on, or ``exc`` itself. ``session_pid``: the shipper's own backend."""
    if isinstance(exc, psycopg.errors.QueryCanceled) and "statement timeout" in str(exc):
        raise UserError(f"a peek or advance of slot {slot} did not finish within "
                        f"--peek-timeout {peek_timeout_s}s; nothing was stored or advanced: "
                        "raise --peek-timeout (one transaction is always decoded whole), or "
                        "lower --max-changes.") from None
    if transient(exc, conn):
        return
    if isinstance(exc, psycopg.Error):
        # The slot may have been dropped, invalidated or taken between two statements.
        try:
            state = slots.slot_state(conn, slot)
            progress = bronze_progress(slot)
        except Exception:
            raise exc from None
        if progress is not None:
            if state is None:
                raise slot_missing(slot, progress) from None
            if state.invalidated:
                raise slot_lost(slot, state, progress) from None
        if state is not None and state.active_pid not in (None, session_pid):
            raise UserError(f"replication slot {slot} is in use by PID {state.active_pid}; "
                            "stop that consumer first.") from None
    raise exc
