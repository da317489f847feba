"""What lakecdc captures and counts: the dimension columns of ``service_stats`` and the
replica identity that brings their old values into the WAL.

Old dims reach the WAL only through the replica identity. An UPDATE that changes a dim or a
DELETE must carry the old dims, so the identity index covers ``id`` plus the four dims.
"""

DIMS = ("service_id", "template_id", "notification_type", "notification_status")
IDENTITY_COLUMNS = ("id", *DIMS)


def identity_index_name(table: str) -> str:
    """Name of the unique index setup creates for ``schema.table``'s replica identity."""
    return f"{table.split('.', 1)[1]}_lakecdc_identity"
