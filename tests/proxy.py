"""A small TCP proxy for network-fault tests: put it between a client and Postgres, then cut.

- ``cut()``: every open connection is reset at once (both sides, RST) and new connections
  are reset as soon as they are accepted, until ``restore()``. The client sees what a
  network failure looks like ("server closed the connection unexpectedly", "connection
  reset"); the server sees its client vanish.
- ``cut_on(marker, nth, forward_reply_bytes)``: a deterministic cut in the middle of a
  statement. When the ``nth`` client→server chunk containing ``marker`` (e.g. the text
  ``pg_replication_slot_advance``) passes, the proxy either drops it and cuts
  (``forward_reply_bytes=None``: the server never runs it), or forwards it and cuts once the
  server's reply has started - after forwarding that many reply bytes to the client (0: the
  server ran the statement, the client never learns its result; 20_000: the client received
  part of a result stream, e.g. mid-peek). ``fired`` says what happened; a reply shorter
  than requested shows as "reply ended before the cut", so a test can tell its cut missed.

Postgres flushes a reply only when a statement has finished (or a result is streamed), so
"the reply has started" means "the server has executed it". Plain TCP only: the test
server runs without SSL, so statements are visible on the wire.
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass


@dataclass
class _Trigger:
    marker: bytes
    nth: int
    forward_reply_bytes: int | None
    seen: int = 0


class _Conn:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.armed_reply: int | None = None     # cut after this many more reply bytes
        self.lock = threading.Lock()

    def reset(self) -> None:
        for sock in (self.client, self.server):
            _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Abort the connection with a RST. ``shutdown(SHUT_RD)`` first wakes the pump thread
    blocked in ``recv`` on it: a plain ``close`` would neither wake it nor send anything
    while that call still holds the socket."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._conns: set[_Conn] = set()
        self._lock = threading.Lock()
        self._is_cut = False
        self._trigger: _Trigger | None = None
        self._closed = False
        self.accepted = 0
        self.refused = 0         # connections reset because the proxy was cut
        self.cuts = 0
        self.cut_event = threading.Event()
        # What the trigger did: "statement dropped", "cut inside the reply" (after the
        # requested reply bytes), or "reply ended before the cut" (the reply was shorter).
        self.fired: str | None = None
        self._thread = threading.Thread(target=self._accept_loop, name="proxy-accept",
                                        daemon=True)
        self._thread.start()

    def dsn(self, dsn: str) -> str:
        """``dsn`` (postgresql://user@127.0.0.1:PORT/db) pointed at the proxy."""
        head, _, tail = dsn.partition("@")
        hostport, _, db = tail.partition("/")
        host = hostport.rsplit(":", 1)[0]
        return f"{head}@{host}:{self.port}/{db}"

    # --- control ------------------------------------------------------------------------

    def cut(self) -> None:
        with self._lock:
            self._is_cut = True
            self.cuts += 1
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            conn.reset()
        self.cut_event.set()

    def restore(self) -> None:
        with self._lock:
            self._is_cut = False
            self.cut_event.clear()

    @property
    def is_cut(self) -> bool:
        return self._is_cut

    def cut_on(self, marker: bytes, nth: int = 1, forward_reply_bytes: int | None = None
               ) -> None:
        with self._lock:
            self._trigger = _Trigger(marker, nth, forward_reply_bytes)

    def close(self) -> None:
        self._closed = True
        _reset(self._listener)
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            conn.reset()

    # --- forwarding -----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._is_cut
                if cut:
                    self.refused += 1
            if cut:
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            conn = _Conn(client, server)
            with self._lock:
                self._conns.add(conn)
                self.accepted += 1
            threading.Thread(target=self._pump_up, args=(conn,), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(conn,), daemon=True).start()

    def _pump_up(self, conn: _Conn) -> None:
        """client → server, watching for the trigger's marker."""
        tail = b""
        while True:
            try:
                data = conn.client.recv(65536)
            except OSError:
                break
            if not data:
                break
            with conn.lock:
                missed = conn.armed_reply is not None
                conn.armed_reply = None
            if missed:
                # The client speaks again: the armed reply ended before enough bytes. Cut
                # anyway, so the test goes on and can say its cut missed.
                self.fired = "reply ended before the cut"
                self.cut()
                return
            action, reply_bytes = self._match(tail, data)
            tail = (tail + data)[-64:]
            if action == "drop":
                self.fired = "statement dropped"
                self.cut()
                return
            if action == "arm":
                with conn.lock:
                    conn.armed_reply = reply_bytes
            try:
                conn.server.sendall(data)
            except OSError:
                break
        self._drop(conn)

    def _pump_down(self, conn: _Conn) -> None:
        """server → client, cutting once an armed reply has passed far enough."""
        while True:
            try:
                data = conn.server.recv(65536)
            except OSError:
                break
            if not data:
                break
            with conn.lock:
                armed = conn.armed_reply
            if armed is not None:
                if len(data) >= armed:
                    try:
                        conn.client.sendall(data[:armed])
                    except OSError:
                        pass
                    self.fired = "cut inside the reply"
                    self.cut()
                    return
                with conn.lock:
                    conn.armed_reply = armed - len(data)
            try:
                conn.client.sendall(data)
            except OSError:
                break
        self._drop(conn)

    def _match(self, tail: bytes, data: bytes) -> tuple[str | None, int | None]:
        """Does ``data`` (after ``tail``, the end of the previous chunk, so a marker split
        across two reads is found once) complete the trigger's marker?"""
        with self._lock:
            trig = self._trigger
            if trig is None:
                return None, None
            joined = tail + data
            if joined.find(trig.marker, max(0, len(tail) - len(trig.marker) + 1)) < 0:
                return None, None
            trig.seen += 1
            if trig.seen != trig.nth:
                return None, None
            self._trigger = None
        return ("drop", None) if trig.forward_reply_bytes is None else \
            ("arm", trig.forward_reply_bytes)

    def _drop(self, conn: _Conn) -> None:
        """One side closed normally: close the other side too."""
        with self._lock:
            self._conns.discard(conn)
        for sock in (conn.client, conn.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
