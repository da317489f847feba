"""lakecdc's Delta commit metadata (``commitInfo.userMetadata``): one JSON convention for
every table the stream writes, and the one way to read it back.

Silver's appends record the stream's batch id; gold's MERGE, ``_pending`` writes, seed and
rebuild record the batch id and the *watermark* (``commit_lsn``, ``commit_ts``: the newest
source commit gold includes) - see ``gold.apply``. ``commit_metadata`` /
``parse_commit_metadata`` are plain JSON, so the push and ``status`` read them without Spark.
"""

from __future__ import annotations

import json

META_KIND = "lakecdc"


def commit_metadata(layer: str = "gold", **values) -> str:
    """The ``userMetadata`` text of a commit of ``layer``'s tables."""
    return json.dumps({META_KIND: layer, **values}, sort_keys=True, default=str)


def parse_commit_metadata(text: str | None, layer: str = "gold") -> dict | None:
    """lakecdc's metadata of a commit of ``layer``, or None for any other commit (OPTIMIZE,
    ...)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get(META_KIND) == layer else None


def last_metadata(spark, path: str, layer: str = "gold", limit: int | None = 100) -> dict | None:
    """The newest lakecdc metadata of ``layer`` in the latest ``limit`` commits of the Delta
    table at ``path`` (all of them if None); None if there is none or no table."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    history = DeltaTable.forPath(spark, path).history(limit).select("userMetadata")
    for row in history.where(F.col("userMetadata").isNotNull()).collect():
        found = parse_commit_metadata(row.userMetadata, layer)
        if found is not None:
            return found
    return None
