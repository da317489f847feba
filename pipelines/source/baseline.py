"""The exact baseline: rows that existed before the slot, counted at its consistent point.

Rows already in the source when the slot is created have no INSERT in the WAL. ``setup``
creates the slot with an exported snapshot, which sees exactly the transactions committed
before the slot's consistent point; counting inside it gives ``service_stats`` as of that
point. The counts are kept in ``<lakehouse>/gold/_baseline`` (the consistent point as a
Delta app transaction) and seed gold on its first run, so the first ``run`` on a populated
database is exact. They are written and read through the engine (``core.engine``); the
consistent point is also the commit's lakecdc metadata (layer ``baseline``), read where a
table records no app transaction.

The count runs in primary-key chunks in a REPEATABLE READ transaction on the snapshot
(``pipelines.source.truth.count_truth``): MVCC, so writers are not blocked; memory is
bounded by the number of keys, not rows; a progress bar shows on a terminal.
"""

from __future__ import annotations

import pyarrow as pa

from core.captured import DIMS, CountedTables
from core.commits import commit_metadata, newest
from core.engine.api import Engine

APP_ID = "lakecdc-baseline"
LAYER = "baseline"          # its commits' lakecdc metadata (``core.commits``)
SCHEMA = pa.schema([*[pa.field(c, pa.string(), nullable=False) for c in DIMS],
                    pa.field("count", pa.int64(), nullable=False)])


def count_in_snapshot(dsn: str, snapshot_name: str, tables: CountedTables) -> pa.Table:
    """service_stats of the counted ``tables`` as of an exported snapshot (the slot's
    consistent point)."""
    from pipelines.source.consistent import ConsistentPoint, count_at

    counts = count_at(dsn, ConsistentPoint(0, snapshot_name), tables, "counting the baseline")
    return to_table(counts)


def to_table(counts) -> pa.Table:
    """A ``{dims: count}`` mapping as the baseline's Arrow table."""
    return pa.Table.from_pylist([dict(zip((*DIMS, "count"), (*k, v)))
                                 for k, v in sorted(counts.items())], schema=SCHEMA)


def write_baseline(uri: str, counts: pa.Table, commit_lsn: int,
                   storage_options: dict | None = None, engine: Engine | None = None) -> None:
    """Replace the baseline with ``counts`` as of ``commit_lsn`` in one commit, through
    ``engine`` (None: delta-rs with ``storage_options``)."""
    engine = _engine(engine, storage_options)
    engine.create(uri, SCHEMA)
    engine.append(uri, counts, overwrite=True, app=(APP_ID, commit_lsn),
                  meta=commit_metadata(LAYER, commit_lsn=commit_lsn))


def read_baseline(uri: str, storage_options: dict | None = None, engine: Engine | None = None
                  ) -> tuple[int, pa.Table] | None:
    """The baseline's consistent point and counts (None: none written), through ``engine``
    (None: delta-rs with ``storage_options``)."""
    engine = _engine(engine, storage_options)
    point = recorded_point(engine, uri, APP_ID, LAYER)
    if point is None:
        return None
    return point, engine.read(uri).select(SCHEMA.names).cast(SCHEMA)


def recorded_point(engine: Engine, uri: str, app_id: str, layer: str) -> int | None:
    """The consistent point a baseline's table records: its app transaction ``app_id``,
    else its newest commit metadata of ``layer`` (``commit_lsn``); None: no table, or none
    recorded."""
    found = engine.recorded(uri)
    if found is None:
        return None
    point = found.version_of(app_id)
    if point is not None:
        return point
    meta = newest(engine.commits(uri, layer, limit=20))
    return None if meta is None else int(meta["commit_lsn"])


def _engine(engine: Engine | None, storage_options: dict | None) -> Engine:
    """``engine``, or delta-rs with ``storage_options`` for a caller that names none."""
    if engine is not None:
        return engine
    from core.engine.delta_rs import DeltaRs

    return DeltaRs(storage_options)
