"""Gold's applied steps before they are folded into ``service_stats``: ``gold/_deltas``.

A copy-on-write MERGE rewrites every file holding a key it changes. A batch's few hundred
keys are spread over all of a large gold, so each MERGE rewrites nearly the whole table:
its cost follows gold's size, and hardly the keys it changes (docs/gold.md, "Folds"), so
gold takes a batch's step by appending its key deltas to ``_deltas`` (a few milliseconds,
whatever gold's size) and *folds* what accumulated there into ``service_stats`` in one
MERGE when ``FoldClock`` says so: at most ``Config.gold_fold_share`` of the time goes to
folding (``LAKECDC_GOLD_FOLD_SHARE``). A small gold folds every batch or two, as it MERGEd
every batch before; a large one every several seconds. Folds run in the background, beside
the batches (``gold.apply``).

Rows of ``_deltas`` (``DELTAS``): a key, its net delta and newest commit in one batch, and
the batch id (``SHIP_STEP`` for a shipper batch's step, ``gold.ahead``). Each append's
commit carries the step in its metadata (``commit_lsn``, ``commit_ts``, ``floor``,
``epoch``, ``batch_id``: ``gold.apply``) and the step's watermark in an app transaction
(``gold.asof.step_app_id``); the fold's MERGE carries the newest step it folds, and that
step's watermark in gold's app transaction (``gold.asof.folded_app_id``), which says which
rows are folded: those at or below it. The first append after a fold overwrites
``_deltas``, which then holds only what is not folded yet.

Pure Arrow here; the writes are ``gold.apply``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from core.captured import DIMS
from core.config import GOLD_FOLD_SHARE
from core.handle import CHECKPOINTS
from gold.deltas import KEY_DELTAS
from gold.plan import KEY_DELTA_COLUMNS

DELTAS_SCHEMA = StructType([*KEY_DELTAS.fields, StructField("batch_id", LongType(), False)])
DELTAS = to_arrow_schema(DELTAS_SCHEMA)
DELTAS_PROPERTIES = {**CHECKPOINTS, "delta.enableDeletionVectors": "false"}
# The batch id of a step ahead of the stream, a shipper batch's (it is no stream batch).
SHIP_STEP = -1


def stamped(key_deltas: pa.Table, batch_id: int) -> pa.Table:
    """A batch's key deltas (``KEY_DELTA_COLUMNS``) as rows of ``_deltas``."""
    return key_deltas.append_column(DELTAS.field("batch_id"),
                                    pa.repeat(pa.scalar(batch_id, pa.int64()),
                                              key_deltas.num_rows)).cast(DELTAS)


def unfolded(rows: pa.Table, folded_lsn: int | None, floor: int,
             folded_batch: int | None = None) -> pa.Table:
    """The rows of ``_deltas`` not in gold yet: past ``folded_lsn``, the watermark of the
    newest step folded (each step's rows lie past the watermark of the step before it, so
    those of the steps gold holds are exactly the rows at or below it); where gold records
    none (folded before folds recorded it), after batch ``folded_batch``; all if neither.
    And at or past gold's ``floor`` (older rows are inside a rebuild's baseline)."""
    keep = pc.greater_equal(rows.column("last_commit_lsn"), floor)
    if folded_lsn is not None:
        keep = pc.and_(keep, pc.greater(rows.column("last_commit_lsn"), folded_lsn))
    elif folded_batch is not None:
        keep = pc.and_(keep, pc.greater(rows.column("batch_id"), folded_batch))
    return rows.filter(keep)


def summed(parts: list[pa.Table]) -> pa.Table:
    """Key deltas of several batches (``_deltas`` rows read back hold several too) as one
    MERGE source, a row per key (``KEY_DELTA_COLUMNS``): the sum of the deltas and the
    newest commit; keys whose deltas sum to 0 are kept, so the fold moves their
    ``last_commit_lsn`` as one MERGE per batch would have."""
    table = pa.concat_tables(
        [p.select(KEY_DELTA_COLUMNS.names).cast(KEY_DELTA_COLUMNS) for p in parts]) \
        if parts else KEY_DELTA_COLUMNS.empty_table()
    if table.num_rows == 0:
        return table
    out = table.group_by(list(DIMS), use_threads=False).aggregate(
        [("delta", "sum"), ("last_commit_lsn", "max")])
    return out.rename_columns([*DIMS, "delta", "last_commit_lsn"]).select(
        KEY_DELTA_COLUMNS.names).cast(KEY_DELTA_COLUMNS)


@dataclass
class FoldClock:
    """When the next fold is due: ``(1 - share) / share`` times the last fold's seconds
    after it ended; at once when none has run in this process. A share of 1 folds every
    time; 0 never (only when told: the stream's end)."""

    share: float = GOLD_FOLD_SHARE
    now: Callable[[], float] = time.monotonic
    _due_at: float | None = field(default=None, repr=False)

    def due(self) -> bool:
        if self.share <= 0:
            return False
        return self._due_at is None or self.now() >= self._due_at

    def folded(self, seconds: float) -> None:
        if self.share > 0:
            self._due_at = self.now() + seconds * (1.0 - self.share) / self.share
