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

_lock = threading.Lock()
_target: threading.Event | None = None       # what the next signal sets
_write_fd: int | None = None                 # the pipe's end the handler writes to


def stop_on_signals() -> threading.Event:
    """A new event the next SIGTERM or SIGINT sets (from the main thread only; elsewhere,
    an event nothing but the caller sets). One pipe and one watcher thread serve the whole
    process, however many commands run in it."""
    global _target, _write_fd
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return stop
    with _lock:
        _target = stop
        if _write_fd is None:
            read_fd, _write_fd = os.pipe()
            os.set_blocking(_write_fd, False)
            threading.Thread(target=_watch, args=(read_fd,), name="lakecdc-stop-signal",
                             daemon=True).start()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _handler)
    return stop


def _handler(signum, frame) -> None:
    try:
        os.write(_write_fd, b"\0")
    except BlockingIOError:
        pass                              # the pipe is full: the watcher has bytes to read


def _watch(read_fd: int) -> None:
    while os.read(read_fd, 1):
        with _lock:
            target = _target
        target.set()
