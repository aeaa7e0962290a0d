"""A TCP proxy in front of a database server, for tests of a worker whose link to it fails."""

from __future__ import annotations

import select
import socket
import struct
import threading

from tests.support.processes import wait_for


def free_port() -> int:
    """A port nothing listens on now (connections to it are refused until someone does)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


class Proxy:
    """Forwards TCP connections from 127.0.0.1:<port> (free, unless given) to ``target`` until cut."""

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.links: list[tuple[socket.socket, socket.socket]] = []
        self.paused: set[int] = set()  # links that saw the cut and forward nothing
        self.cut_off = threading.Event()
        self.healed = threading.Event()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Stop forwarding either way on every connection, new ones too; returns once all have stopped."""
        self.healed.clear()
        self.cut_off.set()
        wait_for(lambda: self._live() <= self.paused, timeout=5, what="every link to pause")

    def heal(self, *, reset: bool) -> None:
        """Forward again; with ``reset``, first abort the connections that lived through the cut."""
        if reset:
            with self.lock:
                links, self.links = self.links, []
            for pair in links:
                for end in pair:
                    # SO_LINGER 0: close() sends a RST, as a peer that gave up on the connection does.
                    end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    end.close()
        self.cut_off.clear()
        self.healed.set()

    def close(self) -> None:
        self.closed = True
        self.heal(reset=True)
        self.listener.close()

    def _live(self) -> set[int]:
        with self.lock:
            return {id(pair) for pair in self.links}

    def _accept(self) -> None:
        while not self.closed:
            if self.cut_off.is_set():
                # Connections wait in the listen backlog: the worker's connect sees silence too.
                self.healed.wait(0.05)
                continue
            try:
                ready, _, _ = select.select([self.listener], [], [], 0.05)
                if not ready:
                    continue
                client, _ = self.listener.accept()
            except (OSError, ValueError):
                return  # closed
            server = socket.create_connection(self.target)
            pair = (client, server)
            with self.lock:
                self.links.append(pair)
            threading.Thread(target=self._forward, args=(pair,), daemon=True).start()

    def _forward(self, pair: tuple[socket.socket, socket.socket]) -> None:
        client, server = pair
        other = {client: server, server: client}
        try:
            while True:
                if self.cut_off.is_set():
                    self.paused.add(id(pair))
                    self.healed.wait(0.05)
                    continue
                self.paused.discard(id(pair))
                ready, _, _ = select.select([client, server], [], [], 0.05)
                for end in ready:
                    data = end.recv(65536)
                    if not data:
                        return
                    other[end].sendall(data)
        except (OSError, ValueError):
            return  # reset by heal(reset=True), or by either end
        finally:
            with self.lock:
                if pair in self.links:
                    self.links.remove(pair)
            self.paused.discard(id(pair))
            for end in pair:
                end.close()
