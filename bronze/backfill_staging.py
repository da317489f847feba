"""The snapshot backfill's staging table, ``<lakehouse>/bronze/_backfill_chunks``: chunks
read from the source wait there, with their windows and the run's markers, until the
shipper appends them to bronze (``bronze.snapshot_backfill`` documents the protocol)."""


from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import pyarrow as pa

from bronze.backfill_marks import key_columns_of, key_columns_text
from bronze.records import UTC_US
from core.commits import commit_metadata
from core.config import LOG_RETENTION_MINUTES, Config
from core.engine.api import Engine
from core.handle import CHECKPOINTS
from core.layout import BACKFILL_STAGING
from core.maintenance import TableReport

log = logging.getLogger("lakecdc.backfill")


APP_PREFIX = "lakecdc-backfill:"
LAYER = "backfill"             # its commits' metadata (``core.commits``)

# Staging rows by kind (the table is partitioned by it, so markers are read without data).
ROW, CHUNK, TABLE_DONE, RUN_DONE = "row", "chunk", "table_done", "run_done"

STAGING_SCHEMA = pa.schema([
    pa.field("kind", pa.string(), nullable=False),
    pa.field("run", pa.string(), nullable=False),
    pa.field("tables", pa.string(), nullable=False),     # the run's tables, comma-joined
    pa.field("table_name", pa.string()),                 # schema.table
    pa.field("chunk", pa.int64()),                       # 1, 2, ... across the run
    pa.field("seq", pa.int32()),                         # row: position in the chunk
    pa.field("key", pa.string()),                        # row: the key (key_text)
    pa.field("key_column", pa.string()),                 # chunk: key_columns_text
    pa.field("first_key", pa.string()),                  # chunk: key range = the cursor
    pa.field("last_key", pa.string()),
    pa.field("low_lsn", pa.int64()),                     # chunk: LSN of the LOW watermark
    pa.field("in_progress", pa.list_(pa.int64())),       # chunk: xids running at its snapshot
    pa.field("rows", pa.int64()),                        # chunk: rows; run_done: all rows
    pa.field("staged_at", UTC_US, nullable=False),
    pa.field("data", pa.string()),                       # row: wal2json-v2-shaped JSON
])
_STAGING_CONFIG = {
    **CHECKPOINTS,
    "delta.dataSkippingNumIndexedCols": str(len(STAGING_SCHEMA) - 1),   # no stats on data
}


def staging_path(config: Config) -> str:
    return config.table_path(BACKFILL_STAGING)


def staging_table(config: Config, *, engine: Engine) -> "StagingTable":
    """The staging table of ``config``'s lakehouse, through ``engine``."""
    return StagingTable(staging_path(config), engine=engine)


def app_id(run: str) -> str:
    """The bronze app transaction recording the highest chunk of ``run`` in bronze."""
    return APP_PREFIX + run


@dataclass(frozen=True)
class ChunkInfo:
    run: str
    chunk: int
    table: str
    key_columns: tuple[str, ...]
    first_key: str
    last_key: str
    low_lsn: int
    in_progress: tuple[int, ...]
    rows: int


@dataclass
class RunState:
    run: str
    tables: tuple[str, ...]
    started_at: int                                   # microseconds, first staged row
    chunks: dict[int, ChunkInfo] = field(default_factory=dict)
    done_tables: set[str] = field(default_factory=set)
    complete: bool = False
    total_rows: int = 0                               # from the run_done marker

    def table_chunks(self, table: str) -> list[ChunkInfo]:
        return [c for _, c in sorted(self.chunks.items()) if c.table == table]


