"""``core.handle.WriterHandle``: a writer's kept handle commits where a new one would, and
is opened again when it must be."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from core.handle import CHECKPOINT_INTERVAL, CHECKPOINTS, WriterHandle
from core.maintenance import maintain_table

ROWS = pa.table({"k": pa.array([1], pa.int64()), "c": pa.array([1], pa.int64())})


def merge_one(table: DeltaTable, k: int) -> None:
    """gold's shape of commit: a MERGE, which fails on a stale snapshot."""
    source = pa.table({"k": pa.array([k], pa.int64()), "c": pa.array([1], pa.int64())})
    (table.merge(source, "t.k = s.k", source_alias="s", target_alias="t")
     .when_matched_update(updates={"c": "t.c + s.c"})
     .when_not_matched_insert(updates={"k": "s.k", "c": "s.c"}).execute())


def test_the_handle_is_kept_between_commits_and_opened_again_after_a_checkpoint(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, ROWS, configuration=CHECKPOINTS)
    handle = WriterHandle(path)
    seen = []
    for i in range(CHECKPOINT_INTERVAL + 2):
        with handle.use() as table:
            seen.append(id(table))
            merge_one(table, i % 3)
    assert len(set(seen)) == 2 and seen[0] == seen[CHECKPOINT_INTERVAL - 1]
    counts = DeltaTable(path).to_pyarrow_table().to_pydict()
    assert sum(counts["c"]) == 1 + CHECKPOINT_INTERVAL + 2


def test_after_a_maintenance_in_the_process_the_next_commit_opens_the_table_again(tmp_path):
    """Maintenance commits beside the writer (compaction, the retention properties): a
    MERGE from the handle opened before it would fail with a conflict."""
    path = str(tmp_path / "t")
    write_deltalake(path, ROWS, configuration=CHECKPOINTS)
    handle = WriterHandle(path)
    for i in range(3):
        with handle.use() as table:
            merge_one(table, i + 10)
    stale = DeltaTable(path)
    maintain_table("t", path, retention_hours=24)
    with handle.use() as table:
        assert table is not stale
        merge_one(table, 1)
    assert dict(zip(*DeltaTable(path).to_pyarrow_table().select(["k", "c"]).to_pydict()
                    .values()))[1] == 2
    try:
        merge_one(stale, 2)
    except Exception as exc:       # what the handle avoids: the stale snapshot's conflict
        assert "concurrent" in str(exc).lower()
    else:
        raise AssertionError("a MERGE from a snapshot older than the maintenance committed")


def test_a_failed_commit_opens_the_table_again(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, ROWS, configuration=CHECKPOINTS)
    handle = WriterHandle(path)
    with handle.use() as first:
        pass
    try:
        with handle.use():
            raise OSError("the commit failed")
    except OSError:
        pass
    with handle.use() as again:
        assert again is not first
