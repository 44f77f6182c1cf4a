"""The controller's end of the node agents: each agent dials in over the overlay, says hello
(its node, its kernel's features), then answers requests by id (messages of :mod:`.agent`)."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from emulator.host.peerserver import PeerServer
from emulator.backends.swarm import agent as agent_wire

CALL_TIMEOUT_S = 60.0


class AgentError(RuntimeError):
    """An agent did not answer, or could not do what it was asked."""


class AgentHub(PeerServer):
    """Agents dial in (one per node), say hello, then answer requests by id."""

    thread_name = "agent-hub"

    def __init__(self, token: bytes, listener: socket.socket, on_hello=None):
        super().__init__(listener)
        self.token = token
        self.on_hello = on_hello or (lambda node, hello: None)
        self.hellos: dict[str, dict] = {}
        self.ready: dict[str, threading.Event] = {}
        self._pending: dict[int, Future] = {}
        self._ids = iter(range(1, 1 << 62))
        self._pool = ThreadPoolExecutor(16, thread_name_prefix="agent-call")

    def close(self) -> None:
        super().close()
        self._pool.shutdown(wait=False)

    def _serve(self, sock: socket.socket, peer=None) -> None:
        node = None
        try:
            sock.settimeout(30)
            message, _ = agent_wire.recv_message(sock, self.token)
            sock.settimeout(None)
            hello = message.get("hello") or {}
            node = str(hello.get("node", ""))
            if not node or self._closed.is_set():
                return
            with self._lock:
                old = self._peers.get(node)
                self._peers[node] = (sock, threading.Lock())
                self.hellos[node] = hello
                self.ready.setdefault(node, threading.Event()).clear()
            if old is not None:
                old[0].close()
            try:
                self._pool.submit(self._welcome, node, hello)
            except RuntimeError:  # closing
                return
            while True:
                reply, _ = agent_wire.recv_message(sock, self.token)
                with self._lock:
                    future = self._pending.pop(reply.get("id"), None)
                if future is None:
                    continue
                if "error" in reply:
                    future.set_exception(AgentError(f"agent on {self.hostname(node)}: {reply['error']}"))
                else:
                    future.set_result(reply.get("result"))
        except (OSError, agent_wire.protocol.ProtocolError):
            pass
        finally:
            with self._lock:
                if node and self._peers.get(node, (None,))[0] is sock:
                    del self._peers[node]
            sock.close()

    def _welcome(self, node: str, hello: dict) -> None:
        try:
            self.on_hello(node, hello)
            self.ready[node].set()
        except Exception as exc:  # noqa: BLE001 - recorded; wait_for reports it
            hello["welcome_error"] = f"{type(exc).__name__}: {exc}"
            self.ready[node].set()

    def hostname(self, node: str) -> str:
        return (self.hellos.get(node) or {}).get("hostname") or node

    def request(self, node: str, op: str, payload: bytes = b"", **args) -> Future:
        future: Future = Future()
        with self._lock:
            peer = self._peers.get(node)
            request_id = next(self._ids)
            if peer is not None:
                self._pending[request_id] = future
        if peer is None:
            future.set_exception(AgentError(f"no agent connected for node {self.hostname(node)}"))
            return future
        sock, lock = peer
        try:
            with lock:
                agent_wire.send_message(sock, self.token, {"id": request_id, "op": op, "args": args}, payload)
        except OSError as exc:
            with self._lock:
                self._pending.pop(request_id, None)
            future.set_exception(AgentError(f"agent on {self.hostname(node)}: {exc}"))
        return future

    def call(self, node: str, op: str, payload: bytes = b"", timeout: float = CALL_TIMEOUT_S, **args):
        future = self.request(node, op, payload, **args)
        try:
            return future.result(timeout)
        except TimeoutError:
            raise AgentError(f"agent on {self.hostname(node)}: no answer to {op} in {timeout:g}s") from None

    def wait_for(self, nodes: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for node in nodes:
            with self._lock:
                event = self.ready.setdefault(node, threading.Event())
            if not event.wait(max(0.0, deadline - time.monotonic())):
                raise AgentError(f"no agent from node {node} after {timeout:g}s")
            if "welcome_error" in self.hellos.get(node, {}):
                raise AgentError(f"agent on {self.hostname(node)}: {self.hellos[node]['welcome_error']}")
