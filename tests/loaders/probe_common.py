"""What every probe shares (imported by probe_<layout>.py, which runs in the loader's venv, not kcache's).

A probe is one function `probe_one(root, entry, source) -> (verdict, detail)`; `main(probe_one)` gives it
two ways to run:
  probe_X.py ROOT ENTRY SOURCE   one case; prints {"verdict", "detail"} as the last line
  probe_X.py --batch             cases as JSON lines [root, entry, source] on stdin; one JSON line out per
                                 case, with its "index" (the loader is imported once: hidet alone takes 3 s)
Each case gets its own events file (KCACHE_PROBE_EVENTS, beside its root) for spies that must see into
worker processes. A crash of the interpreter mid-batch loses only the cases not yet printed: matrix.py
runs those again one process each.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable

Probe = Callable[[str, str, str], tuple[str, str]]


def with_cudart() -> None:
    """Re-run this probe with CUDA's runtime library on the loader path: cuda lib.so files link libcudart
    (found, no GPU needed to load them), so the loader's dlopen is the real one."""
    import glob

    if os.environ.get("KCACHE_PROBE_CUDART") == "1":
        return
    libs = sorted(glob.glob("/usr/local/cuda*/lib*/libcudart.so.*")
                  + glob.glob("/usr/local/cuda*/targets/*/lib/libcudart.so.*"))
    env = dict(os.environ, KCACHE_PROBE_CUDART="1")
    if libs:
        env["LD_LIBRARY_PATH"] = ":".join([os.path.dirname(libs[-1]), env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def events() -> set[str]:
    path = os.environ.get("KCACHE_PROBE_EVENTS")
    if not path or not os.path.exists(path):
        return set()
    with open(path) as f:
        return set(f.read().split())


def log(event: str) -> None:
    path = os.environ.get("KCACHE_PROBE_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(event + "\n")


def crash_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else "?"
    return f"{type(exc).__name__} at {where}: {str(exc).strip()[:300]}"


def _one(probe_one: Probe, root: str, entry: str, source: str) -> dict[str, str]:
    os.environ["KCACHE_PROBE_EVENTS"] = os.path.join(os.path.dirname(os.path.abspath(root)), "probe-events")
    try:
        verdict, detail = probe_one(root, entry, source)
    except BaseException as exc:  # a bug in the probe itself, not the loader's verdict: said plainly
        verdict, detail = "probe-error", crash_text(exc)
    return {"verdict": verdict, "detail": detail[:400], "events": " ".join(sorted(events()))}


def main(probe_one: Probe) -> None:
    if sys.argv[1:] == ["--batch"]:
        for i, line in enumerate(sys.stdin):
            root, entry, source = json.loads(line)
            print(json.dumps({"index": i, **_one(probe_one, root, entry, source)}), flush=True)
        return
    root, entry, source = sys.argv[1:4]
    print(json.dumps(_one(probe_one, root, entry, source)), flush=True)
