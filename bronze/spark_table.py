"""Bronze's table through Spark's Delta (``LAKECDC_WRITER=spark``): the same interface as
``bronze.table.BronzeTable``, for workspaces where only Spark holds the storage credentials
(Unity Catalog external locations), so ``bronze.ship``'s delivery rule is unchanged.
``bronze_table`` chooses between the two, by the process's engine (``core.engine``).

**Progress.** delta-rs records several Delta app transactions per commit (``<slot>``,
``<slot>:end_lsn``, ``<slot>:rebaseline``, ``<slot>:captured``, ``lakecdc-backfill:<run>``);
Spark records one, and Spark offers no public reader of app transactions. So each commit
carries:

- ONE app transaction, ``<slot>:end_lsn`` = the commit's ``end_lsn`` (the same meaning as on
  the delta-rs path). Every bronze commit moves ``end_lsn`` forward (a data commit holds
  transactions past it, a progress-only commit is made only when it grows, a re-baseline
  only past it), so Spark's rule "skip a write whose version is recorded" skips exactly a
  replay of a commit bronze already holds;
- the WHOLE progress map as lakecdc metadata of layer ``bronze`` (``core.commits``) in
  ``commitInfo.userMetadata``: ``commit_lsn``, ``end_lsn``, and every app version ever
  recorded (``apps``: each commit copies the previous map and adds its own), so the newest
  such commit alone answers ``progress``, ``app_version`` and ``rebaselined_at``.

Exactly once: the shipper advances the slot only after ``commit`` returned, to the
``end_lsn`` it committed. Killed between the two, the restart reads the newest bronze commit's
map, drops the re-delivered transactions (``commit_lsn <=`` the map's) and completes the
advance. Should a replay still reach ``commit`` (a second writer despite the shipper lock),
Spark skips it by the app transaction: the rows are in bronze under the earlier commit with
that same ``end_lsn``, so advancing to it stays safe. The shipper's ``version_check`` guard
switched off (negative controls only) drops the app transaction too: then nothing stops a
replay, and a test can see the duplicate (and Spark does not record a progress-only commit
without one: ``skipRecordingEmptyCommits``).

**Rows.** One commit's rows are collected as Arrow (spilled to local disk past the shipper's
``--memory-budget-mb``, ``bronze.buffer``) and handed to Spark at the commit, in one Delta
append: unlike the delta-rs path, which streams Parquet to storage, Spark mode holds one
commit's rows in the driver (the JVM's, and this process's while it hands them over). A peek
is bounded by ``--max-changes`` except for one huge source transaction, which must be one
commit either way.

The source identity is the table's description, as on the delta-rs path, read with
``DESCRIBE DETAIL``.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa

from bronze.buffer import SpillBuffer
from bronze.records import BRONZE_SCHEMA
from bronze.table import (
    END_SUFFIX,
    REBASELINE_SUFFIX,
    TABLE_CONFIG,
    WRITER_KEPT,
    BronzeTable,
    Progress,
    SourceIdentity,
    _describe,
    _parse_description,
)
from core.commits import commit_metadata, newest
from core.engine.api import Engine
from core.engine.delta_rs import DeltaRs
from core.engine.spark_delta import SparkDelta
from core.errors import UserError
from core.lsn import fmt
from core.storage import on_databricks, spark_path
from core.switches import Switches

log = logging.getLogger("lakecdc.ship")

LAYER = "bronze"
# Found in every bronze progress commit's metadata text (``commit_metadata`` sorts its keys).
_MENTION = '"lakecdc": "bronze"'
# Commits read back per look: the newest progress commit is among the last few (OPTIMIZE
# and other maintenance commits carry none); the whole history only if not.
_RECENT = 50
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def bronze_table(config, storage_options: dict | None = None, *, engine: Engine,
                 switches: Switches | None = None):
    """Bronze's table through ``engine``. The one place that chooses by the engine's kind:
    on delta-rs, bronze is written by ``BronzeTable``, whose commits add Parquet files it
    wrote as the peek streamed (memory stays bounded by a chunk, not a transaction) and
    record its progress as several app transactions, which no engine's ``append`` does
    (``storage_options``: None, the engine's; ``switches``: None, the configuration's)."""
    if isinstance(engine, DeltaRs):
        return BronzeTable(config.bronze_path, storage_options if storage_options is not None
                           else engine.storage_options)
    return SparkBronzeTable(config.bronze_path, engine,
                            skip_replays=(switches or Switches.from_config(config))
                            .on("version_check"),
                            budget_bytes=config.memory_budget_mb << 20,
                            spill_dir=config.spill_dir)


class SparkBronzeTable:
    """``BronzeTable`` through Spark (see the module's text): reads and commits through
    ``engine``; what only Spark does (a commit's metadata set in the session, the table's
    description) through its session."""

    def __init__(self, uri: str, engine: SparkDelta, skip_replays: bool = True,
                 budget_bytes: int = 64 << 20, spill_dir: str | None = None) -> None:
        self.uri = uri
        self.path = spark_path(uri, on_databricks())      # as Spark SQL names the table
        self.engine = engine
        self.skip_replays = skip_replays
        self.budget_bytes = budget_bytes
        self.spill_dir = spill_dir
        self._state: dict | None = None     # the newest progress map read or committed

    @property
    def _spark(self):
        return self.engine.spark

    def exists(self) -> bool:
        return self.engine.exists(self.uri)

    def create(self, ident: SourceIdentity, end_lsn: int,
               app_versions: dict[str, int] | None = None) -> None:
        """Create the empty table (``TABLE_CONFIG``, the identity as its description) in one
        commit whose metadata records the slot's starting point, as delta-rs's create does:
        no table ever exists without its progress. (The metadata goes in as the session's
        setting, the way ``SparkDelta.merge`` passes it: a create takes no write options.)"""
        state = progress_map(ident.slot, Progress(0, end_lsn), {}, app_versions)
        meta = commit_metadata(LAYER, **state, info={"lakecdc.operation": "setup"})
        self._spark.conf.set(USER_METADATA, meta)
        try:
            self.engine.create(self.uri, BRONZE_SCHEMA, TABLE_CONFIG, comment=_describe(ident))
        finally:
            self._spark.conf.unset(USER_METADATA)
        self._state = {"lakecdc": LAYER, **state}

    def identity(self) -> SourceIdentity:
        from delta.tables import DeltaTable

        detail = DeltaTable.forPath(self._spark, self.path).detail().first()
        return _parse_description(detail["description"])

    def set_source(self, system_identifier: str, timeline: int) -> None:
        """After a re-baseline onto another cluster or timeline (failover, restore)."""
        ident = self.identity()
        if (ident.system_identifier, ident.timeline) != (system_identifier, timeline):
            text = _describe(SourceIdentity(ident.slot, ident.database, system_identifier,
                                            timeline)).replace("\\", "\\\\").replace("'", "\\'")
            self._spark.sql(f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES "
                            f"('comment' = '{text}')")

    def _read_state(self) -> dict | None:
        """The newest progress map (None: no table). A table without one was set up by the
        delta-rs path, whose progress Spark cannot read: refused with one sentence."""
        for limit in (_RECENT, None):
            commits = self.engine.commits(self.uri, LAYER, limit=limit, mentioning=_MENTION)
            state = newest(commits)
            if state is not None or limit is None or len(commits) < _RECENT:
                break
        if state is None and self.exists():
            raise UserError(WRITER_KEPT.format(path=self.uri, was="delta-rs"))
        self._state = state
        return state

    def progress(self, slot: str) -> Progress | None:
        state = self._read_state()
        if state is None or state.get("slot") != slot:
            return None
        return Progress(int(state["commit_lsn"]), int(state["end_lsn"]))

    def app_version(self, app_id: str) -> int | None:
        """The version recorded for an app id (None: never recorded)."""
        state = self._read_state()
        value = (state or {}).get("apps", {}).get(app_id)
        return None if value is None else int(value)

    def rebaselined_at(self, slot: str) -> int | None:
        return self.app_version(slot + REBASELINE_SUFFIX)

    def version(self) -> int:
        return self.engine.version(self.uri)

    def rows_where(self, where: str, columns: list[str]) -> pa.Table:
        """``columns`` of the rows meeting the SQL condition ``where``."""
        return self.engine.read(self.uri, columns, where)

    @contextmanager
    def data_files(self) -> Iterator["SparkRows"]:
        """The next commit's rows (``commit``); dropped if the block fails."""
        rows = SparkRows(SpillBuffer(BRONZE_SCHEMA, self.budget_bytes, self.spill_dir))
        try:
            yield rows
        finally:
            rows.close()

    def commit(self, files: "SparkRows | None", slot: str, progress: Progress,
               metadata: dict | None = None, app_versions: dict[str, int] | None = None
               ) -> None:
        """One Delta commit: the rows of ``files`` (none: progress only), the new progress
        map and its app transaction. Nothing is visible to readers before it."""
        self._commit(files, slot, progress, metadata, app_versions)

    def append(self, batches: Iterator[pa.RecordBatch], slot: str, progress: Progress,
               metadata: dict | None = None, app_versions: dict[str, int] | None = None
               ) -> None:
        with self.data_files() as files:
            for batch in batches:
                files.write(batch)
            self.commit(files, slot, progress, metadata, app_versions)

    def record_progress(self, slot: str, progress: Progress, metadata: dict | None = None,
                        app_versions: dict[str, int] | None = None):
        self.commit(None, slot, progress, metadata, app_versions)

    def _commit(self, files: "SparkRows | None", slot: str, progress: Progress,
                metadata: dict | None, app_versions: dict[str, int] | None) -> bool:
        previous = (self._state or self._read_state() or {}).get("apps", {})
        state = progress_map(slot, progress, previous, app_versions)
        meta = commit_metadata(LAYER, **state,
                               info={k: str(v) for k, v in (metadata or {}).items()})
        rows = files.table() if files is not None else BRONZE_SCHEMA.empty_table()
        app = (slot + END_SUFFIX, progress.end_lsn) if self.skip_replays else None
        written = self.engine.append(self.uri, rows, meta=meta, app=app)
        if not written:
            log.warning("bronze already records end_lsn %s for slot %s: Spark skipped this "
                        "replay of a commit it holds", fmt(progress.end_lsn), slot)
        self._state = {"lakecdc": LAYER, **state}
        return written


def progress_map(slot: str, progress: Progress, previous: dict[str, int],
                 app_versions: dict[str, int] | None) -> dict:
    """What one commit's metadata records: the progress and every app version so far (the
    previous commit's, updated with this one's), the slot's own included as the delta-rs
    path names them."""
    apps = {**previous, **(app_versions or {}),
            slot: progress.commit_lsn, slot + END_SUFFIX: progress.end_lsn}
    return {"slot": slot, "commit_lsn": progress.commit_lsn, "end_lsn": progress.end_lsn,
            "apps": dict(sorted(apps.items()))}


class SparkRows:
    """One commit's rows on their way to Spark: ``bronze.table.DataFiles``'s interface."""

    def __init__(self, buffer: SpillBuffer) -> None:
        self._buffer = buffer

    def write(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)

    def read(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        for batch in self._buffer.batches():
            yield batch.select(columns)

    def table(self) -> pa.Table:
        return pa.Table.from_batches(list(self._buffer.batches()), BRONZE_SCHEMA)

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        self._buffer.close()

