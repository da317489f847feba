"""Gold at one version read through Spark (``LAKECDC_WRITER=spark``: where only Spark
reaches storage), for the push (``gold.view``)."""

from __future__ import annotations

from datetime import datetime

from core.engine.spark_delta import read_commits
from gold.feed import (
    COLUMNS,
    HISTORY,
    FeedUnreadable,
    as_rows,
    latest_changes,
    missing,
    position_of,
)


class SparkGold:
    """Gold through Spark: the feed (``readChangeFeed``), a version's rows
    (``versionAsOf``), the id (``DESCRIBE DETAIL``) and the history (``read_commits``), no
    JVM handle (Databricks renames Delta's classes)."""

    def __init__(self, spark, path: str, version: int | None = None) -> None:
        from delta.tables import DeltaTable

        self.spark, self.path = spark, path
        if not DeltaTable.isDeltaTable(spark, path):
            raise missing(path, version)
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
        return as_rows(self.spark.read.format("delta").option("versionAsOf", self.version)
                        .load(self.path).select(*COLUMNS).toArrow())


def spark_errors() -> tuple[type[BaseException], ...]:
    """A gold read through Spark that failed (retried like delta-rs's ``DeltaError``)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return (PySparkException, Py4JError)
