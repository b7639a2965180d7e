"""Adds to a hidet cache what only a run of hidet makes: a compiled graph (graphs/<hash>/ with its
kernels/<i>/, graph_module/, graph_execution.json, graph_string.txt, weights.npz), the cpu operators it
needs and its ir_modules/. Run by the hidet venv's python: make_hidet.py CACHE TASKS

CACHE gets the entries; TASKS/<hash>.pickle gets the task of every op entry in CACHE (what the probe
rebuilds the operator from, for entries that keep no task.pickle of their own). Prints the graph's
directory, relative to CACHE.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys


def main() -> None:
    cache, tasks = sys.argv[1:3]
    import hidet

    hidet.option.cache_dir(cache)
    hidet.option.parallel_build(False)
    a = hidet.symbol([4, 8], dtype="float32", device="cpu")
    w = hidet.randn([8, 16], device="cpu")
    y = hidet.ops.relu(hidet.ops.matmul(a, w) + 1.0)
    graph = hidet.trace_from(y, inputs=[a]).build()
    saved = os.path.join(os.path.dirname(os.path.abspath(cache)), "graph.hidet")
    graph.save(saved)
    loaded = hidet.runtime.load_compiled_graph(saved)  # extracts into <cache>/graphs/<hash>/
    os.unlink(saved)
    os.makedirs(tasks, exist_ok=True)
    for pickle in glob.glob(os.path.join(cache, "ops", "*", "*", "*", "task.pickle")):
        shutil.copy(pickle, os.path.join(tasks, os.path.basename(os.path.dirname(pickle)) + ".pickle"))
    print(f"graphs/{loaded.meta.graph_hash}")


if __name__ == "__main__":
    main()
