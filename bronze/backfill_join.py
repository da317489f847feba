"""The end of a shipper batch's writes (``bronze.ship``'s ``ship_batch``): its rows held back
are written, and the read rows of the backfill chunks announced in it join their HIGH
watermark's transaction, in the same commit (``bronze.snapshot_backfill``)."""

from __future__ import annotations

import logging

from bronze.backfill_emitter import BackfillEmitter, Emission
from bronze.batch_rows import BatchRows
from bronze.records import PeekSummary

log = logging.getLogger("lakecdc.ship")


def join_backfill(backfill: BackfillEmitter, rows: BatchRows, summary: PeekSummary,
                  after_lsn: int, metadata: dict) -> tuple[Emission | None, int]:
    """Write the batch's last rows and the read rows of its staged chunks to its data files,
    and add what the commit records of the chunks to ``metadata``. ``after_lsn``: the newest
    source commit bronze held before the batch. Returns the chunks' rows (None: none) and how
    many logical messages were skipped as not lakecdc's."""
    marks, skipped = backfill.staged_marks(rows.marks)
    # The plan grows the HIGH's tx_changes before the rows are written.
    emission = (backfill.plan(marks, after_lsn, rows.written, summary.tx_changes,
                              rows.config.slot, rows.shipped_at) if marks else None)
    rows.finish(summary.tx_changes)
    if rows.rejected_marks:
        log.warning("skipped %d logical messages under lakecdc's prefix that are not "
                    "well-formed backfill marks (forged or damaged; see docs/security.md)",
                    rows.rejected_marks)
    skipped += rows.rejected_marks
    if emission is not None:
        for batch in emission.batches:
            rows.files.write(rows.hook(batch))      # as the batch's own rows are written
        metadata.update({"lakecdc.backfill_chunks": ",".join(emission.chunks),
                         "lakecdc.backfill_rows": emission.rows,
                         "lakecdc.backfill_dropped": emission.dropped,
                         "lakecdc.backfill_partial": emission.partial})
    return emission, skipped
