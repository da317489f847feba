"""``core.maintenance`` on real Delta tables (delta-rs): compaction keeps every row and is
invisible to streaming readers (``dataChange=false``); vacuum deletes what is older than
the retention and orphans of killed writes, and nothing a stream has still to read; the
schedule runs when due and never raises into its writer."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from core.checkpoints import stream_position
from core.config import Config
from core.handle import CHECKPOINTS
from core.layout import STREAM_CHECKPOINT
from core.maintenance import (MAINTENANCE_FILE, UNREFERENCED_HOURS, maintain_table,
                              table_size)
from pipelines.maintain.owners import Maintained, tables_of
from pipelines.maintain.schedule import Maintainer, maintain

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def small_commits(path: Path, commits: int, rows: int = 50) -> None:
    """An append-only table of ``commits`` one-file commits (bronze's shape of growth)."""
    for i in range(commits):
        part = pa.table({"k": list(range(i * rows, (i + 1) * rows)), "v": ["x" * 40] * rows},
                        schema=SCHEMA)
        write_deltalake(str(path), part, mode="append" if i else "error",
                        configuration=None if i else {"delta.appendOnly": "true",
                                                      **CHECKPOINTS})


def data_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("*.parquet")}


def keys(path: Path, version: int | None = None) -> list[int]:
    return sorted(DeltaTable(str(path), version=version).to_pyarrow_table().column("k")
                  .to_pylist())


def test_compaction_keeps_every_row_in_few_files_and_marks_no_data_change(tmp_path):
    table = tmp_path / "t"
    small_commits(table, 40)
    before = keys(table)
    report = maintain_table("t", str(table), retention_hours=24)
    assert (report.files_before, report.files_after, report.compacted) == (40, 1, 40)
    assert keys(table) == before == list(range(2000))
    log = table / "_delta_log" / f"{DeltaTable(str(table)).version() - 1:020d}.json"
    compaction = [json.loads(line) for line in log.read_text().splitlines()]
    changes = [a.get("add") or a.get("remove") for a in compaction
               if "add" in a or "remove" in a]
    assert len(changes) == 41 and not any(c["dataChange"] for c in changes), compaction
    # Within the retention nothing is deleted: readers of older versions find their files.
    assert report.vacuumed == 0 and len(data_files(table)) == 41
    assert keys(table, version=5) == list(range(300))


def test_vacuum_deletes_removed_files_past_the_retention_and_orphans_of_killed_writes(
        tmp_path):
    table = tmp_path / "t"
    small_commits(table, 10)
    orphan = table / "part-00000-killed-before-its-commit.parquet"
    pq.write_table(pa.table({"k": [1], "v": ["o"]}, schema=SCHEMA), orphan)
    aged = time.time() - UNREFERENCED_HOURS * 3600 - 60      # no writer could still commit it
    os.utime(orphan, (aged, aged))
    report = maintain_table("t", str(table), retention_hours=0)
    assert report.vacuumed == 11 and data_files(table) == {
        Path(u).name for u in DeltaTable(str(table)).file_uris()}
    assert not orphan.exists() and keys(table) == list(range(500))
    config = DeltaTable(str(table)).metadata().configuration
    assert config["delta.deletedFileRetentionDuration"] == "interval 10 minutes"
    assert config["delta.logRetentionDuration"] == "interval 10 minutes"
    assert config["delta.enableExpiredLogCleanup"] == "false"


def test_a_table_others_read_keeps_its_removed_files_as_long_as_its_log(tmp_path):
    """``LAKECDC_RETENTION_HOURS=0``: a table of lakecdc's own loses the files its
    compaction removed at once; a table others read (kept a day) keeps them, so time travel
    inside its log still reads them, and says so in its properties (a plain VACUUM's
    horizon)."""
    config = Config(lakehouse=str(tmp_path / "lake"), retention_hours=0)
    own, read = tmp_path / "own", tmp_path / "read"
    for table in (own, read):
        small_commits(table, 10)
    maintain([Maintained("own", str(own), config.log_retention_minutes),
              Maintained("read", str(read), config.kept_minutes("gold"))], config)
    assert len(data_files(own)) == 1 and len(data_files(read)) == 11
    assert keys(read, version=5) == list(range(300))
    assert DeltaTable(str(read)).metadata().configuration[
        "delta.deletedFileRetentionDuration"] == "interval 1440 minutes"


