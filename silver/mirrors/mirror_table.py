"""What a mirror table is, without Spark: the spec it is created from, its bookkeeping
columns, its table properties and the app transaction of its initial rows. Shared by the
mirrors' writer (``silver.mirrors.mirror_writer``, ``silver.mirrors.store``) and the load
(``pipelines.setup.mirror_loader``), which runs where Spark may not be installed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from core.handle import CHECKPOINTS
from core.maintenance import log_properties

COMMIT_LSN, COMMIT_TS = "_lakecdc_commit_lsn", "_lakecdc_commit_ts"
TYPES_PROPERTY = "lakecdc.sourceTypes"       # JSON {column: Postgres type}
KEY_PROPERTY = "lakecdc.keyColumns"          # JSON list of the primary key's columns
SEED_APP_ID = "lakecdc-mirror-seed"          # the initial rows' point (a baseline's seed)
# A load's (``pipelines.setup.mirror_loader``): its floor, recorded by its last chunk's commit,
# and by the commit after the MERGE that applied the changes held back while it ran. App
# transactions, which every checkpoint carries: the log's commits (their metadata) go at
# log cleanup, and a replay must still be recognised (``silver.mirrors.merge.due_replay``).
LOAD_APP_ID = "lakecdc-mirror-load"
REPLAYED_APP_ID = "lakecdc-mirror-replayed"
# A MERGE source's columns besides the mirror's (``silver.mirrors.typed_rows.merge_source``):
# whether the key's final row exists, and per non-key column ``i`` whether the batch carried it.
EXISTS, HAS_PREFIX = "__lakecdc_exists", "__lakecdc_has_"
# No deletion vectors: delta-rs (deltalake 1.6.6) refuses to read a table with that reader
# feature, and a mirror is read by delta-rs (``lakecdc tables``, the demo, users).
PROPERTIES = {"delta.enableDeletionVectors": "false", **CHECKPOINTS}


def mirror_properties(log_retention_minutes: int) -> dict[str, str]:
    """A mirror's and its tail's properties at creation: ``PROPERTIES`` and maintenance's
    log retention (``core.maintenance.log_properties``). Set then because a mirror of a
    table with a ``timestamp`` column (``timestamp_ntz``) is at reader version 3, where
    delta-rs cannot set a property afterwards (``core.features.properties_settable``)."""
    return {**PROPERTIES, **log_properties(log_retention_minutes)}


@dataclass(frozen=True)
class TableSpec:
    """A captured table as its mirror is created: columns (name, Postgres type as wal2json
    names it) in the source's order, and the primary key."""

    schema: str
    table: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def mirror_shape_of(properties: dict[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """A mirror's key and (column → Postgres type), from its table properties. Pure."""
    return (tuple(json.loads(properties[KEY_PROPERTY])),
            dict(json.loads(properties[TYPES_PROPERTY])))


def mirrored_columns(key: tuple[str, ...], types: dict[str, str]) -> list[str]:
    """The mirror's non-key columns, in the order
    ``silver.mirrors.typed_rows.merge_source`` numbers them. Pure."""
    return [n for n in types if n not in key]
