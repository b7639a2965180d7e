"""Triton's second run over a whole cache, run in a loader venv (triton 3.1, 3.2 or 3.9; no GPU needed).

    python probe_triton_rerun.py ROOT    compile every kernel of probe_triton.py again with TRITON_CACHE_DIR=ROOT;
                                         prints {"version", "kernels": {<key dir>: {"name", "verdict", "detail"}}}
    python probe_triton_rerun.py --as-given ROOT
                                         the same with ROOT exactly as given (a relative TRITON_CACHE_DIR, as a
                                         project's `TRITON_CACHE_DIR=.triton`: Triton then writes relative paths)

The verdicts are probe_triton.py's (hit: no backend stage ran, the 3.9 listener agreeing, and the returned
cubin/hsaco loads), for every kernel at once rather than one damaged entry.
"""

from __future__ import annotations

import json
import os
import sys

AS_GIVEN = sys.argv[1] == "--as-given"
os.environ["TRITON_CACHE_DIR"] = sys.argv[2] if AS_GIVEN else os.path.abspath(sys.argv[1])
sys.argv[1:] = ["--rerun"]  # probe_triton reads argv[1] at import ("make" means something else there)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import probe_triton  # noqa: E402

if __name__ == "__main__":
    # probe_one's own set-up, without its abspath: every kernel's verdict
    print(json.dumps(probe_triton.probe(False)))
