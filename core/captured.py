"""What lakecdc captures and counts: the counted tables, the dimension columns of
``service_stats`` and the replica identity that brings their old values into the WAL.

Old dims reach the WAL only through the replica identity. An UPDATE that changes a dim or a
DELETE must carry the old dims, so the identity index covers ``id`` plus the four dims.
"""

from __future__ import annotations

from dataclasses import dataclass

# The prefix of verify's count-neutral marker transactions (``pipelines.source.consistent``): they
# travel through every layer, so the shipper asks wal2json for them.
MARKER_PREFIX = "lakecdc.marker"

DIMS = ("service_id", "template_id", "notification_type", "notification_status")
IDENTITY_COLUMNS = ("id", *DIMS)


def identity_index_name(table: str) -> str:
    """Name of the unique index setup creates for ``schema.table``'s replica identity."""
    return f"{table.split('.', 1)[1]}_lakecdc_identity"


@dataclass(frozen=True)
class CountedTables:
    """The two tables whose rows service_stats counts, as (schema, table): ``live`` (a
    DELETE is -1) and ``history`` (a DELETE is a retention purge, 0). Configured by
    ``LAKECDC_NOTIFICATIONS_TABLE`` / ``LAKECDC_HISTORY_TABLE`` (``Config.counted``)."""

    live: tuple[str, str] = ("public", "notifications")
    history: tuple[str, str] = ("public", "notification_history")

    @classmethod
    def from_names(cls, live: str, history: str) -> "CountedTables":
        return cls(tuple(live.split(".", 1)), tuple(history.split(".", 1)))

    def name(self, which: str) -> str:
        return ".".join(getattr(self, which))

    @property
    def names(self) -> tuple[str, str]:
        """Both, schema-qualified (``schema.table``)."""
        return (self.name("live"), self.name("history"))

    @property
    def both(self) -> tuple[tuple[str, str], tuple[str, str]]:
        return (self.live, self.history)


COUNTED = CountedTables()           # the defaults, for tests and the demo's own schema
