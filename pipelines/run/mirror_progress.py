"""Where the mirrors are complete: the ``mirrors`` row of the dashboard's
``lakecdc_layer_progress`` (docs/silver.md, "Mirrors").

``MirrorProgress.record`` is the mirrors' query's ``on_complete``: after each batch, every
mirror holds every source transaction up to the batch's newest whole one, and that commit
(LSN, time) is upserted here, on a connection of its own, so ``lakecdc mirrors`` run alone
(the bundle's ``mirrors`` task) records it too; ``lakecdc tables`` shows it
(``gold.push.read_layer``).

Recording is a report, never a reason to stop the mirrors: a dashboard that cannot be
reached is tried again after ``RETRY_S``, and one whose table predates the row (its CHECK
constraint lacks ``mirrors``) is reported once, with the statement its owner runs.
"""

from __future__ import annotations

import logging
import time

import psycopg

from core.postgres import connect
from gold.push import LAYER_TABLE, MIRRORS_LAYER, record_layer

log = logging.getLogger("lakecdc.mirrors")

RETRY_S = 30.0
UPGRADE_SQL = (f"ALTER TABLE {LAYER_TABLE} DROP CONSTRAINT {LAYER_TABLE}_layer_check, "
               "ADD CONSTRAINT lakecdc_layer_progress_layer_check CHECK (layer IN ('bronze', "
               "'silver', 'gold', 'dashboard', 'mirrors'))")


class MirrorProgress:
    """Records the mirrors' complete-as-of mark of gold table ``key`` in ``dsn``."""

    def __init__(self, dsn: str, key: str) -> None:
        self.dsn = dsn
        self.key = key
        self._conn: psycopg.Connection | None = None
        self._retry_at = 0.0
        self._refused = False           # the table cannot hold the row: reported once

    def record(self, lsn: int, at) -> None:
        if self._refused or time.monotonic() < self._retry_at:
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.dsn, what="dashboard")
            record_layer(self._conn, self.key, MIRRORS_LAYER, lsn, at)
        except psycopg.errors.CheckViolation:
            self._refused = True
            log.warning("the dashboard's %s predates the mirrors' row, so where the mirrors "
                        "are complete is not recorded; as the table's owner run: %s",
                        LAYER_TABLE, UPGRADE_SQL)
        except Exception as exc:              # never stops the mirrors
            self.close()
            self._retry_at = time.monotonic() + RETRY_S
            log.warning("could not record where the mirrors are complete (%s); trying again "
                        "in %.0f s", str(exc).splitlines()[0] if str(exc) else exc, RETRY_S)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None
