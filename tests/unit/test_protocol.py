"""The protocol of lakecdc's tables under maintenance, on real delta-rs tables: deltalake
1.6.6's ``alter.set_table_properties`` adds ``variantType`` (readers and writers),
``appendOnly`` and ``invariants`` to the protocol of a table at reader version 3, such as
one with a ``timestamp_ntz`` column (a mirror of a table with a ``timestamp`` column).
Maintenance must never do that, and a table it did that to before is repaired."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from core.errors import UserError
from core.features import READER_FEATURES, WRITER_FEATURES, open_table, unreadable
from core.maintenance import clean_log, log_properties, maintain_table

# A mirror's kinds of columns: timestamp without and with time zone, numeric, text (an
# enum's mirror column), and lakecdc's bookkeeping.
ROWS = pa.table({
    "id": pa.array([1, 2], pa.int64()),
    "sent_at": pa.array([1_700_000_000_000_000, None], pa.timestamp("us")),
    "read_at": pa.array([None, 1_700_000_000_000_000], pa.timestamp("us", tz="UTC")),
    "amount": pa.array([Decimal("1.50"), Decimal("-2.25")], pa.decimal128(12, 2)),
    "status": pa.array(["sent", "read"]),
    "_lakecdc_commit_lsn": pa.array([10, 11], pa.int64())})


def features(path: str) -> tuple[set[str], set[str]]:
    protocol = DeltaTable(path).protocol()
    return set(protocol.reader_features or ()), set(protocol.writer_features or ())


def test_maintenance_of_a_table_with_timestamp_ntz_columns_adds_no_table_feature(tmp_path):
    """The log cleaning the writers run every 30 s, then a whole maintenance: the protocol
    stays as the table was created, inside lakecdc's sets, and the table stays readable."""
    path = str(tmp_path / "mirror")
    write_deltalake(path, ROWS)
    created = features(path)
    assert created == ({"timestampNtz"}, {"timestampNtz"})
    clean_log(path, log_retention_minutes=10)
    maintain_table("mirror", path, retention_hours=24, log_retention_minutes=10)
    readers, writers = features(path)
    assert readers <= READER_FEATURES and writers <= WRITER_FEATURES, (readers, writers)
    assert (readers, writers) == created
    assert unreadable(DeltaTable(path)) == []
    assert DeltaTable(path).to_pyarrow_table().sort_by("id").equals(ROWS)


def test_a_mirror_is_created_with_its_log_retention_and_maintenance_commits_nothing_to_it(
        tmp_path):
    """A mirror of a table with a ``timestamp`` column, made as ``setup`` and ``tables add``
    make it with delta-rs: at reader version 3, with maintenance's log properties from the
    start, so neither the log cleaning nor maintenance commits to it (it was their commit
    that rewrote the protocol)."""
    from pipelines.setup.mirror_loader import MirrorTarget
    from silver.mirrors.mirror_table import TableSpec

    path = str(tmp_path / "mirror")
    spec = TableSpec("public", "events", (("id", "bigint"),
                                          ("at", "timestamp without time zone"),
                                          ("seen", "timestamp with time zone"),
                                          ("amount", "numeric(12,2)")), ("id",))
    MirrorTarget(path, spec, log_retention_minutes=7).ensure()
    created = DeltaTable(path)
    assert created.protocol().min_reader_version == 3 and features(path) == (
        {"timestampNtz"}, {"timestampNtz"})
    assert {k: v for k, v in created.metadata().configuration.items()
            if k.startswith(("delta.log", "delta.deleted", "delta.enableExpired"))} == {
        "delta.logRetentionDuration": "interval 7 minutes",
        "delta.deletedFileRetentionDuration": "interval 7 minutes",
        "delta.enableExpiredLogCleanup": "false"}
    clean_log(path, log_retention_minutes=7)
    report = maintain_table("mirror", path, retention_hours=24, log_retention_minutes=7)
    assert DeltaTable(path).version() == created.version() and report.notes == []
    # At another retention than it was created with, it keeps its own and says how to set
    # the other: with Spark, whose SET TBLPROPERTIES leaves the protocol alone.
    report = maintain_table("mirror", path, retention_hours=24, log_retention_minutes=9)
    assert DeltaTable(path).version() == created.version()
    assert report.notes == [
        "log retention not set: deltalake 1.6 would add table features to this table's "
        "protocol (reader version 3: timestamp_ntz columns); set it with Spark: ALTER TABLE "
        f"delta.`{path}` SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 9 "
        "minutes', 'delta.deletedFileRetentionDuration' = 'interval 9 minutes', "
        "'delta.enableExpiredLogCleanup' = 'false')"]


def damaged(path: str) -> int:
    """A table as lakecdc's maintenance left one before: rows with an app transaction,
    then the log properties set through delta-rs (what added ``variantType``); returns the
    version before that commit."""
    from deltalake import CommitProperties, Transaction

    write_deltalake(path, ROWS, commit_properties=CommitProperties(
        app_transactions=[Transaction("lakecdc-mirror", 41)]))
    write_deltalake(path, ROWS.slice(0, 1), mode="append")
    before = DeltaTable(path).version()
    DeltaTable(path).alter.set_table_properties(log_properties(10))
    assert "variantType" in features(path)[0]
    return before


def test_a_table_delta_rs_gave_variant_type_is_refused_until_maintenance_takes_it_out(
        tmp_path):
    """Refused with the command that repairs it; ``maintain_table`` (``lakecdc maintain
    --once``) restores the protocol as it was before, keeps the properties set then, the
    rows and the writer's app transaction, and the table is lakecdc's again."""
    path = str(tmp_path / "mirror")
    before = damaged(path)
    rows = DeltaTable(path).to_pyarrow_table().sort_by("id")
    for attempt in (lambda: open_table(path), lambda: clean_log(path)):
        with pytest.raises(UserError) as refused:
            attempt()
        sentence = str(refused.value)
        assert path in sentence and "variantType" in sentence and "\n" not in sentence
        assert "run `lakecdc maintain --once`, which takes it out again" in sentence

    report = maintain_table("mirror", path, retention_hours=24, log_retention_minutes=10)
    assert report.notes[0] == f"variantType taken out of its protocol (as at version {before})"
    table = open_table(path)
    assert features(path) == ({"timestampNtz"}, {"timestampNtz"}) and unreadable(table) == []
    assert table.metadata().configuration == log_properties(10)
    assert table.to_pyarrow_table().sort_by("id").equals(rows)
    assert table.transaction_version("lakecdc-mirror") == 41
    operations = [c["operation"] for c in reversed(table.history())]     # oldest first
    assert operations[before + 1:before + 4] == ["SET TBLPROPERTIES", "RESTORE", "RESTORE"]
    again = maintain_table("mirror", path, retention_hours=24, log_retention_minutes=10)
    assert not any("taken out" in n for n in again.notes)


def test_a_table_written_to_after_delta_rs_gave_it_variant_type_is_left_as_it_is(tmp_path):
    """Rows written after the protocol changed: RESTORE would remove them, so maintenance
    changes nothing and says why in one sentence; a variant column is no repair's either."""
    path = str(tmp_path / "mirror")
    before = damaged(path)
    write_deltalake(path, ROWS.slice(1, 1), mode="append")
    version = DeltaTable(path).version()
    with pytest.raises(UserError) as refused:
        maintain_table("mirror", path, retention_hours=24)
    sentence = str(refused.value)
    assert f"rows were written to it since version {before}" in sentence
    assert "nothing was changed" in sentence and "\n" not in sentence
    assert DeltaTable(path).version() == version and "variantType" in features(path)[0]
