"""Run a function in a forked child as another user (root only): what it returns comes back pickled."""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable

NOBODY = 65534


def run_as(uid: int, func: Callable[[], Any]) -> Any:
    """`func()` in a child process that runs as `uid` (its group the same number, no supplementary
    groups); its return value, pickled back. The child failing fails the caller's assertion."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.setgid(uid)
            os.setgroups([])
            os.setuid(uid)
            os.write(w, pickle.dumps(func()))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and data
    return pickle.loads(data)