def test_a_writers_file_not_yet_committed_outlives_a_vacuum_at_no_retention(tmp_path):
    """A writer that writes its files, then commits them (as ``tables add`` writes a chunk
    into a mirror, and every delta-rs writer does): a maintenance at a retention of 0 hours
    runs in between. The file is younger than ``UNREFERENCED_HOURS``, so it stays, and the
    commit's rows are all there. Deleted, the commit would name a file that is gone and
    every read of the table would fail."""
    from deltalake.transaction import AddAction

    table = tmp_path / "t"
    small_commits(table, 3)
    name = "part-00000-written-not-yet-committed.parquet"
    rows = pa.table({"k": list(range(1000, 1010)), "v": ["w"] * 10}, schema=SCHEMA)
    pq.write_table(rows, table / name)
    report = maintain_table("t", str(table), retention_hours=0)
    assert (table / name).exists(), report.line()
    size = (table / name).stat().st_size
    DeltaTable(str(table)).create_write_transaction(
        [AddAction(name, size, {}, int(time.time() * 1000), True,
                   json.dumps({"numRecords": 10}))], mode="append", schema=SCHEMA)
    assert keys(table) == sorted([*range(150), *range(1000, 1010)])


@pytest.mark.parametrize("guarded", [True, False], ids=["reader_floor", "negative_control"])
def test_a_stream_behind_the_retention_holds_back_the_vacuum(tmp_path, guarded):
    """A stream that has read up to version 3 of 20, and a retention of 0 hours: it is
    behind by more than the retention. The files of versions 4-19 are compacted away, but
    stay on storage until it has read them. Without the reader's floor they are deleted,
    and its next batch would find them gone (F17)."""
    table = tmp_path / "t"
    small_commits(table, 20)
    unread = {Path(u).name for u in DeltaTable(str(table), version=19).file_uris()} - {
        Path(u).name for u in DeltaTable(str(table), version=3).file_uris()}
    report = maintain_table("t", str(table), retention_hours=0,
                            reader_floor=3 if guarded else None)
    assert report.compacted == 20
    if guarded:
        assert report.vacuumed == 0 and unread <= data_files(table), report.notes
        assert "nothing vacuumed" in report.line()
        # Caught up: the floor is the table's version, and the files go.
        caught_up = maintain_table("t", str(table), retention_hours=0,
                                   reader_floor=DeltaTable(str(table)).version())
        assert caught_up.vacuumed == 20
    else:
        assert report.vacuumed == 20 and not unread & data_files(table)


def test_a_reader_at_a_version_no_longer_logged_holds_back_the_vacuum(tmp_path):
    """The log keeps commits for ``delta.logRetentionDuration``: a reader at a version
    whose entry is gone (cleaned, here by hand: entries before the checkpoint at 10) is
    far behind, and nothing is vacuumed for it."""
    table = tmp_path / "t"
    for i in range(12):
        write_deltalake(str(table), pa.table({"k": [i], "v": ["x"]}, schema=SCHEMA),
                        mode="append", configuration={"delta.checkpointInterval": "10"}
                        if i == 0 else None)
    for version in range(5):
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    report = maintain_table("t", str(table), retention_hours=0, reader_floor=1)
    assert report.compacted == 12 and report.vacuumed == 0
    assert "older than the log keeps" in report.line()


