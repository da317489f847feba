"""Gold's own commits, on the engine the pipeline chose (``core.engine``).

``gold.apply.GoldBatchWriter`` decides what to commit and when (a batch's step appended to
``_deltas``, a fold MERGEd into ``service_stats``, the app transaction and metadata of
each); this module makes those commits and reads back what a writer needs when it starts
(``recover``). Both engines carry the same metadata (``core.commits``) and the same app
transactions, so either reads what the other wrote. What a table holds is read from its app
transactions, which checkpoints carry; the metadata, which log cleanup deletes with its
commit, only describes (F30).

Two engines serve it: ``folds`` MERGEs into gold, ``steps`` appends to ``_deltas``, so a
fold running in the background never waits for a step's append (Spark: each engine is a
session of its own, one commit at a time; delta-rs: one engine may serve both, its kept
handles locked per table). delta-rs records an app transaction but skips nothing
(``GoldBatchWriter`` checks first), and commits no MERGE that changes no row: an empty
append then carries the fold's metadata (``core.engine.delta_rs.merge_recorded``). Spark
skips a commit whose app version it has recorded, and commits every MERGE.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from core.captured import DIMS
from core.commits import newest
from core.engine.api import Engine

# How far back a start looks for the metadata of ``_deltas``' newest step (its time, its
# transactions: descriptions only; maintenance commits between them).
HISTORY = 100


@dataclass(frozen=True)
class Waiting:
    """What ``_deltas`` holds when a writer starts (``GoldWrites.deltas``)."""

    step_lsn: int | None        # the newest step's watermark (its app transaction; None: none)
    meta: dict | None           # the newest lakecdc metadata of its history, if still there
    rows: pa.Table              # its rows (``gold.fold.DELTAS``)


# The fold's MERGE (gold ``t``, the key deltas ``s``): a key's count moves by its delta; a
# new key starts at it.
_ON = " AND ".join(f"t.{c} = s.{c}" for c in DIMS)
_UPDATE = {"count": "t.count + s.delta",
           "last_commit_lsn": "greatest(t.last_commit_lsn, s.last_commit_lsn)",
           "updated_at": "s.updated_at"}
_INSERT = {**{c: f"s.{c}" for c in DIMS}, "count": "s.delta",
           "last_commit_lsn": "s.last_commit_lsn", "updated_at": "s.updated_at"}


class GoldWrites:
    """Gold's commits to ``gold`` (``service_stats``) through ``folds`` and to ``deltas``
    (``_deltas``) through ``steps`` (None: ``folds.sibling()``, an engine whose commits never
    wait for a fold's)."""

    def __init__(self, gold: str, deltas: str, folds: Engine,
                 steps: Engine | None = None) -> None:
        self.gold, self.deltas_path = gold, deltas
        self._folds = folds
        self._steps = steps if steps is not None else folds.sibling()

    def append_step(self, rows: pa.Table, meta: str, overwrite: bool,
                    app: tuple[str, int]) -> None:
        """Append a step's rows to ``_deltas`` (``overwrite``: replace what it holds) in one
        commit with ``meta`` and the app transaction ``app``."""
        self._steps.append(self.deltas_path, rows, meta=meta, overwrite=overwrite, app=app)

    def fold(self, source: pa.Table, meta: str, app: tuple[str, int] | None) -> dict:
        """MERGE key deltas (``KEY_DELTA_COLUMNS`` + ``updated_at``) into gold in one commit
        with ``meta`` and ``app``; the MERGE's row counts (``Engine.merge``)."""
        return self._folds.merge(self.gold, source, _ON, update=_UPDATE, insert=_INSERT,
                                 meta=meta, app=app)

    def recorded(self, app_id: str) -> int | None:
        """The version gold records for ``app_id`` (its app transaction)."""
        found = self._folds.recorded(self.gold)
        return None if found is None else found.version_of(app_id)

    def deltas(self, step_app_id: str) -> Waiting:
        """What ``_deltas`` holds, its newest step's watermark recorded for
        ``step_app_id``. Only this writer writes ``_deltas`` (the gold lock), and not while
        a writer starts, so the three reads see one version."""
        found = self._steps.recorded(self.deltas_path)
        meta = newest(self._steps.commits(self.deltas_path, limit=HISTORY))
        return Waiting(None if found is None else found.version_of(step_app_id), meta,
                       self._steps.read(self.deltas_path))
