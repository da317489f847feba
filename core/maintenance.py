"""Keeping one Delta table small: compaction, a checkpoint, and vacuum (delta-rs).

``maintain_table`` is called by the process that writes the table, between two of its own
commits (``pipelines.maintain`` decides which tables and when), so no writer of lakecdc's
ever races it. Each step is idempotent and is one commit or none (the repair, two):

0. **protocol**: a ``variantType`` that delta-rs added when an older lakecdc set a property
   of this table is taken out (``core.protocol_repair``: two RESTOREs that change no row),
   or the table is refused (``core.features.readable``).
1. **compact**: files under the target size are bin-packed into files of about
   ``target_bytes`` (delta-rs ``optimize.compact``). One commit, whose removes and adds carry
   ``dataChange=false``: a streaming reader skips it and still reads each row exactly once,
   from the files it was added in.
2. **retention**: the table's log and tombstone retentions are set to ``log_retention``
   minutes, with the writers' own log cleanup off (``log_properties``; a metadata-only
   commit, once). Not through delta-rs at reader version 3 (a table with a
   ``timestamp_ntz`` column): deltalake 1.6 would add table features lakecdc cannot write
   (``core.features.properties_settable``). Such a table gets them at creation (a mirror
   and its tail: ``silver.mirrors.mirror_table.mirror_properties``); where they differ, the report
   says so and gives the Spark statement that sets them.
3. **checkpoint** at the new version, so the next snapshot load starts from few files.
4. **vacuum**: the files removed more than ``retention_hours`` ago are deleted, and so are
   files no commit references (a writer or a compaction killed before its commit, F3)
   once they are that old and at least ``UNREFERENCED_HOURS``: such a file may also be a
   writer's that has not committed yet, which a younger deletion would break. A full
   vacuum, which lists the table's folder - bounded, since compaction and vacuum keep the
   folder small. Where a streaming query reads the table
   (``reader_floor``: the newest version it has read whole), nothing is vacuumed while the
   oldest commit it has not read is older than the retention: every file it has still to
   read was added by such a commit, so it is live or was removed inside the retention. A
   stream stopped longer than that finds its files, and they go at the first maintenance
   after it caught up.
5. **log cleanup**: log entries older than ``log_retention`` and before a checkpoint are
   deleted, but never one a stream reading the table still needs: the cleanup stops at the
   newest checkpoint at or before the version it would read again on a restart
   (``log_floor + 1``: where its newest committed batch started). Last, since a snapshot
   loaded before it may read a checkpoint it deletes.
6. **checkpoints thinned** inside the retention (``thin_checkpoints``): about
   ``CHECKPOINTS_KEPT`` are kept over it, so a log kept a day does not hold a day of
   checkpoints, each carrying a day of tombstones.

Steps 2 and 5 also run alone, more often (``clean_log``: the writers do it every
``LOG_CLEAN_INTERVAL_S``), so a log holds its retention and little more.

Why lakecdc's own logs are short and the others' a day (``log_properties``): every commit
of delta-rs, and every snapshot load, lists the log; on a local disk that listing reads the
whole folder, so a commit's cost grows with the log's length (docs/operations.md, "What each
table keeps", measured by ``bench.kept_log``: delta-rs about 3 ms per 1,000 entries a commit,
Spark 25-40 ms per 1,000 a snapshot update; stores that list from an offset, such as S3, pay
for the new entries only). At
2,000 changes/s a table gets 2-4 commits a second. The tables only lakecdc reads keep 10
minutes (1,200-2,400 entries), bronze 2 (``core.config.BRONZE_LOG_RETENTION_MINUTES``:
Spark's stream lists it at every trigger); the tables others read keep what their readers
need (``core.config.READER_GROUPS``: a day by default), which a local disk pays for.
The checkpoints carry each tombstone as long as the log (a time travel reads the files).

A kill anywhere (F25) leaves the table as it was or compacted: compaction's new files are
invisible until its one log entry, so a kill before it leaves orphans that a later vacuum
deletes; the checkpoint and vacuum change no row.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError

from core.config import LOG_RETENTION_MINUTES
from core.features import open_table, properties_settable, readable
from core.protocol_repair import repair_protocol
from core.storage import WRITE_BUFFER, filesystem, on_databricks, spark_path, under
from core.switches import NONE, Switches

# Compacted files. Every file under the target is a candidate, so a run rewrites the new
# small files and at most one partly filled file besides: the target bounds the pause. At
# 64 MB, silver's one growing file was rewritten whole by every run under traffic, a pause
# of seconds each time; at 16 MB a file that is full is never read again.
TARGET_BYTES = 16 << 20
# A file no commit references is a writer's that has not committed yet (a ``tables add``
# chunk, a MERGE's rewrite, a compaction) or one killed before its commit: vacuum cannot
# tell them apart, so it deletes one only once no writer of lakecdc's could still be about
# to commit it, whatever ``LAKECDC_RETENTION_HOURS`` says (0 deletes removed files at once).
# lakecdc's writers commit within seconds to minutes of writing a file (their batches and
# chunks are bounded).
UNREFERENCED_HOURS = 1
MAINTAIN_OPERATION = "maintain"        # ``lakecdc.operation`` of a compaction's commit
MAINTENANCE_FILE = "_lakecdc_maintenance.json"     # the newest report, beside _delta_log


@dataclass
class TableReport:
    """One table's maintenance: what it held before and after, and what was done."""
    table: str
    files_before: int = 0
    files_after: int = 0
    compacted: int = 0              # files rewritten
    vacuumed: int = 0               # files deleted
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    passed_over: str | None = None  # why it was not maintained (``maintain --once``)

    def line(self) -> str:
        if self.passed_over:
            return f"{self.table}: {self.passed_over}"
        done = (f"{self.files_before} → {self.files_after} live files, {self.compacted} "
                f"compacted, {self.vacuumed} deleted, {self.seconds:.1f}s")
        return f"{self.table}: {done}" + "".join(f"; {n}" for n in self.notes)


