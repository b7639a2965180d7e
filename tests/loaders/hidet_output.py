"""Runs one cpu op entry of a hidet cache through real hidet and prints its output, for a test to check.

Run by the hidet venv's python: hidet_output.py ROOT ENTRY
Prints one JSON line {"out": [...], "ref": [...] or null, "compiled": bool}: the kernel's output on inputs
from a fixed seed; for a matmul also numpy's product of the same inputs; and whether hidet ran a compiler
(its `should_skip_build` said no), so that a test sees the output came from the entry's own lib.so.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main() -> None:
    root, entry = sys.argv[1:3]
    import hidet
    import numpy as np

    hidet.option.cache_dir(root)
    hidet.option.parallel_build(False)
    build_module = importlib.import_module("hidet.drivers.build_module")
    real = build_module.should_skip_build
    compiled = []

    def spy(*args, **kwargs):
        skip = real(*args, **kwargs)
        compiled.append(not skip)
        return skip

    build_module.should_skip_build = spy
    task = hidet.load_task(os.path.join(root, entry, "task.pickle"))
    op = task.build("cpu")
    rng = np.random.RandomState(0)
    arrays = [rng.randn(*[int(d) for d in s.shape]).astype(s.dtype) for s in op.meta_data.inputs]
    out = op(*[hidet.asarray(a) for a in arrays])
    ref = np.matmul(arrays[0], arrays[1]).ravel().tolist() if "matmul" in entry else None
    print(json.dumps({"out": out.numpy().ravel().tolist(), "ref": ref, "compiled": any(compiled)}))


if __name__ == "__main__":
    main()
