"""The captured set's store (``bronze.capture_list``, a real Delta table through delta-rs) and
``lakecdc tables``' listing (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bronze.capture_list import (
    CAPTURED,
    REMOVED,
    SNAPSHOTTING,
    CaptureList,
    ShipperSet,
)
from pipelines.setup.capture import TableLine, render_tables

COUNTED = ("public.notifications", "public.notification_history")


def test_each_write_is_a_new_version_of_the_whole_set_in_order(tmp_path):
    store = CaptureList(str(tmp_path))
    assert store.read() is None
    first = store.write({t: CAPTURED for t in COUNTED}, None)
    second = store.write({**{t: CAPTURED for t in COUNTED}, "public.services": SNAPSHOTTING},
                         first)
    assert second.version == first.version + 1
    assert second.active == (*COUNTED, "public.services")
    assert second.since(COUNTED[0]) == first.since(COUNTED[0])       # unchanged: kept
    third = store.write({**{t: CAPTURED for t in COUNTED}, "public.services": REMOVED}, second)
    assert third.active == COUNTED
    assert third.known == (*COUNTED, "public.services")
    assert third.since("public.services") >= second.since("public.services")
    assert CaptureList(str(tmp_path)).read() == third                # what another process reads


def test_the_shipper_acknowledges_a_version_once_and_falls_back_without_a_store(tmp_path):
    shipper = ShipperSet(str(tmp_path), "lakecdc", COUNTED)
    shipper.start(acked=None)
    assert shipper.tables == COUNTED and shipper.ack() == {}        # no store: LAKECDC_TABLES
    store = CaptureList(str(tmp_path))
    stored = store.write({t: CAPTURED for t in (*COUNTED, "public.services")}, None)
    shipper.start(acked=None)
    assert shipper.tables == (*COUNTED, "public.services")
    assert shipper.ack() == {"lakecdc:captured": stored.version}
    shipper.committed(shipper.ack())
    assert shipper.ack() == {}
    shipper.committed({})                                           # a commit without one
    assert shipper.acked == stored.version


def test_the_listing_shows_state_age_and_the_mirror():
    now = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
    text = render_tables([
        TableLine("public.services", CAPTURED, now - timedelta(seconds=90), 1234,
                  now - timedelta(seconds=3), now - timedelta(seconds=4),
                  (0x1A2B3C, now - timedelta(seconds=2))),
        TableLine("public.templates", SNAPSHOTTING, now - timedelta(seconds=5)),
    ], now)
    lines = text.splitlines()
    assert lines[0].split() == ["table", "state", "since", "mirror", "rows", "mirror",
                                "updated", "newest", "change", "complete", "as", "of"]
    assert "public.services" in lines[1] and "1,234" in lines[1] and "(3s ago)" in lines[1]
    assert lines[1].endswith("0/1A2B3C 2026-11-26 11:59:58Z (2s ago)")
    assert "2026-11-26 11:58:30Z (90s ago)" in lines[1]
    assert lines[2].split()[:2] == ["public.templates", "snapshotting"]
    assert lines[2].rstrip().endswith("-")
