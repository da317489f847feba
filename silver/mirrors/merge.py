"""The mirrors' MERGE, written once for every engine (``silver.mirrors.store``): the app id
and versions of its app transaction, its clauses (``merge_clauses``), one job of it
(``MergeJob``), the metadata a tail's drain carries (``batch_meta``), and what the mirrors'
app transactions say of their initial rows and replays (``start_point``, ``due_replay``).
Pure: no engine here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from core.commits import commit_metadata, parse_commit_metadata
from silver.mirrors.mirror_table import (
    COMMIT_LSN,
    COMMIT_TS,
    EXISTS,
    HAS_PREFIX,
    LOAD_APP_ID,
    SEED_APP_ID,
    mirrored_columns,
)

APP_ID = "lakecdc-mirror"
PARTS = 1_000_000       # txn version = batch id * PARTS + the part of the batch (chain_cuts)
# Commits searched for the metadata of a tail's newest batch, which its drain carries into
# the table (``batch_meta``; ``pipelines.verify.mirror_check`` reads it); no decision reads it.
HISTORY = 100


def txn_app_id(epoch: str | None) -> str:
    """The app id of the mirrors' writes in ``epoch``: the id of the query (its checkpoint)
    whose batch ids their versions count (None: an app id without one, for a caller with no
    query)."""
    return APP_ID if epoch is None else f"{APP_ID}@{epoch}"


def q(name: str) -> str:
    """A column name quoted for a Spark SQL expression."""
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class MergeClauses:
    """A mirror's MERGE of ``merge_source``'s rows (``s``) into the mirror (``t``): a key
    whose final row does not exist is deleted; one that exists is updated, each non-key
    column from the source where the batch carried it (else kept: a TOASTed value an
    UPDATE left out), or inserted. A TRUNCATE's part also deletes every row the source
    does not name (``truncate`` of the engines' ``merge``)."""

    on: str
    delete_when: str
    update: dict[str, str]
    insert: dict[str, str]
    exists: str


def merge_clauses(key: tuple[str, ...], types: dict[str, str]) -> MergeClauses:
    """The MERGE's conditions and column expressions, for either engine. Pure."""
    meta = {COMMIT_LSN: f"s.{COMMIT_LSN}", COMMIT_TS: f"s.{COMMIT_TS}"}
    update = {q(n): f"CASE WHEN s.{q(f'{HAS_PREFIX}{i}')} THEN s.{q(n)} ELSE t.{q(n)} END"
              for i, n in enumerate(mirrored_columns(key, types))}
    return MergeClauses(on=" AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key),
                        delete_when=f"NOT s.{EXISTS}", update={**update, **meta},
                        insert={**{q(n): f"s.{q(n)}" for n in types}, **meta},
                        exists=f"s.{EXISTS}")


@dataclass(frozen=True)
class MergeJob:
    """One MERGE of a part of a batch: ``source()`` types its rows (called only when the
    MERGE is not recorded yet)."""

    path: str
    version: int                    # its app transaction's
    meta: str                       # lakecdc's commit metadata
    source: Callable[[], pa.Table]
    key: tuple[str, ...]
    types: dict[str, str]
    truncate: bool = False
    # Neither a TRUNCATE, nor a key moved (whose source reads the mirror's table), nor the
    # changes held while the table loaded (recorded beside the table's own MERGE,
    # ``mark_replayed``): such a part may go to the tail (``silver.mirrors.tail``).
    plain: bool = False
    app: str = APP_ID               # its app transaction's id: the query's (``txn_app_id``)


def batch_meta(metadata: list[str | None], version: int) -> str:
    """Of a tail's commits' metadata, that of the batch part of app transaction version
    ``version``: its drain carries it into the mirror's table."""
    for text in metadata:
        meta = parse_commit_metadata(text, "mirror")
        if meta is not None and "batch_id" in meta \
                and int(meta["batch_id"]) * PARTS + int(meta.get("part") or 0) == version:
            return text
    return commit_metadata("mirror")


def due_replay(loaded: int | None, replayed: int | None) -> int | None:
    """From a mirror's app transactions: the floor of its newest complete load
    (``pipelines.setup.mirror_loader``, ``LOAD_APP_ID``) while the changes held back during
    that load are not applied yet, i.e. no ``REPLAYED_APP_ID`` at that floor
    (``mark_replayed``); else None. A later load has a later floor. Pure."""
    if loaded is None or (replayed is not None and replayed >= loaded):
        return None
    return loaded


def start_point(transaction_version: Callable[[str], int | None]) -> int | None:
    """The point of a mirror's initial rows, from its app transactions
    (``transaction_version(app id)``): the newer of a baseline's seed (``SEED_APP_ID``) and
    a complete load (``LOAD_APP_ID``); None: it started empty. Its changes below it are in
    those rows."""
    points = [transaction_version(SEED_APP_ID), transaction_version(LOAD_APP_ID)]
    return max((p for p in points if p is not None), default=None)
