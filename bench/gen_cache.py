"""Generate a synthetic hidet-style cache of N operator entries, shaped like real hidet 0.6.1 entries
(task.txt named by its sha256, lib.so, source, compile.sh, compiler output, meta/version files,
func_types.pickle). Usage: python bench/gen_cache.py ROOT N [--seed-layout]"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import struct

OPS = ["matmul", "conv2d", "softmax", "add", "relu", "fused", "reduce_sum", "batch_matmul", "layer_norm",
       "attention", "gelu", "transpose", "concat", "pool2d", "embedding", "rms_norm"]
SPACES = ["cuda_space_0", "cuda_space_2", "cpu_space_0", "cuda_space_1"]


def task_text(op: str, i: int) -> bytes:
    return (f"Task(\n  name: {op}\n  parameters: \n    a: tensor(float32, [{i}, 8])\n"
            f"    b: tensor(float32, [8, {i % 97 + 1}])\n  inputs: [a]\n  outputs: [b]\n"
            f"  computations: \n    b: float32[8] where b[v] = a[v]\n  attributes: {{}}\n)").encode()


# hidet's TaskMetaData: every field its loader asks for (kcache reads meta.json when it changed late)
META = (b'{"name": "%s", "symbols": [], "inputs": [], "outputs": [], "share_map": {}, "target": "cuda", '
        b'"num_candidates": 1, "hidet_version": "0.6.1"}')
# A whole ELF64 header (no section table) so that the scan's cheap truncation check passes.
ELF_HEAD = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, 0, 0, 64, 0, 0, 64, 0, 0)


def generate(root: str, n: int, seed_layout: bool = False, lib_size: int = 4096, equal_mtimes: bool = False) -> None:
    """`equal_mtimes`: every file gets one mtime, as `cp -a`, `rsync -a`, `tar x` and container images
    leave a cache whose times were kept at one-second precision (no file is older than its marker)."""
    rng = random.Random(n)
    blob = ELF_HEAD + os.urandom(lib_size - len(ELF_HEAD))
    for i in range(n):
        op = OPS[i % len(OPS)]
        space = SPACES[(i // len(OPS)) % len(SPACES)]
        task = task_text(op, i)
        h = hashlib.sha256(task).hexdigest()[:16]
        d = os.path.join(root, "ops", space, op, h)
        os.makedirs(d, exist_ok=True)
        ext = "cc" if space.startswith("cpu") else "cu"
        files = {"task.txt": task, f"source.{ext}": b"// kernel %d\n" % i * 20,
                 "lib.so": blob[: rng.randint(lib_size // 2, lib_size)]}
        if seed_layout:
            files["nvcc_log.txt"] = b"nvcc -shared -O3 source.cu -o lib.so\nelapsed time: 1.0 seconds\n"
        else:
            files.update({"compile.sh": b"#!/bin/bash\nnvcc -shared source.cu -o lib.so\n",
                          "nvcc_output.txt": b"elapsed time: 1.0 seconds", "version.txt": b"0.6.1",
                          "meta.json": META % op.encode(), "func_types.pickle": b"\x80\x04N.",
                          ".lock": b""})
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        if equal_mtimes:
            for name in files:
                os.utime(os.path.join(d, name), (1_700_000_000, 1_700_000_000))
        elif not seed_layout:  # as in real hidet, the compile ends a while before func_types.pickle is written
            t = os.stat(os.path.join(d, "func_types.pickle")).st_mtime - 1
            os.utime(os.path.join(d, "lib.so"), (t, t))
        else:  # as a compile does, lib.so is written a while after task.txt (and the source)
            t = os.stat(os.path.join(d, "lib.so")).st_mtime - 1
            for name in ("task.txt", f"source.{ext}"):
                os.utime(os.path.join(d, name), (t, t))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("n", type=int)
    ap.add_argument("--seed-layout", action="store_true", help="kcache/seed files instead of real hidet's")
    ap.add_argument("--equal-mtimes", action="store_true", help="one mtime for every file (as cp -a, tar x)")
    args = ap.parse_args()
    generate(args.root, args.n, args.seed_layout, equal_mtimes=args.equal_mtimes)