def commits_logged(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


def age_log(path: Path, hours: float) -> None:
    """Set the log's files ``hours`` back: what a table that old would show."""
    then = time.time() - hours * 3600
    for entry in (path / "_delta_log").iterdir():
        os.utime(entry, (then, then))


def test_the_log_keeps_its_retention_and_the_writers_own_checkpoints_clean_nothing(
        tmp_path):
    """Expired log entries before the newest checkpoint go at maintenance; the writers'
    checkpoints (every 20 commits) no longer clean the log themselves, so only maintenance,
    which knows the table's stream, decides what goes."""
    table = tmp_path / "t"
    small_commits(table, 10)
    maintain_table("t", str(table), retention_hours=24, log_retention_minutes=10)
    age_log(table, 1)
    for i in range(45):          # checkpoints at 19, 39: a writer's own clean-up would run
        write_deltalake(str(table), pa.table({"k": [i], "v": ["w"]}, schema=SCHEMA),
                        mode="append")
    assert commits_logged(table)[0] == 0
    maintain_table("t", str(table), retention_hours=24, log_retention_minutes=10)
    # Entries older than 10 minutes before the newest checkpoint (at 39) are gone; the new
    # ones, inside the retention, stay (and the table reads the same).
    assert commits_logged(table)[0] == 11
    assert len(keys(table)) == 545


@pytest.mark.parametrize("guarded", [True, False], ids=["reader_floor", "negative_control"])
def test_a_stream_behind_keeps_the_log_it_resumes_from(tmp_path, guarded):
    """A stream that has read version 25 of 60 resumes at 26: its log entries stay however
    old they are. Without the reader's floor they are cleaned up to the newest checkpoint
    (59), and the stream could not resume."""
    table = tmp_path / "t"
    small_commits(table, 2)
    maintain_table("t", str(table), retention_hours=24)         # the log properties
    for i in range(58):
        write_deltalake(str(table), pa.table({"k": [i], "v": ["w"]}, schema=SCHEMA),
                        mode="append")
    age_log(table, 1)
    maintain_table("t", str(table), retention_hours=24, reader_floor=25 if guarded else None)
    first = commits_logged(table)[0]
    if guarded:   # from the newest checkpoint at or before 26 (19) on
        assert first == 19 and len(keys(table, version=26)) == 100 + 23
    else:
        assert first > 26


def test_table_size_shows_files_bytes_log_and_the_last_maintenance(tmp_path):
    table = tmp_path / "t"
    assert table_size(str(table)) is None
    small_commits(table, 6)
    before = table_size(str(table))
    assert before.live_files == 6 and before.live_bytes > 0 and before.log_entries >= 6
    assert before.last_maintained is None
    maintain_table("t", str(table), retention_hours=24, now=1_800_000_000.0)
    after = table_size(str(table))
    assert after.live_files == 1 and after.last_maintained["at"] == 1_800_000_000.0
    assert json.loads((table / MAINTENANCE_FILE).read_text())["compacted"] == 6


def checkpoint(root: Path, committed: dict[int, int], planned: dict[int, int]) -> Path:
    """A Spark streaming checkpoint's offsets and commits: batch → source version."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text('{"id":"q"}')
    for folder, batches in (("offsets", planned), ("commits", committed)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for batch, version in batches.items():
            (root / folder / str(batch)).write_text(
                'v1\n{"batchWatermarkMs":0}\n' + json.dumps(
                    {"sourceVersion": 1, "reservoirId": "r", "reservoirVersion": version,
                     "index": -1, "isStartingVersion": False}))
    return root


def test_stream_position_is_the_newest_committed_batch_s_offset_less_one(tmp_path):
    """... and, for the log, where that batch started: a restarted query plans its newest
    committed batch once more (from the batch before's offset)."""
    assert stream_position(str(tmp_path / "none")) is None       # no query: no reader
    root = checkpoint(tmp_path / "cp", committed={0: 0, 1: 0}, planned={0: 5, 1: 9, 2: 12})
    (root / "commits" / ".2.1b4e6c9e-3f0c-4e8b-9a7e-3d2f1c0b9a8e.tmp").write_text("")
    assert stream_position(str(root)) == 8        # batch 2 is planned, not committed
    assert stream_position(str(root), replayed=True) == 4     # batch 1 started at 5
    assert stream_position(str(checkpoint(tmp_path / "cp0", {}, {0: 3}))) == -1
    first = checkpoint(tmp_path / "cp1", {0: 0}, {0: 3})
    assert stream_position(str(first)) == 2
    assert stream_position(str(first), replayed=True) == -1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_schedule_runs_each_interval_and_a_failure_never_reaches_the_writer(
        tmp_path, caplog, monkeypatch):
    config = Config(lakehouse=str(tmp_path / "lake"), maintain_interval_s=60)
    bronze = Path(config.bronze_path)
    small_commits(bronze, 8)
    clock = Clock()
    maintainer = Maintainer(config, "ship", clock=clock)
    assert maintainer.after_batch() == [] and len(DeltaTable(str(bronze)).file_uris()) == 8
    clock.now = 61
    [report] = maintainer.after_batch()
    assert report.table == "bronze" and report.files_after == 1
    clock.now = 90
    assert maintainer.after_batch() == []                  # not due again yet
    calls = []

    def fails(*_args, **_kwargs):
        calls.append(clock.now)
        raise OSError("No space left on device")

    monkeypatch.setattr("core.engine.delta_rs.maintain_table", fails)
    clock.now = 200
    with caplog.at_level(logging.WARNING, logger="lakecdc.maintain"):
        assert maintainer.after_batch() == []
    assert "maintenance of the ship tables failed" in caplog.text
    clock.now = 230
    assert maintainer.after_batch() == []          # tried again one interval later, not before
    clock.now = 261
    assert maintainer.after_batch() == [] and calls == [200, 261]


@pytest.mark.parametrize("guarded", [True, False], ids=["reader_floor", "negative_control"])
def test_between_maintenances_the_writer_cleans_the_log_and_bronze_keeps_two_minutes(
        tmp_path, guarded):
    """Every 30 s between two maintenances the shipper's hook cleans bronze's expired log:
    bronze keeps 2 minutes (only lakecdc's stream reads its history), gold's internal tables
    the configured 10, the tables others read a day. The stream's restart point holds the
    cleanup back as in a maintenance; without its floor the entries it resumes from go."""
    config = Config(lakehouse=str(tmp_path / "lake"), maintain_interval_s=300,
                    disabled_guards=frozenset() if guarded else frozenset({"reader_floor"}))
    assert {t.name: t.log_retention_minutes for t in tables_of(config, "stream")} == {
        "silver": 1440, "quarantine": 1440, "gold": 1440, "gold_pending": 10,
        "gold_deltas": 10}
    bronze = Path(config.bronze_path)
    small_commits(bronze, 2)
    clock = Clock()
    maintainer = Maintainer(config, "ship", clock=clock)
    clock.now = 300
    assert [r.table for r in maintainer.after_batch()] == ["bronze"]
    assert DeltaTable(str(bronze)).metadata().configuration[
        "delta.logRetentionDuration"] == "interval 2 minutes"
    for i in range(58):
        write_deltalake(str(bronze), pa.table({"k": [i], "v": ["w"]}, schema=SCHEMA),
                        mode="append")
    # The stream's newest committed batch started after version 25: it resumes at 26.
    checkpoint(Path(config.table_path(STREAM_CHECKPOINT)), committed={0: 0, 1: 0},
               planned={0: 26, 1: 50})
    age_log(bronze, 3 / 60)              # 3 minutes old: past bronze's retention
    clock.now = 329
    assert maintainer.after_batch() == [] and commits_logged(bronze)[0] == 0    # not due
    clock.now = 330
    assert maintainer.after_batch() == []
    first = commits_logged(bronze)[0]
    if guarded:   # from the newest checkpoint at or before 26 (19) on
        assert first == 19 and len(keys(bronze, version=26)) == 100 + 23
    else:
        assert first > 26
    assert len(keys(bronze)) == 100 + 58


def test_a_kill_9_anywhere_in_maintenance_leaves_every_row_once_and_the_next_run_finishes(
        tmp_path):
    """F25: maintenance (compaction, checkpoint, vacuum) SIGKILLed at random moments, six
    times over, with new small commits before each; after each kill the table holds every
    row exactly once, and an undisturbed run afterwards compacts it and deletes what the
    killed ones left behind (once it is past ``UNREFERENCED_HOURS``: aged here)."""
    import random
    import signal
    import subprocess
    import sys

    from tests.tests_support import ROOT

    table = tmp_path / "t"
    code = ("import sys; from core.maintenance import maintain_table; "
            "maintain_table('t', sys.argv[1], retention_hours=0, target_bytes=1 << 20)")
    rng = random.Random(25)
    rows, killed = 0, 0
    for _ in range(6):
        for _ in range(40):
            part = pa.table({"k": list(range(rows, rows + 2000)),
                             "v": [f"row {j} " * 8 for j in range(2000)]}, schema=SCHEMA)
            write_deltalake(str(table), part, mode="append")
            rows += 2000
        proc = subprocess.Popen([sys.executable, "-c", code, str(table)], cwd=ROOT)
        try:
            proc.wait(timeout=rng.uniform(0.1, 0.6))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed += 1
        assert keys(table) == list(range(rows))
    assert killed, "no run was killed: each ended before its kill"
    aged = time.time() - UNREFERENCED_HOURS * 3600 - 60     # a killed compaction's files:
    for data in table.glob("*.parquet"):                    # no writer could still commit them
        os.utime(data, (aged, aged))
    report = maintain_table("t", str(table), retention_hours=0, target_bytes=1 << 20)
    assert keys(table) == list(range(rows)) and report.files_after < 40
    assert data_files(table) == {Path(u).name for u in DeltaTable(str(table)).file_uris()}


def test_a_log_kept_a_day_keeps_about_one_checkpoint_an_hour(tmp_path):
    """``thin_checkpoints`` on checkpoints written over a day, one every 10 minutes: it
    keeps the newest of each hour, the newest, and the newest at or before a stream's
    restart; a table read at a thinned version still loads, from an older checkpoint. The
    same checkpoints all younger than an hour: none is deleted."""
    from pyarrow.fs import LocalFileSystem

    from core.maintenance import CHECKPOINTS_KEPT, thin_checkpoints

    table = tmp_path / "t"
    small_commits(table, 150, rows=1)
    log = table / "_delta_log"
    for version in range(1, 145):
        DeltaTable(str(table), version=version).create_checkpoint()
    assert thin_checkpoints(LocalFileSystem(), str(log), keep_from=100, every_s=3600) == [], \
        "a checkpoint younger than an hour was deleted (a reader may still read it)"
    start = (time.time() - 2 * 86400) // 3600 * 3600    # on the hour: six checkpoints each
    for i, version in enumerate(range(1, 145)):
        at = start + i * 600
        os.utime(log / f"{version:020d}.checkpoint.parquet", (at, at))
    gone = thin_checkpoints(LocalFileSystem(), str(log), keep_from=100,
                            every_s=86400 / CHECKPOINTS_KEPT)
    left = sorted(int(p.name[:20]) for p in log.glob("*.checkpoint.parquet"))
    assert len(left) + len(gone) == 144 and len(left) == 25, left
    assert 144 in left and 100 in left            # 100: not the newest of its hour (102)
    assert all(b - a <= 6 for a, b in zip(left, left[1:])), left
    thinned = next(v for v in gone if v > 100)
    assert keys(table, version=thinned) == list(range(thinned + 1))
