"""Taking out a table feature deltalake 1.6 added by mistake (``core.features.spurious``):
``variantType`` in the protocol of a table without a variant column, which lakecdc's
maintenance left on tables with ``timestamp_ntz`` columns (a mirror of a table with a
``timestamp`` column, its tail) until it stopped setting their properties with delta-rs.

Neither engine drops that feature. delta-rs 1.6 writes a protocol only to add to it, or to
restore one; delta-spark 4.4 refuses ``ALTER TABLE ... DROP FEATURE variantType``
(``DELTA_FEATURE_DROP_NONREMOVABLE_FEATURE``). So the repair is two delta-rs RESTOREs, each
one commit (``lakecdc.operation`` ``REPAIR_OPERATION``):

1. to ``T``, the newest version whose protocol lacks the feature, the protocol downgrade
   allowed: ``T``'s protocol and metadata;
2. to the version the repair started from, without the downgrade: that version's metadata
   (the properties delta-rs set when it added the feature), with the features of the
   protocol now in effect, ``T``'s.

It is done only where it is exact, else nothing is done and ``UserError`` says why: ``T``'s
live files are the table's (neither RESTORE adds or removes a file: every reader at every
version sees the same rows), its schema and partitioning are the table's, and its protocol
differs from the table's only by what SET TBLPROPERTIES adds (``SET_PROPERTIES_ADDS``). App
transactions are not in a RESTORE: each writer's recorded version stays. Killed between the
two, the table is ``T``'s: the same rows, a protocol lakecdc reads, the properties it had
before (maintenance's note then says how to set the log retention).

The caller is the table's writer, or holds its lock (``core.maintenance.maintain_table``): no
commit of lakecdc's lands between the versions compared and the RESTOREs.
"""

from __future__ import annotations

from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError

from core.errors import UserError
from core.features import SET_PROPERTIES_ADDS, spurious, unreadable

REPAIR_OPERATION = "repair protocol"        # ``lakecdc.operation`` of the two RESTOREs


def repair_protocol(table: DeltaTable, uri: str,
                    storage_options: dict | None = None) -> str | None:
    """Take ``core.features.spurious``'s features out of ``table``'s protocol (the table at
    ``uri``), as the module's text says; returns the maintenance report's note, None when
    there was nothing to take out. ``UserError`` where the repair would not be exact."""
    found = spurious(table)
    if not found:
        return None
    newest = table.version()
    before = _before(table, uri, storage_options, found[0])
    problem = _inexact(before, table)
    if problem:
        raise UserError(
            f"the Delta table at {uri} lists the table feature {found[0]} that deltalake 1.6 "
            f"added to it, but lakecdc cannot take it out exactly: {problem}; nothing was "
            "changed (docs/operations.md, \"Table features delta-rs added\").")
    assert before is not None
    commit = CommitProperties(custom_metadata={"lakecdc.operation": REPAIR_OPERATION})
    table.restore(before.version(), protocol_downgrade_allowed=True, commit_properties=commit)
    table.update_incremental()
    table.restore(newest, commit_properties=commit)
    table.update_incremental()
    return f"{', '.join(found)} taken out of its protocol (as at version {before.version()})"


def _features(table: DeltaTable) -> tuple[set[str], set[str]]:
    protocol = table.protocol()
    return set(protocol.reader_features or ()), set(protocol.writer_features or ())


def _before(table: DeltaTable, uri: str, storage_options: dict | None,
            feature: str) -> DeltaTable | None:
    """The table at the newest version whose protocol lacks ``feature`` (present at the
    newest), found by bisection over the versions its log holds; None: no logged version
    lacks it, or one could not be read. Once added, delta-rs never took the feature out."""
    logged = [c["version"] for c in table.history() if "version" in c]
    low, high = min(logged), table.version()
    lacking = _at(uri, storage_options, low)
    if lacking is None or feature in _features(lacking)[0]:
        return None
    while high - low > 1:
        middle = (low + high) // 2
        at = _at(uri, storage_options, middle)
        if at is None:
            return None
        if feature in _features(at)[0]:
            high = middle
        else:
            low, lacking = middle, at
    return lacking


def _at(uri: str, storage_options: dict | None, version: int) -> DeltaTable | None:
    try:
        return DeltaTable(uri, version=version, storage_options=storage_options)
    except DeltaError:          # its entry was cleaned from the log
        return None


def _inexact(before: DeltaTable | None, table: DeltaTable) -> str | None:
    """Why restoring ``before``'s protocol would change more than the protocol, or None."""
    if before is None:
        return "its log no longer holds a version from before it was added"
    later = f"since version {before.version()}"
    if set(_paths(before)) != set(_paths(table)):
        return f"rows were written to it {later}"
    if (before.schema().to_json() != table.schema().to_json()
            or before.metadata().partition_columns != table.metadata().partition_columns):
        return f"its columns changed {later}"
    (old_readers, old_writers), (readers, writers) = _features(before), _features(table)
    old, new = before.protocol(), table.protocol()
    if (unreadable(before) or not old_readers <= readers or not old_writers <= writers
            or not (readers - old_readers) | (writers - old_writers) <= SET_PROPERTIES_ADDS
            or (old.min_reader_version, old.min_writer_version)
            != (new.min_reader_version, new.min_writer_version)):
        return f"its protocol changed otherwise {later}"
    return None


def _paths(table: DeltaTable) -> list[str]:
    return table.get_add_actions(flatten=True).column("path").to_pylist()
