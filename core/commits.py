"""What lakecdc's Delta commits record, and the one place that reads it back.

- **Metadata** (``commitInfo.userMetadata``): one JSON convention for every table the
  stream writes. Silver's appends record the stream's batch id; gold's MERGE, ``_pending``
  writes, seed and rebuild record the batch id and the *watermark* (``commit_lsn``,
  ``commit_ts``: the newest source commit gold includes) and, for seeds and rebuilds, the
  *floor* (see ``gold.asof``). It lives in the commit files, which log cleanup deletes, so
  it describes (status, ``verify``'s report, time travel) and the stream never recognises a
  replay by it. Each engine reads a table's history (``core.engine.api.Engine.commits``).
- **App transactions** (``(app id, version)``, Delta's ``txn`` action): table state, like
  the schema, so every checkpoint carries them and a cleaned log still has them. Whether a
  table holds a batch, a step or a baseline already - what a replay is recognised by - is
  read from them (``Engine.recorded``), never from the history: a stream stopped longer
  than the log retention, then maintained, finds no commit of its own left there (F30).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

META_KIND = "lakecdc"
# The most reads of a delta-rs history while commits land meanwhile
# (``core.engine.delta_rs.rs_history``).
HISTORY_READS = 20


@dataclass(frozen=True)
class Recorded:
    """A Delta table's newest version and the version it records for each app id, read
    from one snapshot of it (``recorded``)."""

    version: int
    _lookup: Callable[[str], int | None] = field(repr=False)

    def version_of(self, app_id: str) -> int | None:
        """The version the table records for ``app_id`` (None: none)."""
        return self._lookup(app_id)


@dataclass(frozen=True)
class Commit:
    version: int
    meta: dict | None            # lakecdc's metadata; None for any other commit (OPTIMIZE, ...)


def commit_metadata(layer: str = "gold", **values) -> str:
    """The ``userMetadata`` text of a commit of ``layer``'s tables."""
    return json.dumps({META_KIND: layer, **values}, sort_keys=True, default=str)


def parse_commit_metadata(text: str | None, layer: str = "gold") -> dict | None:
    """lakecdc's metadata of a commit of ``layer``, or None for any other commit."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get(META_KIND) == layer else None


def floor_of(meta: dict) -> int | None:
    """The floor a gold commit's metadata records, if any."""
    return int(meta["floor"]) if meta.get("floor") is not None else None


def newest(commits: list[Commit]) -> dict | None:
    """The newest lakecdc metadata among ``commits`` (newest first), or None."""
    return next((c.meta for c in commits if c.meta is not None), None)
