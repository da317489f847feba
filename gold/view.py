"""Gold at one version, as the push reads it: with delta-rs (the default, no JVM: here) or
with Spark (``LAKECDC_WRITER=spark``: where only Spark reaches storage, ``gold.view_spark``).

The push (``gold.push.push_table``) needs, of gold at one pinned version ``V``: ``V``, the
table's id (a new table means a full push), its watermark (``position``), the keys its
change data feed names between two versions (``changes``) and every row (``rows``). Each
engine reads them here or in ``gold.view_spark``, and nowhere else; what they read is
turned into rows by the same pure functions (``gold.feed``), so both push the same thing.

A feed that cannot be read (its commits past the log's retention, its files vacuumed) is
``FeedUnreadable`` on either engine: the push then pushes every row, as exactly.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from core.engine.delta_rs import DeltaRs, read_commits_rs
from core.storage import gold_key, is_remote
from gold.feed import (
    COLUMNS,
    HISTORY,
    FeedUnreadable,
    GoldView,
    as_rows,
    latest_changes,
    missing,
    position_of,
)
from gold.view_spark import SparkGold, spark_errors


def open_gold(gold_path: str, storage_options: dict | None = None,
              version: int | None = None):
    """delta-rs's handle on gold (at ``version``: None, the newest)."""
    from deltalake.exceptions import TableNotFoundError

    from core.features import open_table

    uri = gold_path if is_remote(gold_path) else gold_key(gold_path)
    try:
        return open_table(uri, storage_options, version=version)
    except TableNotFoundError:
        raise missing(gold_path, version) from None


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
        return as_rows(pa.table(self.table.to_pyarrow_table(columns=list(COLUMNS))))


def gold_view(gold_path: str, storage_options: dict | None = None,
              version: int | None = None, engine=None) -> GoldView:
    """Gold at ``version`` (None: the newest) for one push, read by ``engine`` (None:
    delta-rs with ``storage_options``, else the engine's own)."""
    spark = _spark_of(engine)
    if spark is not None:
        return SparkGold(spark, gold_path, version)
    if storage_options is None and engine is not None:
        storage_options = engine.storage_options
    return RsGold(open_gold(gold_path, storage_options, version), storage_options)


def read_errors(engine=None) -> tuple[type[BaseException], ...]:
    """What a failed read of gold by ``engine`` raises, for the push to retry: delta-rs's
    ``DeltaError`` (Spark reads a local table's log with delta-rs too), and Spark's."""
    from deltalake.exceptions import DeltaError

    return (DeltaError,) if _spark_of(engine) is None else (DeltaError, *spark_errors())


def _spark_of(engine) -> object | None:
    """The session gold is read through, or None: delta-rs. The one choice by engine here:
    delta-rs reads every part of a push from one handle pinned at its version (one load of
    the log, no JVM), which the engine's reads, each opening the table, would not."""
    return None if engine is None or isinstance(engine, DeltaRs) else engine.spark
