"""Streaming checkpoints after a ``kill -9``: what may be removed, and nothing else.

Spark writes every checkpoint file (``metadata``, ``offsets/N``, ``commits/N``,
``sources/…/N``) to a temporary file ``.<name>.<uuid>[.TID<n>].tmp`` beside it and then
renames it into place (``CheckpointFileManager.createAtomic``); Hadoop's local file system
adds a checksum file ``.<temp name>.crc`` next to the temporary one. A process killed
between the two leaves the temporary file behind. Spark never reads it, but from 4.1 on it
refuses a checkpoint whose ``offsets/`` is not empty on batch 0
(``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``), so a kill during a query's first batch
would wedge it for good.

``remove_incomplete_writes`` removes exactly those temporary files and their checksums:
they are provably incomplete (a finished write has been renamed away from that name).
Committed files - the query id in ``metadata``, planned offsets, commit markers - are never
touched: they are the idempotency record of every sink. Call it only while no other process
runs the same query (lakecdc's writers hold the gold writer lock; see ``core.locks``).
"""

from __future__ import annotations

import json
import logging
import re

log = logging.getLogger("lakecdc.checkpoints")

# ".<final name>.<uuid>[.TID<task attempt>].tmp", and Hadoop's ".<that>.crc" beside it.
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
INCOMPLETE = re.compile(rf"\.?\.[^/]+\.{_UUID}(\.TID\d+)?\.tmp(\.crc)?")
# The folders Spark writes checkpoint files into, below the checkpoint root.
_FOLDERS = ("", "offsets", "commits", "sources")


def is_incomplete_write(name: str) -> bool:
    """True for the name of a temporary checkpoint file (or its checksum) that Spark never
    renamed into place."""
    return INCOMPLETE.fullmatch(name) is not None


def remove_incomplete_writes(spark, checkpoint_dir: str) -> list[str]:
    """Remove the temporary files a killed write left in ``checkpoint_dir``; returns their
    paths. Local paths and object stores alike, through Hadoop's file system."""
    fs, path_of = _file_system(spark, checkpoint_dir)
    removed: list[str] = []
    for folder in _FOLDERS:
        for status in _walk(fs, path_of(checkpoint_dir, folder),
                            recursive=folder == "sources"):
            name = status.getPath().getName()
            if status.isFile() and is_incomplete_write(name):
                if fs.delete(status.getPath(), False):
                    removed.append(status.getPath().toString())
    for path in removed:
        log.warning("removed an incomplete checkpoint write left by a killed process: %s",
                    path)
    return removed


def latest_planned_batch(spark, checkpoint_dir: str) -> int | None:
    """The highest batch id in the checkpoint's offset log (planned batches), or None."""
    fs, path_of = _file_system(spark, checkpoint_dir)
    names = [s.getPath().getName() for s in _walk(fs, path_of(checkpoint_dir, "offsets"),
                                                  recursive=False)]
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else None


def source_table_ids(spark, checkpoint_dir: str) -> set[str]:
    """The Delta table ids (``reservoirId``) the checkpoint's newest planned batch reads."""
    batch = latest_planned_batch(spark, checkpoint_dir)
    if batch is None:
        return set()
    lines = [r.value for r in spark.read.text(
        f"{checkpoint_dir.rstrip('/')}/offsets/{batch}").collect()]
    ids = set()
    for line in lines[2:]:            # version, batch metadata, then one offset per source
        try:
            ids.add(json.loads(line).get("reservoirId"))
        except (ValueError, AttributeError):
            continue
    return ids - {None}


def remove_checkpoint(spark, checkpoint_dir: str) -> None:
    fs, path_of = _file_system(spark, checkpoint_dir)
    fs.delete(path_of(checkpoint_dir, ""), True)


def has_metadata(spark, checkpoint_dir: str) -> bool:
    """Whether the checkpoint exists: its ``metadata`` file (the query id) was written."""
    fs, path_of = _file_system(spark, checkpoint_dir)
    return bool(fs.exists(path_of(checkpoint_dir, "metadata")))


def _file_system(spark, checkpoint_dir: str):
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(checkpoint_dir)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path_of(base: str, folder: str):
        return jvm.org.apache.hadoop.fs.Path(f"{base.rstrip('/')}/{folder}" if folder
                                             else base)
    return fs, path_of


def _walk(fs, path, recursive: bool):
    if not fs.exists(path):
        return
    for status in fs.listStatus(path):
        if status.isDirectory():
            if recursive:
                yield from _walk(fs, status.getPath(), recursive)
        else:
            yield status


def stream_position(checkpoint_dir: str, storage_options: dict | None = None,
                    replayed: bool = False) -> int | None:
    """The newest version of its Delta source a query has read whole: the source offset of
    its newest committed batch ``N`` (``commits/N``, ``offsets/N``), less one, since that
    offset's version is where its next batch starts. -1 when no batch is committed (nothing
    read yet); None when there is no checkpoint (no query ever started there: Spark writes
    its ``metadata`` first). Read with pyarrow, no JVM: the shipper needs it too
    (``pipelines.maintain``).

    ``replayed``: where batch ``N`` started instead (``offsets/N-1``), less one. A restarted
    query plans its newest committed batch once more (Spark's ``getBatch`` from
    ``offsets/N-1``), and the Delta source reads the log of those versions, not their
    files: the log must reach back that far, the files need not (found by
    ``test_maintenance.py``: "Delta stream cannot resume from version 46"). -1 when the
    newest committed batch is the first (where it started is not in the checkpoint)."""
    from pyarrow.fs import FileSelector, FileType

    from core.storage import filesystem, under

    fs, root = filesystem(checkpoint_dir, storage_options)
    if fs.get_file_info(under(root, "metadata")).type == FileType.NotFound:
        return None
    try:
        names = [i.base_name for i in fs.get_file_info(FileSelector(under(root, "commits")))
                 if i.type == FileType.File]
    except FileNotFoundError:
        return -1
    committed = sorted(int(n) for n in names if n.isdigit())
    batch = (committed[-1] - 1 if replayed else committed[-1]) if committed else -1
    if batch < 0:
        return -1
    with fs.open_input_stream(under(root, f"offsets/{batch}")) as stream:
        lines = stream.read().decode().splitlines()
    versions = [json.loads(line)["reservoirVersion"] for line in lines[2:]
                if line.strip().startswith("{") and "reservoirVersion" in line]
    return min(versions) - 1 if versions else -1
