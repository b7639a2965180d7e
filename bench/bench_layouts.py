"""Every layout at du speed (issue 35): `ls --json` of a generated Triton, Inductor, vLLM and tilelang cache,
cold (`--no-index`: every entry judged) and warm (the cache unchanged since the last run: answered from the
index), each against `du -sb` of the same tree and against kcache as of another git ref (default fc5547c,
the tree before issue 35), paired: the two commands alternate, `--runs` times, medians compared.

The caches (made once under DIR and reused):
  triton    N key directories, each a copy of one real kernel (tests/fixtures/real/triton) under its own key,
            group paths leading into it (bench_triton_scan.make_cache);
  tilelang  N copies of the real tilelang kernel and N/4 of its binary (bench_triton_scan.make_tilelang);
  inductor  N fx graphs, N/2 AOTAutograd entries naming two each, N code shards, N/2 Triton kernels under
            triton/0/ (bench_inductor.make);
  tilus     N programs, each the real program (tests/fixtures/real/tilus) with a comment line of its own in
            program.txt, under the name tilus gives those texts (complete, as the loader finds them), its
            other files hard links of one copy, and the real script beside them;
  vllm      N units, alternately copies of the recorded binary and unpacked units
            (tests/loaders/recorded/vllm.tar.gz), their artifacts hard links of one copy, their indexes
            rewritten by `kcache verify --fix` to lead into each unit.
Each layout's first listing too (`ls --json` with no index yet, which judges every entry and writes the
index: what a user's first `ls` of a cache costs, and one after every entry changed), against du and
against `--no-index`. Each layout also times `inspect <prefix>` of one entry against `kcache --version`,
and what an admin's cron runs on the unchanged cache, `prune` within its budget and `stats`, against the
listing they are made from.
For Triton, Inductor and vLLM, bench/floor_triton.py, floor_inductor.py and floor_vllm.py (what a cold
judgement cannot skip, in Python, over the cores) are timed against du and against kcache's cold listing; for every
layout, bench/floor_index.py (an unchanged listing's floor in Python: the index's records unpickled, the
lstats over the cores, the JSON) against du and against kcache. The warm
runs of the other ref use their own copy of the tree (generated alike; Triton's and Inductor's group
paths lead into it): the two trees' indexes differ, and each would throw the other's away. They run
twice, the second time with the copies swapped, since two copies differ on disk by a few percent.

Usage: python bench/bench_layouts.py [--layouts triton,inductor,vllm,tilelang,tilus] [--entries N] [--runs R]
       [--dir DIR] [--baseline-ref REF] [--no-baseline]
The machine is measured as it is: a shared one moves both commands of a pair alike, not their ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_inductor import make as make_inductor
from bench_triton_scan import make_cache as make_triton
from bench_triton_scan import make_tilelang
from common import BENCH, baseline_tree, compare, kcache_cmd, load, module_cmd

REPO = BENCH.parent
DEFAULT_ENTRIES = {"triton": 20_000, "tilelang": 20_000, "inductor": 5_000, "vllm": 5_000, "tilus": 20_000}
VLLM_UNITS = {"0123456789": "binary", "abcdef0123": "unpacked"}


def make_vllm(root: Path, n: int, env: dict) -> Path:
    """N vLLM units under distinct 10-hex names, their files hard links of the recorded ones (an index,
    rewritten per unit, is a file of its own)."""
    cache = root / "torch_compile_cache"
    done = root / f".made-{n}"
    if done.exists():
        return cache
    shutil.rmtree(root, ignore_errors=True)  # bench scratch only
    root.mkdir(parents=True)
    (root / "src").mkdir()
    subprocess.run(["tar", "-xzf", str(REPO / "tests/loaders/recorded/vllm.tar.gz"), "-C", str(root / "src")],
                   check=True)
    src = root / "src" / "torch_compile_cache"
    cache.mkdir()
    models = sorted(VLLM_UNITS)
    for i in range(n):
        unit = src / models[i % len(models)]
        dest = cache / f"{i:010x}"
        shutil.copytree(unit, dest, copy_function=os.link)
    shutil.rmtree(root / "src")
    subprocess.run(kcache_cmd("--cache-dir", str(cache), "verify", "--fix", "--json"), env=env, check=True,
                   stdout=subprocess.DEVNULL)
    done.write_text("")
    return cache


def make_tilus(root: Path, n: int) -> Path:
    """N programs made from the real tilus program, each under the name tilus gives its texts (the first 12
    hex digits of the sha256 of options.txt + program.txt, as the loader checks): its program.txt is the
    real one with a comment line of its own, written anew with the real one's times, its other files hard
    links of one copy."""
    done = root / f".made-{n}-hashed"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)  # bench scratch only
    real = REPO / "tests/fixtures/real/tilus"
    shutil.copytree(real, root, symlinks=True)
    program = next((root / "programs").iterdir())
    options, text = (program / "options.txt").read_text(), (program / "program.txt").read_text()
    st = os.stat(program / "program.txt")
    for i in range(n):
        mine = f"{text}# copy {i}\n"
        name = hashlib.sha256((options + mine).encode()).hexdigest()[:12]
        where = root / "programs" / name
        shutil.copytree(program, where, symlinks=True, copy_function=os.link)
        (where / "program.txt").unlink()
        (where / "program.txt").write_text(mine)
        os.utime(where / "program.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    done.write_text("")
    return root


def make(layout: str, where: Path, n: int, env: dict) -> Path:
    if layout == "triton":
        return make_triton(where / f"triton-{n}", n, False)
    if layout == "tilelang":
        return make_tilelang(where / f"tilelang-{n}", n)
    if layout == "tilus":
        return make_tilus(where / f"tilus-{n}", n)
    if layout == "inductor":
        root = where / f"inductor-{n}" / "cache"
        if not root.is_dir():
            make_inductor(root, n)
        return root
    return make_vllm(where / f"vllm-{n}", n, env)


def twin(layout: str, root: Path, n: int, env: dict) -> Path:
    """A copy of `root` for the other ref's warm runs (made once). Triton's and Inductor's are made afresh:
    a copy's group files would lead into `root`, and an entry judged by files outside it is never indexed;
    vLLM's units are copied, then their indexes rewritten to lead into the copy (`verify --fix`): a moved
    unit is not indexed either, and its warm runs were cold ones."""
    copy = root.with_name(root.name + "-twin")
    if layout == "triton":
        return make_triton(copy, n, False)
    if layout == "inductor":  # its nested Triton kernels' group files too
        if not copy.is_dir():
            make_inductor(copy, n)
        return copy
    fixed = copy.with_name(copy.name + ".fixed")
    if copy.is_dir() and sorted(p.name for p in copy.glob(".made-*")) != sorted(p.name for p in root.glob(".made-*")):
        shutil.rmtree(copy)  # a copy of what `root` was before it was made again (bench scratch only)
    if not copy.is_dir():
        fixed.unlink(missing_ok=True)
        subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
    if layout == "vllm" and not fixed.exists():
        subprocess.run(kcache_cmd("--cache-dir", str(copy), "verify", "--fix", "--json"), env=env, check=True,
                       stdout=subprocess.DEVNULL)
        fixed.write_text("")
    return copy


def same_answer(cmd: list[str], env: dict) -> bool:
    """The index's answer equals the real scan's."""
    def out(*extra: str) -> object:
        got = json.loads(subprocess.run([*cmd, *extra], env=env, stdout=subprocess.PIPE, check=True).stdout)
        return [{k: v for k, v in e.items() if k != "last_used"} for e in got["entries"]]

    return out() == out("--no-index")


def bench(layout: str, root: Path, n: int, runs: int, env: dict, base: Path | None, ref: str) -> None:
    du = ["du", "-sb", str(root)]
    ls = kcache_cmd("--cache-dir", str(root), "ls", "--json")
    cold = [*ls, "--no-index"]
    count = len(json.loads(subprocess.run(cold, env=env, stdout=subprocess.PIPE, check=True).stdout)["entries"])
    print(f"-- {layout}: {count} entries in {root}; load {load()}", flush=True)
    compare(f"{layout} cold: ls --json --no-index vs du", cold, du, runs, 1.5, env)
    procs = ["--procs", str(os.cpu_count() or 1)]
    floor = [sys.executable, str(BENCH / "floor_triton.py"), str(root), *procs]
    cold_floor = {"triton": floor, "inductor": [sys.executable, str(BENCH / "floor_inductor.py"), str(root), *procs],
                  "vllm": [sys.executable, str(BENCH / "floor_vllm.py"), str(root), *procs]}.get(layout)
    if cold_floor:  # the system calls and reads no cold listing can skip, in Python, over the cores
        script = os.path.basename(cold_floor[1])
        compare(f"{layout} floor cold: {script} vs du", cold_floor, du, runs, 1.5, env)
        compare(f"{layout} cold: ls --json --no-index vs {script}", cold, cold_floor, runs, 1.0, env)
    # A first listing (no index yet, or every entry changed: the default `ls` judges each entry and writes
    # the index of what it judged), the index removed by rm before each run (a millisecond of the run).
    first = ["sh", "-c", 'rm -rf -- "$0/.kcache/index" && exec "$@"', str(root), *ls]
    compare(f"{layout} first: ls --json (index written) vs du", first, du, runs, 1.5, env)
    compare(f"{layout} first: ls --json (index written) vs --no-index", first, cold, runs, 1.2, env)
    subprocess.run(ls, env=env, stdout=subprocess.DEVNULL, check=True)  # the index, for the warm runs
    compare(f"{layout} warm: ls --json (index) vs du", ls, du, runs, 1.0, env)
    if layout == "triton":  # what proving every file unchanged costs in Python (names from a pickle)
        names = root.parent / f".{root.name}-names.pickle"  # beside the cache: never in it
        compare("triton floor warm: floor_triton.py --warm vs du", [*floor, "--warm", str(names)], du, runs,
                1.0, env)
    # any exact index's floor, end to end: Python, the index's records unpickled, the lstats, the JSON
    index_floor = [sys.executable, str(BENCH / "floor_index.py"), str(root), "--procs", str(os.cpu_count() or 1)]
    compare(f"{layout} floor warm: floor_index.py vs du", index_floor, du, runs, 1.0, env)
    compare(f"{layout} warm: ls --json (index) vs floor_index.py", ls, index_floor, runs, 1.0, env)
    print(f"{layout}: the index's answer equals --no-index: {same_answer(ls, env)}", flush=True)
    lookup(layout, root, env, runs)
    upkeep(layout, root, env, runs)
    if base is None:
        return
    theirs = ["env", f"PYTHONPATH={base}"]
    our_ls = module_cmd("--cache-dir", str(root), "ls", "--json")  # -m: each tree's own entry point
    our_cold = [*our_ls, "--no-index"]
    compare(f"{layout} cold: this tree vs {ref}", our_cold, [*theirs, *our_cold], runs, 1.0, env)
    other = twin(layout, root, n, env)
    their_ls = [*theirs, *module_cmd("--cache-dir", str(other), "ls", "--json")]
    subprocess.run(their_ls, env=env, stdout=subprocess.DEVNULL, check=True)
    subprocess.run(our_ls, env=env, stdout=subprocess.DEVNULL, check=True)
    compare(f"{layout} warm: this tree vs {ref}", our_ls, their_ls, runs, 1.0, env)
    # Again with the two copies swapped: copies of one tree differ on disk by a few percent (where their
    # inodes and directory blocks landed), which the first pairing counts against one side.
    swapped_ours = module_cmd("--cache-dir", str(other), "ls", "--json")
    swapped_theirs = [*theirs, *module_cmd("--cache-dir", str(root), "ls", "--json")]
    compare(f"{layout} warm, copies swapped: this tree vs {ref}", swapped_ours, swapped_theirs, runs, 1.0, env)
    subprocess.run(ls, env=env, stdout=subprocess.DEVNULL, check=True)  # the tree's index is this code's again


def upkeep(layout: str, root: Path, env: dict, runs: int) -> None:
    """What an admin's cron runs on an unchanged cache, each against the listing (`ls --json`, from the
    index) it is made from, target within 1.2x: a prune of the cache within its budget (it plans: a scan,
    the leftovers looked for; and removes nothing), and stats."""
    ls = kcache_cmd("--cache-dir", str(root), "ls", "--json")
    for args in (["prune", "--dry-run", "--max-size", "1000T", "--json"], ["stats", "--json"]):
        compare(f"{layout} warm: {args[0]} vs ls --json", kcache_cmd("--cache-dir", str(root), *args), ls, runs,
                1.2, env)


def lookup(layout: str, root: Path, env: dict, runs: int) -> None:
    """`inspect <prefix>` of one complete entry (the first `ls` lists whose hash no other entry has, by the
    hash's first 12 characters, or the whole hash where those name several) against `kcache --version`: a
    lookup in a big cache of this layout."""
    rows = json.loads(subprocess.run(kcache_cmd("--cache-dir", str(root), "ls", "--json"), env=env,
                                     capture_output=True, check=True).stdout)["entries"]
    named = Counter(r["hash"] for r in rows)
    complete = [r["hash"] for r in rows if r["status"] == "complete" and r["hash"] and named[r["hash"]] == 1]
    if not complete:
        print(f"{layout}: no complete entry its hash alone names", flush=True)
        return
    whole = complete[0]
    ref = whole[:12] if sum(r["hash"].startswith(whole[:12]) for r in rows) == 1 else whole
    inspect = kcache_cmd("--cache-dir", str(root), "inspect", ref)
    compare(f"{layout} inspect <prefix> vs --version", inspect, kcache_cmd("--version"), runs, 1.5, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="triton,inductor,vllm,tilelang,tilus")
    ap.add_argument("--entries", type=int, help="entries per cache (default: 20,000; Inductor and vLLM 5,000)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "kcache-bench-layouts"))
    ap.add_argument("--baseline-ref", default="fc5547c")
    ap.add_argument("--no-baseline", action="store_true", help="only against du")
    args = ap.parse_args()
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as users run it: bytecode cached
    env.pop("KCACHE_DIR", None)
    layouts = [name for name in args.layouts.split(",") if name]
    unknown = set(layouts) - set(DEFAULT_ENTRIES)
    if unknown:
        ap.error(f"unknown layouts: {', '.join(sorted(unknown))}")
    roots = {name: make(name, Path(args.dir), args.entries or DEFAULT_ENTRIES[name], env) for name in layouts}
    time.sleep(2.5)  # older than the index's racy window (kcache_cli/catalog/index.py)
    print(f"cpus: {os.cpu_count()}, load: {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = None if args.no_baseline else baseline_tree(args.baseline_ref, Path(tmp) / "base")
        for name, root in roots.items():
            bench(name, root, args.entries or DEFAULT_ENTRIES[name], args.runs, env, base, args.baseline_ref)
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