class StagingTable:
    """``bronze/_backfill_chunks``: staged chunk rows and the markers that make a run
    resumable. Written by the backfill only, read by the shipper for HIGH watermarks.

    Every read and write goes through ``engine`` (``core.engine``). Each commit carries
    lakecdc's metadata of layer ``backfill`` (``_meta``)."""

    def __init__(self, uri: str, *, engine: Engine) -> None:
        self.uri = uri
        self.engine = engine

    def exists(self) -> bool:
        return self.engine.exists(self.uri)

    def ensure(self) -> None:
        if self.exists():
            return
        self.engine.create(self.uri, STAGING_SCHEMA, _STAGING_CONFIG,
                           comment="lakecdc snapshot backfill: staged chunks, emitted into "
                                   "bronze by the shipper at their HIGH watermark",
                           partitioned_by=("kind",))

    def _select(self, where: str, columns: list[str]) -> pa.Table:
        """``columns`` of the rows meeting the SQL condition ``where`` (in both engines'
        SQL: Spark's and DataFusion's; delta-rs prunes files by partition and statistics)."""
        return self.engine.read(self.uri, columns, where)

    def runs(self) -> dict[str, RunState]:
        markers = self._select(f"kind <> '{ROW}'",
                               [f.name for f in STAGING_SCHEMA
                                if f.name not in ("data", "key", "seq")])
        runs: dict[str, RunState] = {}
        for m in markers.to_pylist():
            stamp = int(m["staged_at"].timestamp() * 1e6)
            state = runs.setdefault(m["run"], RunState(m["run"], tuple(m["tables"].split(",")),
                                                       stamp))
            state.started_at = min(state.started_at, stamp)
            if m["kind"] == CHUNK:
                state.chunks[m["chunk"]] = _chunk_info(m)
            elif m["kind"] == TABLE_DONE:
                state.done_tables.add(m["table_name"])
            elif m["kind"] == RUN_DONE:
                state.complete = True
                state.total_rows = m["rows"] or 0
        return runs

    def run_ids(self) -> set[str]:
        """The runs staging holds (none if there is no staging table)."""
        return set(self.runs()) if self.exists() else set()

    def chunk(self, run: str, chunk: int) -> ChunkInfo | None:
        if not self.exists():
            return None
        _check_run_id(run)
        rows = self._select(
            f"kind = '{CHUNK}' AND run = '{run}' AND chunk = {int(chunk)}",
            [f.name for f in STAGING_SCHEMA]).to_pylist()
        return _chunk_info(rows[0]) if rows else None

    def chunk_rows(self, run: str, chunk: int) -> pa.Table:
        """``seq``, ``key``, ``data`` of a staged chunk, in key order."""
        _check_run_id(run)
        return self._select(
            f"kind = '{ROW}' AND run = '{run}' AND chunk = {int(chunk)}",
            ["seq", "key", "data"]).sort_by("seq")

    def stage_chunk(self, info: ChunkInfo, tables: str, keys: list[str],
                    data: list[str]) -> None:
        """The chunk's rows and its marker, in one commit."""
        n = len(keys)
        now = _now_us()
        row = {"kind": [ROW] * n, "run": [info.run] * n, "tables": [tables] * n,
               "table_name": [info.table] * n, "chunk": [info.chunk] * n,
               "seq": list(range(n)), "key": keys, "staged_at": [now] * n, "data": data}
        marker = {"kind": [CHUNK], "run": [info.run], "tables": [tables],
                  "table_name": [info.table], "chunk": [info.chunk],
                  "key_column": [key_columns_text(info.key_columns)],
                  "first_key": [info.first_key],
                  "last_key": [info.last_key], "low_lsn": [info.low_lsn],
                  "in_progress": [list(info.in_progress)], "rows": [info.rows],
                  "staged_at": [now]}
        self._append([row, marker], {"lakecdc.operation": "backfill-chunk",
                                     "lakecdc.run": info.run, "lakecdc.chunk": info.chunk,
                                     "lakecdc.rows": n})

    def mark(self, kind: str, run: str, tables: str, table: str | None = None,
             rows: int | None = None, chunk: int | None = None) -> None:
        self._append([{"kind": [kind], "run": [run], "tables": [tables], "table_name": [table],
                       "rows": [rows], "chunk": [chunk], "staged_at": [_now_us()]}],
                     {"lakecdc.operation": f"backfill-{kind}", "lakecdc.run": run})

    def drop_rows(self, run: str) -> None:
        """Delete a completed run's staged rows (bronze holds them now); markers stay. The
        files go with VACUUM."""
        _check_run_id(run)
        self.engine.delete(self.uri, f"kind = '{ROW}' AND run = '{run}'", meta=_meta(
            {"lakecdc.operation": "backfill-drop-rows", "lakecdc.run": run}))

    def maintain(self, retention_hours: int) -> TableReport:
        """Keep the table small (``core.maintenance``): its only writer is a run, which
        calls this after its last write."""
        return self.engine.maintain("backfill staging", self.uri,
                                    retention_hours=retention_hours,
                                    log_retention_minutes=LOG_RETENTION_MINUTES)

    def _append(self, parts: list[dict], metadata: dict) -> None:
        tables = []
        for part in parts:
            n = len(part["kind"])
            cols = {f.name: part.get(f.name, [None] * n) for f in STAGING_SCHEMA}
            cols["staged_at"] = pa.array(cols["staged_at"], pa.int64()).cast(UTC_US)
            tables.append(pa.table(cols, schema=STAGING_SCHEMA))
        self.engine.append(self.uri, pa.concat_tables(tables), meta=_meta(metadata))


def _meta(metadata: dict) -> str:
    """A commit's lakecdc metadata (``userMetadata``) of layer ``backfill``."""
    return commit_metadata(LAYER, info={k: str(v) for k, v in metadata.items()})


def _chunk_info(m: dict) -> ChunkInfo:
    return ChunkInfo(m["run"], int(m["chunk"]), m["table_name"],
                     key_columns_of(m["key_column"]),
                     m["first_key"], m["last_key"], int(m["low_lsn"]),
                     tuple(m["in_progress"] or ()), int(m["rows"]))


def _now_us() -> int:
    return int(time.time() * 1e6)


def _check_run_id(run: str) -> None:
    if not run.replace("-", "").isalnum():
        raise ValueError(f"bad backfill run id {run!r}")
