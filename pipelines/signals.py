"""How a command stops: SIGTERM and Ctrl-C set an event its loops check between batches.

The signal handler does not set the event itself. Python runs a handler in the main
thread, between two bytecodes, and that thread may then be inside ``stop.wait()`` holding
the event's own lock: ``Event.set()`` in the handler would wait for that lock forever, and
the process would ignore every later SIGTERM (a shipper hung on stop this way). So the
handler only writes a byte to a pipe, which takes no lock, and a watcher thread sets the
event.
"""

from __future__ import annotations

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set (from the main thread only; elsewhere, an event
    nothing but the caller sets)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return stop
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum, frame):
        try:
            os.write(write_fd, b"\0")
        except BlockingIOError:
            pass                          # the pipe is full: the watcher has bytes to read

    def watch():
        os.read(read_fd, 1)
        stop.set()

    threading.Thread(target=watch, name="lakecdc-stop-signal", daemon=True).start()
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    return stop
