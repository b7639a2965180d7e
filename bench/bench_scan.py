"""Scan speed (issues 2 and 15), measured against baselines in the same run, on two generated cache shapes:

- seed: the seed-documentation layout (lib.so, source.cu, nvcc_log.txt, task.txt; no completion marker, so
  `ls` reads every lib.so's ELF header);
- equal: the real hidet layout with one mtime on every file (as cp -a, tar x leave it: no file is older
  than its marker, so `ls` reads every lib.so's ELF header too).

For each shape, against `du -sb` of the same tree (target <= 1.3x cold, <= 0.2x from the index):
  cold   `stats --json --no-index`, `ls --json --no-index` (the scan itself);
  build  `stats --json` with no index yet (the scan plus writing the index);
  index  `stats --json`, `ls --json` on the unchanged cache (answered from .kcache/index/; the bench checks
         that the answers equal the --no-index ones).
  floor  for the equal shape, floor_hidet.py: what its cold judgement cannot skip (the listing, the lstats,
         version.txt, lib.so's ELF header, meta.json), in Python over the cores, against du and against
         `ls --json --no-index`; `find -printf` of what the index's key holds (every file's inode, size,
         mtime and ctime): what any exact index must learn about an unchanged cache, in C, against du; and
         floor_index.py, the same in Python end to end (start, the index's records unpickled, the lstats
         over the cores, the JSON), against du and against `ls --json` from the index;
  cold   with --cold (root only): the page cache, dentries and inodes are dropped before every run of
         either command, so both read the disk (as after a reboot, or once reclaim has evicted the cache).
Then for each shape `inspect <prefix>`, `log <prefix>` and `clear --dry-run <prefix>` against
`kcache --version` (target <= 1.5x; the seed shape has no version.txt, the real one has), and
`--version` against a minimal Typer app (target <= 1.3x).

With --baseline-ref REF, kcache as of that git ref also runs each scan (--no-index) and lookup, alternating
with this tree, and the two are compared (the "no worse than before" check of a refactor).

Usage: python bench/bench_scan.py [--entries N] [--dir DIR] [--runs R] [--shapes seed,equal] [--cold]
       [--baseline-ref REF]
Caches are generated once per size and shape under DIR and reused. Python writes bytecode for these runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, baseline_tree, compare, ensure_cache, kcache_cmd, load, module_cmd

SHAPES = {"seed": {"seed_layout": True}, "equal": {"equal_mtimes": True}}


def same_answer(root: Path, args: list[str], env: dict) -> bool:
    def out(*extra: str) -> object:
        proc = subprocess.run(kcache_cmd("--cache-dir", str(root), *args, *extra), env=env, capture_output=True,
                              check=True)
        return json.loads(proc.stdout)
    return out() == out("--no-index")


def bench_shape(name: str, root: Path, runs: int, env: dict, cold: bool = False) -> None:
    du = ["du", "-sb", str(root)]
    index_dir = root / ".kcache" / "index"

    def drop_index() -> None:
        shutil.rmtree(index_dir, ignore_errors=True)

    def kc(*a: str) -> list[str]:
        return kcache_cmd("--cache-dir", str(root), *a)

    print(f"-- {name}: {root}", flush=True)
    compare(f"{name} cold: stats --json --no-index", kc("stats", "--json", "--no-index"), du, runs, 1.3, env)
    compare(f"{name} cold: ls --json --no-index", kc("ls", "--json", "--no-index"), du, runs, 1.3, env)
    if name == "equal":  # the reads the cold judgement of this shape cannot skip, in Python, over the cores
        cold_floor = [sys.executable, str(BENCH / "floor_hidet.py"), str(root), "--procs", str(os.cpu_count() or 1)]
        compare(f"{name} floor cold: floor_hidet.py vs du", cold_floor, du, runs, 1.3, env)
        compare(f"{name} cold: ls --json --no-index vs floor_hidet.py", kc("ls", "--json", "--no-index"), cold_floor,
                runs, 1.0, env)
    compare(f"{name} build: stats --json, no index yet", kc("stats", "--json"), du, runs, 1.3, env, before=drop_index)
    subprocess.run(kc("stats", "--json"), env=env, stdout=subprocess.DEVNULL, check=True)
    compare(f"{name} index: stats --json", kc("stats", "--json"), du, runs, 0.2, env)
    compare(f"{name} index: ls --json", kc("ls", "--json"), du, runs, 0.2, env)
    for args in (["stats", "--json"], ["ls", "--json"]):
        print(f"{name}: {' '.join(args)} from the index equals --no-index: {same_answer(root, args, env)}")
    key = ["find", str(root), "-printf", "%i %s %T@ %C@\\n"]
    compare(f"{name} floor: find -printf of the index key", key, du, runs, 0.2, env)
    index_floor = [sys.executable, str(BENCH / "floor_index.py"), str(root), "--procs", str(os.cpu_count() or 1)]
    compare(f"{name} floor: floor_index.py (Python, records, lstats, JSON)", index_floor, du, runs, 0.2, env)
    compare(f"{name} index: ls --json vs floor_index.py", kc("ls", "--json"), index_floor, runs, 1.0, env)
    if cold:
        compare(f"{name} cold disk: stats --json --no-index", kc("stats", "--json", "--no-index"), du, runs, 1.3,
                env, before=drop_caches, before_baseline=drop_caches)
        compare(f"{name} cold disk: stats --json (index)", kc("stats", "--json"), du, runs, 0.2, env,
                before=drop_caches, before_baseline=drop_caches)
    lookups(name, root, runs, env)


def against_baseline(name: str, root: Path, runs: int, env: dict, prefix: list[str], ref: str) -> None:
    """This tree against kcache as of `ref` (run through `prefix`), command for command."""
    names = sorted(os.listdir(root / "ops" / "cuda_space_0" / "matmul"))
    entry = names[len(names) // 2][:8]
    for args in (["stats", "--json", "--no-index"], ["ls", "--json", "--no-index"], ["inspect", entry],
                 ["log", entry], ["clear", "--dry-run", entry]):
        ours = module_cmd("--cache-dir", str(root), *args)  # -m: each tree's own entry point
        compare(f"{name} {' '.join(args)}: this tree vs {ref}", ours, [*prefix, *ours], runs, 1.05, env)


def drop_caches() -> None:
    """The page cache, dentries and inodes dropped (root only): the next command reads the disk."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def lookups(name: str, root: Path, runs: int, env: dict) -> None:
    op_dir = root / "ops" / "cuda_space_0" / "matmul"
    names = sorted(os.listdir(op_dir))
    prefix = names[len(names) // 2][:8]
    version = kcache_cmd("--version")
    runs = max(runs, 10)
    for args in (["inspect", prefix], ["log", prefix], ["log", "--raw", prefix], ["clear", "--dry-run", prefix]):
        compare(f"{name} {' '.join(args)} vs --version", kcache_cmd("--cache-dir", str(root), *args), version,
                runs, 1.5, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "kcache-bench-scan"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--shapes", default="seed,equal")
    ap.add_argument("--cold", action="store_true", help="also measure with caches dropped before each run (root)")
    ap.add_argument("--baseline-ref", help="also run the scans and lookups of kcache as of this git ref, "
                    "alternating with this tree (--no-index: the two trees' indexes differ)")
    ap.add_argument("--only-baseline", action="store_true", help="with --baseline-ref: only that comparison")
    args = ap.parse_args()
    if args.cold and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        ap.error("--cold drops the kernel's caches: it needs root")
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("KCACHE_DIR", None)
    roots = {}
    for shape in args.shapes.split(","):
        roots[shape] = ensure_cache(Path(args.dir) / f"{shape}-{args.entries}", args.entries, **SHAPES[shape])
    time.sleep(2.5)  # older than the index's racy window (kcache_cli/catalog/index.py)
    print(f"{args.entries} entries per cache, cpus: {os.cpu_count()}, load: {load()}", flush=True)
    for shape, root in roots.items():
        if not args.only_baseline:
            bench_shape(shape, root, args.runs, env, args.cold)
    if args.baseline_ref:
        with tempfile.TemporaryDirectory() as tmp:
            base = baseline_tree(args.baseline_ref, Path(tmp) / "base")
            for shape, root in roots.items():
                against_baseline(shape, root, args.runs, env, ["env", f"PYTHONPATH={base}"], args.baseline_ref)
    version = kcache_cmd("--version")
    compare("--version vs minimal Typer app", version,
            [sys.executable, str(BENCH / "minimal_typer_app.py"), "--version"], max(args.runs, 20), 1.3, env)
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
