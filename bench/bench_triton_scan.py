"""Triton and tilelang listing speed (issue 22): `ls --json --no-index` of a generated Triton cache, this tree's kcache
against another tree's (default: `main`, exported with `git archive` into a temp dir) and `du -sb`, all in
the same window, alternately.

The cache: N key directories (52-character base32 keys, as Triton >= 3.3 names them), each a copy of one
real kernel of tests/fixtures/real/triton with its group paths rewritten to lead into it (as Triton
writes them where it compiles), so every entry is complete; --moved leaves the paths of the fixture's root.
With --tilelang: N copies of the real tilelang kernel (tests/fixtures/real/tilelang) under distinct keys, plus
N/4 copies of its cuda-binaries entry (ls now reads each manifest.json / metadata.json, as tilelang does).

Usage: python bench/bench_triton_scan.py [--entries N] [--runs R] [--dir DIR] [--baseline-ref REF] [--moved]
                                          [--tilelang]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, baseline_tree, compare, load

REPO = BENCH.parent
KERNEL = REPO / "tests/fixtures/real/triton/cache/ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"


def make_cache(root: Path, n: int, moved: bool) -> Path:
    """N copies of one real kernel under distinct keys (reused when already made)."""
    done = root / f".made-{n}-{int(moved)}"
    if done.exists():
        return root
    if root.exists():
        shutil.rmtree(root)  # bench scratch only, never a cache root kcache manages
    root.mkdir(parents=True)
    group_name = next(p.name for p in KERNEL.iterdir() if p.name.startswith("__grp__"))
    group = json.loads((KERNEL / group_name).read_text())
    for i in range(n):
        key = base64.b32encode(hashlib.sha256(str(i).encode()).digest()).decode().rstrip("=")
        d = root / key
        shutil.copytree(KERNEL, d)
        if not moved:
            paths = {c: str(d / c) for c in group["child_paths"]}
            (d / group_name).write_text(json.dumps({"child_paths": paths}))
    done.write_text("")
    return root


TILELANG = REPO / "tests/fixtures/real/tilelang/0.1.15"


def make_tilelang(root: Path, n: int) -> Path:
    """N copies of the real tilelang kernel and N/4 of its binary, each under its own sha256 key."""
    done = root / f".made-{n}"
    if done.exists():
        return root
    if root.exists():
        shutil.rmtree(root)  # bench scratch only
    kernel = next((TILELANG / "linux-x86_64/kernels").iterdir())
    binary = next((TILELANG / "cuda-binaries").iterdir())
    for i in range(n):
        key = hashlib.sha256(str(i).encode()).hexdigest()
        shutil.copytree(kernel, root / "0.1.15/linux-x86_64/kernels" / key)
        if i % 4 == 0:
            shutil.copytree(binary, root / "0.1.15/cuda-binaries" / key)
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    done.write_text("")
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "kcache-bench-triton"))
    ap.add_argument("--baseline-ref", default="main")
    ap.add_argument("--moved", action="store_true")
    ap.add_argument("--tilelang", action="store_true")
    args = ap.parse_args()
    if args.tilelang:
        root = make_tilelang(Path(args.dir) / f"tilelang-{args.entries}", args.entries)
        print(f"{args.entries} tilelang kernels, {(args.entries + 3) // 4} binaries in {root}; load {load()}")
    else:
        root = make_cache(Path(args.dir) / f"cache-{args.entries}{'-moved' if args.moved else ''}", args.entries,
                          args.moved)
        print(f"{args.entries} Triton kernels in {root} ({'moved' if args.moved else 'in place'}); load {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline_tree(args.baseline_ref, Path(tmp) / "base")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        run = [sys.executable, "-c", "from kcache_cli.cli.app import main; main()"]
        ours = [*run, "--cache-dir", str(root), "ls", "--json", "--no-index"]
        theirs = ["env", f"PYTHONPATH={base}", *ours]
        compare(f"ls --no-index: this tree vs {args.baseline_ref}", ours, theirs, args.runs, 1.1, env=env)
        compare("ls --no-index vs du -sb", ours, ["du", "-sb", str(root)], args.runs, 1.3, env=env)
        compare(f"{args.baseline_ref} ls --no-index vs du -sb", theirs, ["du", "-sb", str(root)], args.runs, 1.3,
                env=env)


if __name__ == "__main__":
    main()
