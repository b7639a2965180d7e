"""Inductor and vLLM scan speed against `du -sb` of the same tree (DESIGN section 8: a full scan within 1.3x
of du). The generated Inductor cache has N fx graphs (one pickled variant each, framed and named as torch
does), N/2 aotautograd entries naming two graphs each, and N code shards of a .py and a .cpp/.so pair
(the .so a real ELF made once by g++), and N/2 Triton kernels under triton/0/ (the held-out real kernel
under distinct keys, its group paths leading into each). An aotautograd variant holds, besides the keys it
names, the bytes of one torch wrote (tests/loaders/recorded/inductor.tar.gz, its own keys blanked): the
search for keys goes through what it goes through in a real cache (a filler of one letter, as this bench
had, is 5x cheaper to search than torch's bytes, and favours one way of searching over another).
`ls --json` reads two bytes of each variant, the ELF header of each .so, every aotautograd variant whole (to
find the graph keys it names) and each kernel's group and metadata.

Usage: python bench/bench_inductor.py [--entries N] [--dir DIR] [--runs R]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_triton_scan import KERNEL
from common import compare, kcache_cmd


RECORDED = Path(__file__).resolve().parent.parent / "tests" / "loaders" / "recorded" / "inductor.tar.gz"


def torch_variant_bytes() -> bytes:
    """The bytes of the first aotautograd variant in the cache torch made for the tests, each fx graph key
    in them blanked (upper case: no key), so that a variant holding them names only the keys given it."""
    with tarfile.open(RECORDED) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            f = tar.extractfile(m) if m.isfile() and "/aotautograd/" in m.name else None
            if f is not None:
                return re.sub(rb"f[a-z2-7]{51}", b"F" * 52, f.read())
    raise SystemExit(f"{RECORDED} holds no aotautograd variant")


def b32(data: bytes) -> str:
    return base64.b32encode(hashlib.sha256(data).digest())[:51].decode().lower()


def make(root: Path, n: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    so = root.parent / "kernel.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-x", "c++", "-", "-o", str(so)], input="int f() { return 1; }\n",
                   text=True, check=True)
    lib = so.read_bytes()
    keys = []
    for i in range(n):
        data = pickle.dumps({"graph": i, "code": "x" * 20000}, protocol=4)
        key = "f" + b32(f"graph {i}".encode())
        d = root / "fxgraph" / key[1:3] / key
        d.mkdir(parents=True, exist_ok=True)
        (d / b32(data)).write_bytes(data)
        keys.append(key)
        code = "c" + b32(f"code {i}".encode())
        shard = root / code[1:3]
        shard.mkdir(exist_ok=True)
        (shard / f"{code}.py").write_text("# generated\n" * 200)
        (shard / f"{code}.cpp").write_text("int f() { return 1; }\n")
        (shard / f"{code}.so").write_bytes(lib)
    torch_bytes = torch_variant_bytes()
    for i in range(0, n - 1, 2):
        data = pickle.dumps({"fw": keys[i], "bw": keys[i + 1], "torch": torch_bytes}, protocol=4)
        d = root / "aotautograd" / ("a" + b32(f"aot {i}".encode()))
        d.mkdir(parents=True)
        (d / b32(data)).write_bytes(data)
    make_triton_kernels(root / "triton" / "0", n // 2)


def make_triton_kernels(where: Path, n: int) -> None:
    """N copies of the real Triton kernel under distinct keys, their group files leading into each."""
    group_name = next(p.name for p in KERNEL.iterdir() if p.name.startswith("__grp__"))
    group = json.loads((KERNEL / group_name).read_text())
    for i in range(n):
        d = where / base64.b32encode(hashlib.sha256(f"triton {i}".encode()).digest()).decode().rstrip("=")
        shutil.copytree(KERNEL, d)
        (d / group_name).write_text(json.dumps({"child_paths": {c: str(d / c) for c in group["child_paths"]}}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=5000)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "kcache-bench-inductor"))
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    root = Path(args.dir) / f"n{args.entries}" / "cache"
    if not root.is_dir():
        make(root, args.entries)
    compare(f"inductor ls --json, {args.entries} graphs", kcache_cmd("--cache-dir", str(root), "ls", "--json"),
            ["du", "-sb", str(root)], args.runs, 1.3)


if __name__ == "__main__":
    main()
