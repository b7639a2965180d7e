"""Triton's own lookup "here", for `kcache explain` (run in a Triton loader venv, no GPU needed):

    python probe_triton_here.py ROOT CC   compile every CUDA kernel of probe_triton.KERNELS for compute
                                          capability CC (what a GPU of that arch runs) against the cache
                                          ROOT (a copy: a miss writes into it)

Prints {"version", "hits": [key directories Triton used without running a backend stage]} as one line."""

import json
import os
import sys

ROOT, CC = sys.argv[1], int(sys.argv[2])
os.environ["TRITON_CACHE_DIR"] = os.path.abspath(ROOT)
sys.argv = [sys.argv[0], "lookup"]  # probe_triton reads its own first argument at import
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import probe_triton as pt  # noqa: E402

if __name__ == "__main__":
    watch = pt.Watch()
    hits = []
    for _name, fn, sig, block, cc in pt.KERNELS:
        if isinstance(cc, str):  # an AMD kernel: a CUDA GPU here never looks it up
            continue
        key, ran, err = pt.once(watch, fn, sig, block, CC)
        if key and not ran and not err:
            hits.append(key)
    print(json.dumps({"version": pt.triton.__version__, "hits": sorted(hits)}))
