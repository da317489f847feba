"""The shipper's side of the snapshot backfill: a HIGH watermark of a staged chunk becomes
the chunk's read rows, in the HIGH's own transaction, minus the rows its window drops and
with only the unchanged columns of those changed in it (``bronze.snapshot_backfill`` documents the
protocol)."""


from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bronze.backfill_marks import (
    HighMark,
    Window,
    changed_keys,
    note_change,
    partial_read,
    read_records,
)
from bronze.backfill_staging import ChunkInfo, app_id, staging_table
from bronze.table import BronzeTable
from core.config import Config
from core.engine.api import Engine
from core.lsn import fmt
from core.switches import Switches

log = logging.getLogger("lakecdc.backfill")


GUARD = "backfill_window"          # LAKECDC_UNSAFE_DISABLE_GUARDS: negative control only


@dataclass
class Emission:
    """Read rows the shipper appends to one bronze commit, and what to record with them."""

    batches: list[pa.RecordBatch]
    app_versions: dict[str, int]
    chunks: list[str]                 # "run:chunk" emitted
    rows: int                         # read rows appended
    dropped: int                      # chunk rows dropped by the window rule
    partial: int = 0                  # read rows cut to the columns no change carried


class BackfillEmitter:
    """Turns the HIGH watermarks of one shipper batch into read rows (see module doc)."""

    def __init__(self, config: Config, bronze: BronzeTable, *, engine: Engine,
                 switches: Switches | None = None) -> None:
        """``engine``: the shipper's (staging is read through it); ``switches``: the
        shipper's (None: the configuration's)."""
        self.staging = staging_table(config, engine=engine)
        self.bronze = bronze
        self.window_rule = (switches or Switches.from_config(config)).on(GUARD)
        # A counted table's read rows stay whole or dropped: gold and the silver suite
        # expect every dimension in a write, and these tables are never added while running
        # (their TOASTed values come from setup's snapshot and the changes since).
        self.counted = {config.notifications_table, config.history_table}

    def staged_marks(self, marks: list[HighMark]) -> tuple[list[HighMark], int]:
        """The marks of runs staging holds, and how many others were dropped.

        Anyone allowed to emit logical messages can forge marks: those of runs that were
        never staged are dropped before any other read, at the cost of one read of
        staging's run markers per batch."""
        if not marks:
            return [], 0
        known = self.staging.run_ids()
        staged = [m for m in marks if m.run in known]
        forged = len(marks) - len(staged)
        if forged:
            log.warning("backfill: %d HIGH marks of runs that were never staged ignored "
                        "(forged, or of another lakehouse)", forged)
        return staged, forged

    def plan(self, marks: list[HighMark], bronze_commit_lsn: int,
             assembled: Callable[[], Iterable[pa.RecordBatch]], tx_changes: np.ndarray,
             slot: str, shipped_at: pa.TimestampScalar) -> Emission | None:
        """The read rows for ``marks`` (``staged_marks`` of the HIGHs in this batch), or None.

        ``assembled`` re-reads this batch's rows (for changes inside the windows);
        ``bronze_commit_lsn`` is what bronze held before it (earlier parts of a window are
        looked up there). ``tx_changes`` is updated in place: each HIGH's transaction grows
        by its read rows, so ``finalize`` writes the grown count on the message row too.
        """
        accepted: list[tuple[HighMark, ChunkInfo]] = []
        # Every read below is made at most once per run and chunk: with the forged marks
        # dropped first (``staged_marks``), a flood of marks costs no I/O per mark.
        versions: dict[str, int] = {}
        looked_up: dict[tuple[str, int], ChunkInfo | None] = {}
        for mark in sorted(marks, key=lambda m: (m.commit_lsn, m.seq)):
            if mark.run not in versions:
                versions[mark.run] = self.bronze.app_version(app_id(mark.run)) or 0
            have = versions[mark.run]
            if mark.chunk <= have:
                log.debug("backfill %s chunk %d is already in bronze: repeated HIGH ignored",
                          mark.run, mark.chunk)
                continue
            if mark.chunk != have + 1:
                log.warning("backfill %s: HIGH watermark of chunk %d while chunk %d is the "
                            "next to emit; ignored (a resumed backfill announces it again)",
                            mark.run, mark.chunk, have + 1)
                continue
            if (mark.run, mark.chunk) not in looked_up:
                looked_up[(mark.run, mark.chunk)] = self.staging.chunk(mark.run, mark.chunk)
            info = looked_up[(mark.run, mark.chunk)]
            if info is None:
                log.warning("backfill %s: HIGH watermark of chunk %d, which is not staged "
                            "in %s; ignored", mark.run, mark.chunk, self.staging.uri)
                continue
            accepted.append((mark, info))
            versions[mark.run] = mark.chunk
        if not accepted:
            return None

        windows = [Window(info.run, info.chunk, info.table, info.key_columns, info.low_lsn,
                          mark.commit_lsn, frozenset(info.in_progress))
                   for mark, info in accepted]
        changed = (self._changed(windows, bronze_commit_lsn, assembled) if self.window_rule
                   else {(w.run, w.chunk): {} for w in windows})
        next_seq: dict[int, int] = {}
        pending: list[tuple[HighMark, int, pa.Array]] = []
        dropped = partial = 0
        for (mark, info), window in zip(accepted, windows):
            rows = self.staging.chunk_rows(mark.run, mark.chunk)
            data, cut = self._window_rule(rows, changed[(window.run, window.chunk)], info)
            dropped += rows.num_rows - len(data)
            partial += cut
            first = next_seq.get(mark.gid, int(tx_changes[mark.gid]))
            next_seq[mark.gid] = first + len(data)
            pending.append((mark, first, data))
            log.debug("backfill %s chunk %d (%s): %d rows, %d dropped and %d cut to their "
                      "unchanged columns (changed in window %s..%s)", mark.run, mark.chunk,
                      info.table, len(data), rows.num_rows - len(data), cut,
                      fmt(info.low_lsn), fmt(mark.commit_lsn))
        for gid, n in next_seq.items():
            tx_changes[gid] = n
        batches = [read_records(data, mark, first, int(tx_changes[mark.gid]), slot, shipped_at)
                   for mark, first, data in pending if len(data)]
        app_versions: dict[str, int] = {}
        for mark, _ in accepted:
            app_versions[app_id(mark.run)] = max(app_versions.get(app_id(mark.run), 0),
                                                 mark.chunk)
        return Emission(batches, app_versions, [f"{m.run}:{m.chunk}" for m, _ in accepted],
                        sum(b.num_rows for b in batches), dropped, partial)

    def _window_rule(self, rows: pa.Table, changed: dict[str, set[str] | None],
                     info: ChunkInfo) -> tuple[pa.Array, int]:
        """A chunk's read rows (``data``) after the window rule, and how many of them were
        cut to their unchanged columns (``partial_read``); the others changed in the window
        are dropped."""
        data = rows.column("data").combine_chunks()
        if not changed:
            return data, 0
        hit = pc.is_in(rows.column("key"), value_set=pa.array(sorted(changed)))
        hits = np.flatnonzero(hit.combine_chunks().to_numpy(zero_copy_only=False))
        if not len(hits):
            return data, 0
        keys, texts = rows.column("key"), data.to_pylist()
        whole = info.table in self.counted
        for i in hits.tolist():
            texts[i] = None if whole else partial_read(texts[i], info.key_columns,
                                                       changed[keys[i].as_py()])
        cut = sum(texts[i] is not None for i in hits.tolist())
        return pa.array([t for t in texts if t is not None], pa.string()), cut

    def _changed(self, windows: list[Window], bronze_commit_lsn: int,
                 assembled: Callable[[], Iterable[pa.RecordBatch]]
                 ) -> dict[tuple[str, int], dict[str, set[str] | None]]:
        result: dict[tuple[str, int], dict[str, set[str] | None]] = {
            (w.run, w.chunk): {} for w in windows}

        def merge(found: dict[tuple[str, int], dict[str, set[str] | None]]) -> None:
            for k, keys in found.items():
                for key, carried in keys.items():
                    note_change(result[k], key, carried)

        # Earlier parts of the windows, already in bronze: a few rows, found through the
        # files' commit_lsn / xid statistics.
        text = []
        for w in windows:
            if w.low_lsn < bronze_commit_lsn:
                text.append(f"(commit_lsn > {int(w.low_lsn)} AND "
                            f"commit_lsn <= {int(bronze_commit_lsn)})")
            if w.in_progress:
                xids = sorted(int(x) for x in w.in_progress)
                text.append(f"(commit_lsn <= {int(w.low_lsn)} AND "
                            f"xid IN ({', '.join(map(str, xids))}))")
        if text:
            found = self.bronze.rows_where(
                f"({' OR '.join(text)}) AND action IN ('I', 'U', 'D')",
                ["commit_lsn", "xid", "action", "data"])
            merge(changed_keys(*(found.column(c).combine_chunks()
                                 for c in ("commit_lsn", "xid", "action", "data")), windows))
        # The rest of the windows: this batch.
        for batch in assembled():
            merge(changed_keys(batch.column("commit_lsn"), batch.column("xid"),
                               batch.column("action"), batch.column("data"), windows))
        return result
