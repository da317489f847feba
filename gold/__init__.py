"""Gold: silver change rows → ``gold/service_stats`` counts → the dashboard's Postgres.

- ``gold.deltas``: pure transforms, silver rows → signed deltas per key (DESIGN §2);
- ``gold.apply``: the foreachBatch body - complete transactions only, idempotent MERGE;
- ``gold.stream``: the streaming job (``lakecdc gold``), with its start-up refusals;
- ``gold.push``: gold's change data feed → Postgres ``service_stats`` (``lakecdc push``),
  JVM-free (delta-rs + psycopg).

This module holds only the commit-metadata convention (plain JSON), so ``gold.push``
runs without importing Spark.
"""

from __future__ import annotations

import json

# Gold's commit metadata (Delta ``commitInfo.userMetadata``), written by ``gold.apply`` on
# every MERGE / ``_pending`` write / seed and read by the push and by status: the batch id
# and the watermark (``commit_lsn``, ``commit_ts``: the newest source commit included).
META_KIND = "lakecdc"


def commit_metadata(**values) -> str:
    """The ``userMetadata`` text of a gold commit."""
    return json.dumps({META_KIND: "gold", **values}, sort_keys=True, default=str)


def parse_commit_metadata(text: str | None) -> dict | None:
    """lakecdc's metadata of a gold commit, or None for any other commit (OPTIMIZE, ...)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get(META_KIND) == "gold" else None
