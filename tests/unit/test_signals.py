"""``pipelines.run.signals``: a SIGTERM always stops a command, whatever its main thread was doing.

The handler runs in the main thread between two bytecodes. The child below takes the stop
event's own lock (as ``stop.wait()`` holds it for a moment on every poll) and signals
itself while holding it: a handler that calls ``Event.set()`` there waits for that lock
forever, so the child never prints ``stopped``. This is the negative control of the pipe
and watcher thread; it hangs with ``stop.set()`` in the handler.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.tests_support import ROOT

CHILD = textwrap.dedent("""
    import os, signal
    from pipelines.run.signals import stop_on_signals

    stop = stop_on_signals()
    with stop._cond:                      # the lock stop.wait() holds between polls
        os.kill(os.getpid(), signal.{name})
        for _ in range(1000):             # bytecodes: the handler runs here
            pass
    print("stopped" if stop.wait(20) else "not stopped", flush=True)
""")


def run_child(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD.format(name=name)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_a_sigterm_inside_the_stop_events_lock_still_stops():
    done = run_child("SIGTERM")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_ctrl_c_stops_the_same_way():
    done = run_child("SIGINT")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_each_command_in_one_process_gets_the_next_signal_through_one_watcher():
    """Tests run commands in their own process: one pipe and one thread serve them all."""
    code = textwrap.dedent("""
        import os, signal, threading
        from pipelines.run.signals import stop_on_signals

        first, second = stop_on_signals(), stop_on_signals()
        watchers = [t for t in threading.enumerate() if t.name == "lakecdc-stop-signal"]
        os.kill(os.getpid(), signal.SIGTERM)
        print(len(watchers), second.wait(20), first.is_set(), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True", "False"]