def log_properties(log_retention_minutes: int) -> dict[str, str]:
    """The table properties maintenance keeps: the log and the tombstones it carries kept
    ``log_retention_minutes``, cleaned by maintenance only (which knows the table's stream),
    not by each writer's checkpoint."""
    interval = f"interval {log_retention_minutes} minutes"
    return {"delta.logRetentionDuration": interval,
            "delta.deletedFileRetentionDuration": interval,
            "delta.enableExpiredLogCleanup": "false"}


def alter_properties_sql(path: str, properties: dict[str, str]) -> str:
    """The Spark SQL statement that sets ``properties`` on the table at (Spark's) ``path``."""
    settings = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    return f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({settings})"


def maintain_table(name: str, uri: str, storage_options: dict | None = None, *,
                   retention_hours: int, log_retention_minutes: int = LOG_RETENTION_MINUTES,
                   reader_floor: int | None = None, log_floor: int | None = None,
                   target_bytes: int = TARGET_BYTES, now: float | None = None,
                   switches: Switches = NONE) -> TableReport:
    """Compact, set the retentions, checkpoint, clean the log and vacuum the table at
    ``uri``.

    ``reader_floor``: the version a streaming reader of this table has read up to (its next
    batch starts after it); None: no stream reads the table. ``log_floor``: the version its
    log must be kept after, for that reader to restart (``stream_position(replayed=True)``);
    None: ``reader_floor``."""
    started = time.monotonic()
    report = TableReport(name)
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        report.notes.append("no table yet")
        return report
    table = DeltaTable(uri, storage_options=storage_options)
    repaired = repair_protocol(table, uri, storage_options)
    table = readable(table, uri)
    report.notes += [repaired] if repaired else []
    report.files_before = len(table.file_uris())
    held = held_by_reader(lambda v: commit_time(uri, storage_options, v), table.version(),
                          reader_floor, retention_hours, now or time.time())
    small = table.optimize.compact(
        target_size=target_bytes,
        commit_properties=CommitProperties(
            custom_metadata={"lakecdc.operation": MAINTAIN_OPERATION}))
    report.compacted = int(small.get("numFilesRemoved", 0))
    switches.hit("after_compaction")      # F25: killed between the steps
    table.update_incremental()
    unset = _keep_retention(table, uri, log_retention_minutes)
    report.notes += [unset] if unset else []
    if report.compacted:
        table.create_checkpoint()
    if held:
        report.notes.append(f"its stream {held}: nothing vacuumed until it is within the "
                            "retention")
    else:
        report.vacuumed = _vacuum(table, retention_hours)
    table.update_incremental()
    report.files_after = len(table.file_uris())
    keep_from = reader_floor if log_floor is None else log_floor
    note = _clean_log(uri, storage_options, table.version(), keep_from)    # the last use
    report.notes += [note] if note else []
    if note is None:
        fs, root = filesystem(uri, storage_options)
        thin_checkpoints(fs, under(root, "_delta_log"),
                         table.version() if keep_from is None else keep_from + 1,
                         log_retention_minutes * 60 / CHECKPOINTS_KEPT)
    report.seconds = time.monotonic() - started
    _MAINTAINED[uri] = _MAINTAINED.get(uri, 0) + 1
    _record(uri, storage_options, report, now or time.time())
    return report


