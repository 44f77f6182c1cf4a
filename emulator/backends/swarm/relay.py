"""Sockets in another network namespace, and the relay that carries the devices' trace
connections from the run's overlay (the anchor's namespace) to the collector on the
controller's loopback: the overlay stays internal, and devices on any node reach the controller."""

from __future__ import annotations

import selectors
import socket
import threading

from emulator.host import links
from emulator.backends.base import BackendUnavailable

RELAY_BUFFER = 1 << 20


def listen_in_netns(netns_path: str, address: tuple[str, int]) -> socket.socket:
    """A listening TCP socket created inside the network namespace at ``netns_path`` (a short
    thread enters it; the socket stays there, usable from any thread)."""
    try:
        return links.in_netns(netns_path, lambda: socket.create_server(address, backlog=1024))
    except links.LinkError as exc:
        raise BackendUnavailable(str(exc)) from exc


class Relay:
    """Carries every connection accepted on ``listener`` to ``target`` and back, on one thread.

    The devices' trace connections arrive in the anchor's namespace (on the overlay); the
    collector listens on the controller's loopback. Each direction keeps at most
    ``RELAY_BUFFER`` bytes in flight; an end's EOF is passed on once its data is through."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]):
        self.listener = listener
        self.target = target
        self.connections = 0
        self._selector = selectors.DefaultSelector()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"relay-{target[1]}", daemon=True)

    def start(self) -> "Relay":
        self.listener.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            try:
                key.fileobj.close()
            except OSError:
                pass
        self._selector.close()

    def _loop(self) -> None:
        while not self._closed.is_set():
            for key, mask in self._selector.select(timeout=0.5):
                if key.data is None:
                    self._accept()
                    continue
                end: _End = key.data
                try:
                    if mask & selectors.EVENT_WRITE:
                        self._write(end)
                    if mask & selectors.EVENT_READ and not end.closed:
                        self._read(end)
                except OSError:
                    self._close(end)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            conn.close()
            return
        self.connections += 1
        a, b = _End(conn), _End(upstream)
        a.peer, b.peer = b, a
        for end in (a, b):
            end.sock.setblocking(False)
            self._update(end)

    def _read(self, end: "_End") -> None:
        try:
            data = end.sock.recv(65536)
        except BlockingIOError:
            return
        if data:
            end.peer.pending += data
            self._write(end.peer)
        else:
            end.eof = True
            self._write(end.peer)  # passes the EOF on once the peer's backlog is through
        self._update(end)

    def _write(self, end: "_End") -> None:
        if end.pending:
            try:
                del end.pending[:end.sock.send(end.pending)]
            except BlockingIOError:
                pass
        if not end.pending and end.peer.eof and not end.write_shut:
            end.write_shut = True
            end.sock.shutdown(socket.SHUT_WR)
        self._update(end)
        self._update(end.peer)

    def _update(self, end: "_End") -> None:
        """Read while the peer's backlog is small, write while ours is not empty, close when done."""
        if end.closed:
            return
        if end.eof and end.peer.eof and not end.pending and not end.peer.pending:
            self._close(end)
            return
        events = 0
        if not end.eof and len(end.peer.pending) < RELAY_BUFFER:
            events |= selectors.EVENT_READ
        if end.pending:
            events |= selectors.EVENT_WRITE
        if events == end.events:
            return
        if not end.events:
            self._selector.register(end.sock, events, end)
        elif not events:
            self._selector.unregister(end.sock)
        else:
            self._selector.modify(end.sock, events, end)
        end.events = events

    def _close(self, end: "_End") -> None:
        for side in (end, end.peer):
            if side.closed:
                continue
            side.closed = True
            if side.events:
                self._selector.unregister(side.sock)
                side.events = 0
            side.sock.close()


class _End:
    """One socket of a relayed connection; ``pending`` is what waits to be written to it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.peer: _End | None = None
        self.pending = bytearray()
        self.events = 0
        self.eof = False
        self.write_shut = False
        self.closed = False
