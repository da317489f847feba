"""Gold at one version, as the push reads it: with delta-rs (the default, no JVM) or with
Spark (``LAKECDC_WRITER=spark``: where only Spark reaches storage).

The push (``gold.push.push_table``) needs, of gold at one pinned version ``V``: ``V``, the
table's id (a new table means a full push), its watermark (``position``), the keys its
change data feed names between two versions (``changes``) and every row (``rows``). Each
engine reads them here, and nowhere else; what they read is turned into rows by the same
pure functions (``latest_changes``, ``position_of``), so both push the same thing.

A feed that cannot be read (its commits past the log's retention, its files vacuumed) is
``FeedUnreadable`` on either engine: the push then pushes every row, as exactly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

import pyarrow as pa

from core.captured import DIMS
from core.commits import Commit, read_commits, read_commits_rs
from core.errors import UserError
from core.storage import gold_key, is_remote

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


def _as_rows(table: pa.Table) -> list[tuple]:
    return [tuple(r[c] for c in COLUMNS) for r in table.select(list(COLUMNS)).to_pylist()]


def _missing(gold_path: str, version: int | None) -> UserError:
    at = "" if version is None else f" (version {version})"
    return UserError(f"there is no gold table at {gold_path}{at}: run `lakecdc stream` first.")


def open_gold(gold_path: str, storage_options: dict | None = None,
              version: int | None = None):
    """delta-rs's handle on gold (at ``version``: None, the newest)."""
    from deltalake.exceptions import TableNotFoundError

    from core.features import open_table

    uri = gold_path if is_remote(gold_path) else gold_key(gold_path)
    try:
        return open_table(uri, storage_options, version=version)
    except TableNotFoundError:
        raise _missing(gold_path, version) from None


class RsGold:
    """Gold through delta-rs."""

    def __init__(self, table, storage_options: dict | None = None) -> None:
        self.table = table
        self.storage_options = storage_options
        self.version = table.version()

    @property
    def table_id(self) -> str:
        return self.table.metadata().id

    def position(self, version: int | None = None) -> tuple[int | None, datetime | None]:
        return position_of(read_commits_rs(self.table.table_uri, self.storage_options,
                                           limit=HISTORY, up_to=version if version is not None
                                           else self.version))

    def changes(self, start: int, end: int) -> tuple[list[tuple], list[tuple]]:
        from deltalake.exceptions import DeltaError

        try:
            feed = pa.table(self.table.load_cdf(starting_version=start, ending_version=end))
        except (DeltaError, pa.ArrowException) as exc:
            raise FeedUnreadable(str(exc)) from exc
        return latest_changes(feed)

    def rows(self) -> list[tuple]:
        return _as_rows(pa.table(self.table.to_pyarrow_table(columns=list(COLUMNS))))


class SparkGold:
    """Gold through Spark: the feed (``readChangeFeed``), a version's rows
    (``versionAsOf``), the id (``DESCRIBE DETAIL``) and the history (``read_commits``), no
    JVM handle (Databricks renames Delta's classes)."""

    def __init__(self, spark, path: str, version: int | None = None) -> None:
        from delta.tables import DeltaTable

        self.spark, self.path = spark, path
        if not DeltaTable.isDeltaTable(spark, path):
            raise _missing(path, version)
        self.version = version if version is not None else int(
            DeltaTable.forPath(spark, path).history(1).first()["version"])

    @property
    def table_id(self) -> str:
        return self.spark.sql(f"DESCRIBE DETAIL delta.`{self.path}`").first()["id"]

    def position(self, version: int | None = None) -> tuple[int | None, datetime | None]:
        return position_of(read_commits(self.spark, self.path, limit=HISTORY,
                                        up_to=version if version is not None
                                        else self.version))

    def changes(self, start: int, end: int) -> tuple[list[tuple], list[tuple]]:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        try:
            feed = (self.spark.read.format("delta").option("readChangeFeed", "true")
                    .option("startingVersion", start).option("endingVersion", end)
                    .load(self.path).toArrow())
        except (PySparkException, Py4JError) as exc:
            raise FeedUnreadable(str(exc).splitlines()[0] if str(exc) else "") from exc
        return latest_changes(feed)

    def rows(self) -> list[tuple]:
        return _as_rows(self.spark.read.format("delta").option("versionAsOf", self.version)
                        .load(self.path).select(*COLUMNS).toArrow())


def gold_view(gold_path: str, storage_options: dict | None = None,
              version: int | None = None, spark=None) -> GoldView:
    """Gold at ``version`` (None: the newest) for one push: through Spark when a session is
    given (every read through Spark), else delta-rs."""
    if spark is not None:
        return SparkGold(spark, gold_path, version)
    return RsGold(open_gold(gold_path, storage_options, version), storage_options)