def unreferenced_hours(retention_hours: int) -> int:
    """How old a file no commit references must be before vacuum deletes it: the
    retention, and never less than ``UNREFERENCED_HOURS``."""
    return max(retention_hours, UNREFERENCED_HOURS)


def _vacuum(table: DeltaTable, retention_hours: int) -> int:
    """Step 4: the files commits removed more than ``retention_hours`` ago (delta-rs's lite
    vacuum: the log's tombstones only), then, in a full vacuum, the files no commit
    references once they are ``unreferenced_hours`` old. Returns the files deleted."""
    removed = table.vacuum(retention_hours=retention_hours, dry_run=False,
                           enforce_retention_duration=False, full=False)
    unreferenced = table.vacuum(retention_hours=unreferenced_hours(retention_hours),
                                dry_run=False, enforce_retention_duration=False, full=True)
    return len(removed) + len(unreferenced)


def clean_log(uri: str, storage_options: dict | None = None, *,
              log_retention_minutes: int = LOG_RETENTION_MINUTES,
              log_floor: int | None = None) -> str | None:
    """Steps 2 and 5 of ``maintain_table`` alone, between two maintenances: the log's
    retention set and its expired entries deleted (``log_floor`` as there). Cheap - a
    snapshot load and the deletes - so a writer does it often and its log stays near its
    retention. Returns why the log could not be cleaned, or None."""
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return None
    table = open_table(uri, storage_options)
    version = table.version()
    _keep_retention(table, uri, log_retention_minutes)     # its note: at maintenance
    if table.version() != version:
        _MAINTAINED[uri] = _MAINTAINED.get(uri, 0) + 1      # a commit beside its writer
    return _clean_log(uri, storage_options, table.version(), log_floor)


def _keep_retention(table: DeltaTable, uri: str, log_retention_minutes: int) -> str | None:
    """Set the table's ``log_properties`` where they differ (one metadata-only commit);
    returns why they differ still (``properties_settable``: no commit then), or None."""
    wanted = log_properties(log_retention_minutes)
    have = table.metadata().configuration
    if all(have.get(k) == v for k, v in wanted.items()):
        return None
    if not properties_settable(table):
        return ("log retention not set: deltalake 1.6 would add table features to this "
                "table's protocol (reader version 3: timestamp_ntz columns); set it with "
                f"Spark: {alter_properties_sql(spark_path(uri, on_databricks()), wanted)}")
    table.alter.set_table_properties(wanted)
    table.update_incremental()
    return None


def maintenances(uri: str) -> int:
    """How many maintenances of ``uri`` this process ran: a writer's kept handle
    (``core.handle``) is opened again after one, since maintenance committed beside it."""
    return _MAINTAINED.get(uri, 0)


_MAINTAINED: dict[str, int] = {}


def _clean_log(uri: str, storage_options: dict | None, version: int,
               reader_floor: int | None) -> str | None:
    """Delete the expired log entries before the newest checkpoint at or before
    ``reader_floor + 1``: the table's stream, restarted, reads the log from there. Returns
    why it could not, or None."""
    if reader_floor is not None and reader_floor < 0:
        return None                 # its stream has read nothing yet: it starts at the top
    keep_from = version if reader_floor is None else min(version, reader_floor + 1)
    try:
        open_table(uri, storage_options, version=keep_from).cleanup_metadata()
    except DeltaError as exc:       # its entry was cleaned before lakecdc kept the log
        return f"log not cleaned: version {keep_from} is unreadable ({exc})"
    return None


# A checkpoint file: ``<version>.checkpoint.parquet``, or one part of a multi-part one.
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(\.\d{10}\.\d{10})?\.parquet")
# How many checkpoints a log keeps over its retention, about: one per this share of it,
# besides every one of the last CHECKPOINT_GRACE_S.
CHECKPOINTS_KEPT = 24
CHECKPOINT_GRACE_S = 3600


