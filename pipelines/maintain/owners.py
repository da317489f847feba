"""Which tables lakecdc keeps small, grouped by the writer that maintains them.

Each table is maintained by the process and thread that write it, between two of its own
commits, so maintenance never races a writer (F26):

- ``ship``: bronze, by the shipper; the one stream reads bronze, so its vacuum waits for
  the stream's checkpoint (``reader``), and its log, which nothing else reads, is kept
  ``BRONZE_LOG_RETENTION_MINUTES`` past what that stream needs;
- ``stream``: ``silver/changes``, ``silver/quarantine``, ``gold/service_stats``,
  ``gold/_pending`` and ``gold/_deltas``, by the stream's batch (gold's fold, which runs
  beside the batches, waits for it: ``GoldBatchWriter.paused``); the mirrors' query reads
  ``silver/changes``;
- ``mirrors``: each mirror and the markers verify reads, by the mirrors' batch.

What each keeps: the tables others read (silver, quarantine, gold, each mirror) their reader
group's retention (``Config.kept_minutes``: a day by default); lakecdc's own
(``_pending``, ``_deltas``, the mirrors' tails and markers) ``log_retention_minutes``.

The backfill's staging table is kept by the backfill run that writes it
(``bronze.snapshot_backfill``). Tables written once or rarely (the captured set, setup's
baselines) stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import BRONZE_LOG_RETENTION_MINUTES, Config
from core.layout import (
    BRONZE,
    GOLD,
    GOLD_DELTAS,
    GOLD_PENDING,
    MIRROR_CHECKPOINT,
    MIRROR_MARKERS,
    QUARANTINE,
    SILVER,
    STREAM_CHECKPOINT,
    mirror_path,
)
from silver.mirrors.tail import tail_path

GROUPS = ("ship", "stream", "mirrors")


@dataclass(frozen=True)
class Maintained:
    name: str                      # as status shows it: bronze, silver, gold, mirror …
    uri: str
    log_retention_minutes: int
    reader: str | None = None      # the checkpoint of a stream that may read the table


def tables_of(config: Config, group: str, mirrored: tuple[str, ...] = ()
              ) -> list[Maintained]:
    """The tables ``group``'s writer keeps; ``mirrored``: the mirrors it writes."""
    path = config.table_path
    log = config.log_retention_minutes
    if group == "ship":
        return [Maintained("bronze", path(BRONZE), min(log, BRONZE_LOG_RETENTION_MINUTES),
                           reader=path(STREAM_CHECKPOINT))]
    if group == "stream":
        # The mirrors' query reads silver wherever its checkpoint is, whatever this
        # process's configuration says of mirrors (``stream_position``: none, no reader).
        silver = config.kept_minutes("silver")
        return [Maintained("silver", path(SILVER), silver, reader=path(MIRROR_CHECKPOINT)),
                Maintained("quarantine", path(QUARANTINE), silver),
                Maintained("gold", path(GOLD), config.kept_minutes("gold")),
                Maintained("gold_pending", path(GOLD_PENDING), log),
                Maintained("gold_deltas", path(GOLD_DELTAS), log)]
    if group == "mirrors":
        kept = config.kept_minutes("mirrors")
        return [*[Maintained(f"mirror {t}", mirror_path(config.lakehouse, t), kept)
                  for t in mirrored],
                *[Maintained(f"mirror tail {t}", tail_path(mirror_path(config.lakehouse, t)),
                             log) for t in mirrored],
                Maintained("mirror markers", path(MIRROR_MARKERS), log)]
    raise ValueError(f"unknown maintenance group {group!r}")
