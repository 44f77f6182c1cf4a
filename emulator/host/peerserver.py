"""A listening socket whose connections each get a thread, and whose named peers close() can cut.

Both ends the controller serves work this way: the collector (devices send traces, the
controller sends commands) and the swarm backend's agent hub (one agent per node)."""

from __future__ import annotations

import socket
import threading


class PeerServer:
    """Accepts on ``listener`` until closed; ``_serve(sock, peer)`` runs per connection and
    registers named peers in ``_peers`` (name -> (socket, send lock)) under ``_lock``."""

    thread_name = "peer-server"

    def __init__(self, listener: socket.socket):
        self._listener = listener
        self._peers: dict[str, tuple[socket.socket, threading.Lock]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def start(self):
        threading.Thread(target=self._accept, name=self.thread_name, daemon=True).start()
        return self

    def close(self) -> None:
        """Stop accepting and shut every registered peer's socket (their threads then end)."""
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            peers = list(self._peers.values())
        for sock, _ in peers:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock, peer), name=f"{self.thread_name}-conn", daemon=True).start()

    def _serve(self, sock: socket.socket, peer) -> None:
        raise NotImplementedError