def thin_checkpoints(fs, log: str, keep_from: int, every_s: float,
                     now: float | None = None) -> list[int]:
    """Step 6: delete the checkpoints a log keeps no use for; returns their versions. At
    maintenance only, since it lists the whole log. A writer
    checkpoints every ``checkpointInterval`` commits, and each checkpoint carries every live
    file and every tombstone of the retention, so a log kept a day would hold thousands of
    ever larger ones (a day of silver under traffic: about 2,400, of up to 2 MB each). Kept: the
    newest (every reader of the current version starts there), the newest at or before
    ``keep_from`` (a stream restarting there), the newest written in each ``every_s``
    window, so time travel to any version reads at most that much of the log after its
    checkpoint and the expired entries' cleanup still finds one near its cut, and every
    one younger than ``CHECKPOINT_GRACE_S``: a reader may have listed the log before a
    newer one was written, and reads it later (Spark's stream reads its snapshot's
    checkpoint lazily). So a log kept minutes is never thinned."""
    from pyarrow.fs import FileSelector

    parts: dict[int, list] = {}
    for info in fs.get_file_info(FileSelector(log)):
        match = _CHECKPOINT.fullmatch(info.base_name)
        if match:
            parts.setdefault(int(match[1]), []).append(info)
    if len(parts) < 2:
        return []
    versions = sorted(parts)
    written = {v: max(i.mtime.timestamp() for i in parts[v]) for v in versions}
    young = (now or time.time()) - CHECKPOINT_GRACE_S
    kept = {versions[-1], max([v for v in versions if v <= keep_from], default=versions[0]),
            *(v for v in versions if written[v] > young)}
    windows: dict[int, int] = {}
    for v in versions:                            # the newest of each window
        windows[int(written[v] // max(every_s, 1))] = v
    kept |= set(windows.values())
    gone = [v for v in versions if v not in kept]
    for v in gone:
        for info in parts[v]:
            fs.delete_file(info.path)
    return gone


def _record(uri: str, storage_options: dict | None, report: TableReport, at: float) -> None:
    """The report beside the table's log (``MAINTENANCE_FILE``; Delta readers and vacuum
    pass over names starting with ``_``), for ``lakecdc status`` and the metrics."""
    fs, root = filesystem(uri, storage_options)
    with fs.open_output_stream(under(root, MAINTENANCE_FILE), buffer_size=WRITE_BUFFER) as out:
        out.write(json.dumps({"at": at, "files_before": report.files_before,
                              "files_after": report.files_after,
                              "compacted": report.compacted, "vacuumed": report.vacuumed,
                              "seconds": round(report.seconds, 3)}).encode())


def held_by_reader(committed_at, version: int, reader_floor: int | None,
                   retention_hours: int, now: float) -> str | None:
    """Why the vacuum waits for the table's stream, or None. Decided on the table as it was
    before this maintenance's own commits, which hold nothing for a reader: the stream is
    within the retention when the oldest commit it has not read (``reader_floor + 1``) is
    younger than it, so every file it has still to read was removed, if at all, inside it.
    ``committed_at(version)``: when a version was committed (None: its entry is gone), read
    by whichever engine maintains the table."""
    if reader_floor is None or reader_floor >= version:
        return None
    if reader_floor < 0:
        return "has read nothing yet"
    unread_since = committed_at(reader_floor + 1)
    if unread_since is None:
        return f"is at version {reader_floor}, older than the log keeps"
    behind_h = (now - unread_since) / 3600
    return f"is at version {reader_floor}, {behind_h:.1f} h behind" \
        if behind_h > retention_hours else None


def commit_time(uri: str, storage_options: dict | None, version: int) -> float | None:
    """When ``version`` was committed (seconds since the epoch), from its log entry; None
    when the entry is gone (cleaned as expired)."""
    fs, root = filesystem(uri, storage_options)
    path = under(root, f"_delta_log/{version:020d}.json")
    try:
        with fs.open_input_stream(path) as stream:
            text = stream.read().decode()
    except (FileNotFoundError, OSError):
        return None
    for line in text.splitlines():
        info = json.loads(line).get("commitInfo") if line.strip() else None
        if info and info.get("timestamp"):
            return info["timestamp"] / 1000
    return None


@dataclass(frozen=True)
class TableSize:
    """What ``lakecdc status`` and the metrics show of a table's size."""
    live_files: int
    live_bytes: int
    log_entries: int                 # files in _delta_log (commits, checkpoints, checksums)
    last_maintained: dict | None     # the newest maintenance's report (``MAINTENANCE_FILE``)


def table_size(uri: str, storage_options: dict | None = None) -> TableSize | None:
    """The table's live files and bytes (from its snapshot), its log's length (a listing of
    ``_delta_log``) and its newest maintenance; None: no table."""
    from pyarrow.fs import FileSelector

    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return None
    adds = open_table(uri, storage_options).get_add_actions(flatten=True)
    fs, root = filesystem(uri, storage_options)
    log = fs.get_file_info(FileSelector(under(root, "_delta_log")))
    return TableSize(adds.num_rows, int(sum(adds.column("size_bytes").to_pylist())),
                     len(log), _read_json(fs, under(root, MAINTENANCE_FILE)))


def _read_json(fs, path: str) -> dict | None:
    try:
        with fs.open_input_stream(path) as stream:
            return json.loads(stream.read().decode())
    except (FileNotFoundError, OSError, ValueError):
        return None
