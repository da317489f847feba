"""What gold at one version gives the push, whichever engine reads it (``gold.view``): the
view's shape (``GoldView``), and the pure functions that turn what an engine read into
rows (``latest_changes``, ``position_of``), so every engine pushes the same thing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

import pyarrow as pa

from core.captured import DIMS
from core.commits import Commit
from core.errors import UserError

COLUMNS = (*DIMS, "count", "last_commit_lsn")
_KEEP = ("insert", "update_postimage", "delete")
# How far back gold's history is read for its watermark.
HISTORY = 200


class FeedUnreadable(Exception):
    """Gold's change data feed between two versions cannot be read any more."""


class GoldView(Protocol):
    version: int

    @property
    def table_id(self) -> str: ...

    def position(self, version: int | None = None) -> tuple[int | None, datetime | None]:
        """The watermark at this view's version (or at an earlier ``version``)."""
        ...

    def changes(self, start: int, end: int) -> tuple[list[tuple], list[tuple]]: ...

    def rows(self) -> list[tuple]: ...


def position_of(commits: list[Commit]) -> tuple[int | None, datetime | None]:
    """The watermark (source commit LSN, time) of the newest of ``commits`` (newest first)
    recording one."""
    for commit in commits:
        meta = commit.meta
        if meta and meta.get("commit_lsn") is not None:
            ts = meta.get("commit_ts")
            return int(meta["commit_lsn"]), datetime.fromisoformat(ts) if ts else None
    return None, None


def latest_changes(feed: pa.Table) -> tuple[list[tuple], list[tuple]]:
    """Keys a change data feed (gold's columns, ``_change_type``, ``_commit_version``)
    names: (their newest rows, deleted keys).

    Gold rows are only inserted and updated, so the newest post-image (or insert) of a key
    is its row at the feed's end; a delete wins only when nothing newer follows (a table
    overwritten in place deletes and re-inserts within one version: the insert wins)."""
    latest: dict[tuple, tuple[tuple[int, int], dict]] = {}
    for change in feed.to_pylist():
        kind = change["_change_type"]
        if kind not in _KEEP:
            continue
        key = tuple(change[c] for c in DIMS)
        order = (change["_commit_version"], 0 if kind == "delete" else 1)
        if key not in latest or order > latest[key][0]:
            latest[key] = (order, change)
    rows, deleted = [], []
    for key, (_, change) in latest.items():
        if change["_change_type"] == "delete":
            deleted.append(key)
        else:
            rows.append((*key, change["count"], change["last_commit_lsn"]))
    return rows, deleted


def as_rows(table: pa.Table) -> list[tuple]:
    return [tuple(r[c] for c in COLUMNS) for r in table.select(list(COLUMNS)).to_pylist()]


def missing(gold_path: str, version: int | None) -> UserError:
    at = "" if version is None else f" (version {version})"
    return UserError(f"there is no gold table at {gold_path}{at}: run `lakecdc stream` first.")
