"""Where lakecdc's tables live under the lakehouse root: the one map of its layout.

A table is a ``(layer, name)`` pair; its path is ``<lakehouse>/<layer>/<name>``
(``Config.table_path``), whichever engine reads it (``core.storage.spark_path`` turns
``s3://`` into ``s3a://`` for Spark outside Databricks). ``lakecdc sql`` and the notebooks
know the queryable ones by the view name ``<layer>_<name>``.
"""

from __future__ import annotations

Table = tuple[str, str]

BRONZE: Table = ("bronze", "wal2json_changes")
BACKFILL_STAGING: Table = ("bronze", "_backfill_chunks")
CAPTURE_LIST: Table = ("bronze", "_captured")        # the captured set (bronze.capture_list)
SILVER: Table = ("silver", "changes")
QUARANTINE: Table = ("silver", "quarantine")
GOLD: Table = ("gold", "service_stats")
GOLD_PENDING: Table = ("gold", "_pending")
GOLD_DELTAS: Table = ("gold", "_deltas")         # steps not folded into service_stats yet
GOLD_BASELINE: Table = ("gold", "_baseline")
QUALITY_STATE: Table = ("gold", "_quality")     # what the quality gate last passed
STREAM_CHECKPOINT: Table = ("_checkpoints", "stream")     # the stream's checkpoint
STREAM_QUERY = "lakecdc_stream"         # the stream's Spark query name (bronze → gold)
MIRRORS: Table = ("silver", "tables")           # one mirror per captured table below it
MIRROR_CHECKPOINT: Table = ("_checkpoints", "mirrors")
MIRROR_BASELINES: Table = ("silver", "_mirror_baselines")    # setup's initial rows per table
MIRROR_MARKERS: Table = ("silver", "_mirror_markers")    # verify markers the mirrors passed

QUERYABLE = (BRONZE, SILVER, QUARANTINE, GOLD)


def path(root: str, table: Table) -> str:
    return f"{root.rstrip('/')}/{table[0]}/{table[1]}"


def view_name(table: Table) -> str:
    return f"{table[0]}_{table[1]}"


def mirror_path(root: str, table: str) -> str:
    """Where the mirror of captured table ``schema.table`` lives."""
    schema, name = table.split(".", 1)
    return f"{path(root, MIRRORS)}/{schema}/{name}"


def mirror_view_name(table: str) -> str:
    """``silver_<schema>_<table>``: the mirror's name in ``lakecdc sql`` and the notebooks."""
    schema, name = table.split(".", 1)
    return f"silver_{schema}_{name}"


def mirror_baseline_path(root: str, table: str) -> str:
    """Where setup keeps captured table ``schema.table``'s initial rows."""
    schema, name = table.split(".", 1)
    return f"{path(root, MIRROR_BASELINES)}/{schema}/{name}"
