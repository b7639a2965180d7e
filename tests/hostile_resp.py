"""A small threaded RESP server on loopback that lies the way a hostile remote would: it answers
every command with a reply chosen by the test (`answer(command) -> bytes`), and may send it one byte
every `trickle` seconds."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def bulk(b: bytes | None) -> bytes:
    return b"$-1\r\n" if b is None else b"$%d\r\n%s\r\n" % (len(b), b)


def array(items: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(items)


def integer(n: int) -> bytes:
    return b":%d\r\n" % n


OK = b"+OK\r\n"


def _read_command(f) -> list[bytes] | None:
    line = f.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        return line.split()
    args = []
    for _ in range(int(line[1:])):
        n = int(f.readline()[1:])
        args.append(f.read(n + 2)[:-2])
    return args


class HostileServer:
    """Listens on 127.0.0.1:`port`; each connection in its own thread. `commands` records what was
    asked (upper-cased command names)."""

    def __init__(self, answer: Callable[[list[bytes]], bytes], trickle: float | None = None) -> None:
        self.answer, self.trickle = answer, trickle
        self.commands: list[bytes] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.stopped = threading.Event()
        self.served: list[threading.Thread] = []
        self.conns: list[socket.socket] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            serving = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.served.append(serving)
            self.conns.append(conn)
            serving.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            try:
                while not self.stopped.is_set():
                    cmd = _read_command(f)
                    if cmd is None:
                        return
                    self.commands.append(cmd[0].upper() if cmd else b"")
                    self._send(conn, self.answer(cmd))
            except (OSError, ValueError):
                return

    def _send(self, conn: socket.socket, reply: bytes) -> None:
        if self.trickle is None:
            conn.sendall(reply)
            return
        for i in range(len(reply)):
            if self.stopped.is_set():
                return
            conn.sendall(reply[i:i + 1])
            self.stopped.wait(self.trickle)  # a sleep that stop() ends

    def stop(self) -> None:
        """Stop listening and serving, and wait for the threads: a thread left running in a test
        process makes every later scan there run without forked workers (parallel.fork_safe).
        close() alone does not wake a thread blocked in accept() on Linux; shutdown() does."""
        self.stopped.set()
        for sock in (self.sock, *self.conns):  # a serving thread may be blocked reading its client
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sock.close()
        for thread in (self.acceptor, *self.served):
            thread.join(timeout=10)
