"""A real redis-server for the remote tests: started on a free loopback port, stopped at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK)
                                                 else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process in `workdir`; `persistent` keeps an append-only file (fsync always),
    so that a server killed with SIGKILL comes back with exactly what it had acknowledged."""

    def __init__(self, workdir: Path, persistent: bool = False, password: str | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.persistent = persistent
        self.password = password
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it on self.port; a port another process took since free_port() (tests run in parallel
        workers) means another port, and the server that answers must be this one (its pid)."""
        for _ in range(5):
            if self._start_once():
                return
            self.port = free_port()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def _start_once(self) -> bool:
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.workdir)]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while self.proc.poll() is None and time.monotonic() < deadline:
            if self._answers_as_ours():
                return True
            time.sleep(0.02)
        self.kill()
        return False

    def _answers_as_ours(self) -> bool:
        hello = b"AUTH " + self.password.encode() + b"\r\n" if self.password else b""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(hello + b"INFO server\r\n")
                reply = b""
                while b"process_id:" not in reply or not reply.endswith(b"\r\n\r\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return False
        assert self.proc is not None
        return f"process_id:{self.proc.pid}\r\n".encode() in reply

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def redis_server(tmp_path):
    """A fresh redis-server (no persistence) on a free loopback port; `.url`, `.client()`, `.kill()`."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server not found")
    servers: list[RedisServer] = []

    def make(persistent: bool = False, password: str | None = None) -> RedisServer:
        servers.append(RedisServer(tmp_path / f"redis-{len(servers)}", persistent, password))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()
