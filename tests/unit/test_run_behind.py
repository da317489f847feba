"""pipelines.run.behind: a batch of the stream or the mirrors is held while the shipper is
behind with the dashboard following it, and released when it is not, when ``stop`` is set,
or after ``hold_s``; holding never skips the batch."""

from __future__ import annotations

import threading
import time

from pipelines.run.behind import ShipperBehind


def held_in_thread(behind: ShipperBehind) -> tuple[threading.Thread, list[float]]:
    waited: list[float] = []
    thread = threading.Thread(target=lambda: waited.append(behind.hold("stream")))
    thread.start()
    return thread, waited


def test_a_batch_goes_at_once_while_the_shipper_is_not_behind():
    behind = ShipperBehind(threading.Event())
    assert behind.hold("stream") == 0.0
    behind.set(True)
    behind.set(False)
    assert behind.hold("stream") == 0.0 and behind.held == 0


def test_a_held_batch_goes_once_the_shipper_has_caught_up_or_on_stop():
    for release in ("caught up", "stop"):
        stop = threading.Event()
        behind = ShipperBehind(stop, hold_s=600)
        behind.set(True)
        thread, waited = held_in_thread(behind)
        if release == "stop":
            stop.set()
        else:
            behind.set(False)
        thread.join(timeout=60)
        assert not thread.is_alive() and len(waited) == 1 and behind.held == 1


def test_a_batch_is_held_at_most_hold_s():
    behind = ShipperBehind(threading.Event(), hold_s=0.1)
    behind.set(True)
    assert behind.hold("mirrors") >= 0.1


def test_holding_runs_every_batch_after_its_hold():
    behind = ShipperBehind(threading.Event(), hold_s=0.05)
    ran = []
    batch = behind.holding("stream", lambda frame, batch_id: ran.append((frame, batch_id)))
    batch("rows", 0)
    behind.set(True)
    batch("more rows", 1)
    assert ran == [("rows", 0), ("more rows", 1)] and behind.held == 1


def test_the_streams_start_waits_for_the_shippers_first_batch_then_while_it_is_behind():
    stop = threading.Event()
    behind = ShipperBehind(stop, hold_s=600)
    shipped = threading.Event()
    waited: list[float] = []
    thread = threading.Thread(target=lambda: waited.append(behind.hold("stream", shipped)))
    thread.start()
    thread.join(timeout=0.2)
    assert thread.is_alive()                    # the first batch is not done
    behind.set(True)                            # a full peek, its step handed on
    shipped.set()
    thread.join(timeout=0.2)
    assert thread.is_alive()                    # the dashboard follows a catch-up
    behind.set(False)
    thread.join(timeout=60)
    assert not thread.is_alive() and waited[0] >= 0.4 and behind.held == 1

    # Not behind after the first batch: the start goes at once; a shipper that failed
    # (stop) or a first batch that takes longer than ``hold_s`` holds it no longer.
    assert ShipperBehind(stop, hold_s=600).hold("stream", shipped) == 0.0
    began = time.monotonic()
    ShipperBehind(threading.Event(), hold_s=0.1).hold("stream", threading.Event())
    assert 0.1 <= time.monotonic() - began < 5
    stop.set()
    began = time.monotonic()
    ShipperBehind(stop, hold_s=600).hold("stream", threading.Event())
    assert time.monotonic() - began < 5
