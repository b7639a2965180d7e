"""Another program asked a question, its answer bounded: in time, in bytes, and in what it leaves running.

`explain --python` runs an interpreter the user names: one that prints without end (`yes`), never answers,
prints bytes that are not UTF-8, or exits leaving a child that holds its output open must cost kcache a
bounded wait and a bounded buffer, and nothing of it may go on running after kcache has its answer."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from typing import NamedTuple

LIMIT = 1 << 20  # bytes of output kept of each stream: an answer is a line
GRACE = 0.5  # seconds to wait for the pipes' end once the program itself has ended


class Answer(NamedTuple):
    returncode: int | None  # None: it was ended (timed out, or printed too much)
    out: bytes
    err: bytes
    timed_out: bool
    too_much: bool  # more than the limit on stdout or stderr


def ask(argv: list[str], timeout: float, limit: int = LIMIT) -> Answer:
    """Run `argv` in a process group of its own, stdin empty, and read its output until it ends, for at most
    `timeout` seconds and `limit` bytes a stream; then its whole group is killed (whatever it left behind).
    OSError when it cannot be started."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    deadline = time.monotonic() + timeout
    try:
        timed_out, too_much = _read(proc, bufs, deadline, limit)
        if not (timed_out or too_much):  # its output closed: it is ending (on a loaded machine, a moment later)
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # it closed its output and went on past the time: no answer
                timed_out = True
    finally:
        ended = proc.poll() is not None
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # before the wait reaps it: the group's id is still its own
        except OSError:
            pass
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    out, err = (bytes(b[:limit]) for b in bufs.values())  # stdout's, then stderr's
    return Answer(proc.returncode if ended and not timed_out and not too_much else None, out, err, timed_out,
                  too_much)


def _read(proc: subprocess.Popen, bufs: dict[int, bytearray], deadline: float, limit: int) -> tuple[bool, bool]:
    """Read both pipes into `bufs` until both end, the deadline passes (True, False), a stream passes
    `limit` (False, True), or GRACE after the program ended (a child it left holds them)."""
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        ended_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return True, False
            if ended_at is None and proc.poll() is not None:
                ended_at = now
            if ended_at is not None and now - ended_at > GRACE:
                return False, False
            for key, _ in sel.select(min(deadline - now, 0.1)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                bufs[key.fd] += chunk
                if len(bufs[key.fd]) > limit:
                    return False, True
    return False, False
