"""Which of verify's markers the mirrors' query has passed.

Verify commits a count-neutral marker transaction after its consistent point
(``pipelines.source.consistent.emit_marker``). When a mirrors' batch carries one, every
mirror holds every change before it, so ``MirrorWriter`` records it here, in
``<lakehouse>/silver/_mirror_markers`` (a small append, only in the batches that carry a marker);
verify reads the newest one before it reads a mirror (``pipelines.verify.mirror_check``).
Written by the running pipeline, read by verify: it lives with the writer, so verify
depends on the run room and never the other way round. Both go through the engine given
(``core.engine``: Spark's where only Spark reaches storage, ``LAKECDC_WRITER=spark``).
"""

from __future__ import annotations

import time
from typing import Callable

import pyarrow as pa

from core.engine.api import Engine
from core.layout import MIRROR_MARKERS, path

_MARKERS = pa.schema([("marker_lsn", pa.int64()), ("batch_id", pa.int64()),
                      ("recorded_at", pa.timestamp("us", tz="UTC"))])


def record_marker(lakehouse: str, storage_options: dict | None = None,
                  engine: Engine | None = None) -> Callable[[int, int], None]:
    """For ``MirrorWriter``: note a verify marker every mirror holds (a small append, only
    in the batches that carry a marker), by ``engine``, the mirrors' (``_engine``)."""
    engine = _engine(storage_options, engine)
    uri = path(lakehouse, MIRROR_MARKERS)
    created = []

    def record(marker: int, batch_id: int) -> None:
        if not created:             # the first marker's append creates the table
            engine.create(uri, _MARKERS)
            created.append(True)
        rows = pa.table({"marker_lsn": [marker], "batch_id": [batch_id],
                         "recorded_at": [int(time.time() * 1e6)]}, schema=_MARKERS)
        engine.append(uri, rows)
    return record


def mirrors_position(lakehouse: str, storage_options: dict | None = None,
                     engine: Engine | None = None) -> int | None:
    """The newest verify marker the mirrors' query has passed (None: none yet), read by
    ``engine`` (``_engine``)."""
    engine = _engine(storage_options, engine)
    uri = path(lakehouse, MIRROR_MARKERS)
    if not engine.exists(uri):
        return None
    values = engine.read(uri, columns=["marker_lsn"]).column("marker_lsn").to_pylist()
    return max(values, default=None)


def _engine(storage_options: dict | None, engine: Engine | None) -> Engine:
    """``engine``; None: delta-rs with ``storage_options``, as callers that hold only those
    read and write the markers."""
    if engine is not None:
        return engine
    from core.engine.delta_rs import DeltaRs

    return DeltaRs(storage_options)
