"""Benchmark shell completion on a big cache against `kcache --version`, in the same run; print the ratios.

    python bench/bench_complete.py [ROOT] [--n 100000] [--runs 20]

ROOT is an existing cache (e.g. one made by bench/gen_cache.py); without it, an N-entry cache is generated
with bench/gen_cache.py in a temporary directory and removed afterwards.

Each case is one TAB as bash makes it: `_KCACHE_COMPLETE=complete_bash COMP_WORDS=... COMP_CWORD=... kcache`.
* `ls --op <TAB>` (target: within 1.3x of `kcache --version`, the start-up budget);
* `ls --space <TAB>`, `inspect 00<TAB>` and `inspect <TAB>` (every hash in the cache), for information.
Runs are interleaved (baseline, case, baseline, ...) and medians compared (the fastest runs too: on a
loaded machine they say more about the work kcache itself does).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def kcache_cmd() -> list[str]:
    script = Path(sys.executable).with_name("kcache")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kcache_cli"]


def timed(cmd: list[str], env: dict) -> tuple[float, int]:
    """Seconds taken, and how many lines it printed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or proc.stderr:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode(errors='replace')}")
    return elapsed, len(proc.stdout.splitlines())


def tab_env(base: dict, words: list[str]) -> dict:
    """The environment bash's completion function gives kcache for the command line `words` (the last one
    is the word being completed)."""
    return dict(base, _KCACHE_COMPLETE="complete_bash", COMP_WORDS=" ".join(words), COMP_CWORD=str(len(words) - 1))


def count_entries(root: Path) -> int:
    ops = root / "ops"
    return sum(len(os.listdir(ops / s / o)) for s in os.listdir(ops) for o in os.listdir(ops / s)) \
        if ops.is_dir() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", help="an existing cache (default: generate one)")
    ap.add_argument("--n", type=int, default=100_000, help="entries to generate when no ROOT is given")
    ap.add_argument("--runs", type=int, default=20, help="interleaved runs per case")
    args = ap.parse_args()

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("KCACHE_DIR", None)
    kc = kcache_cmd()
    work = None
    if args.root:
        root = Path(args.root).absolute()
    else:
        sys.path.insert(0, str(HERE))
        from gen_cache import generate

        work = Path(tempfile.mkdtemp(prefix="kcache-bench-complete-"))
        root = work / "cache"
        start = time.perf_counter()
        print(f"generating {args.n} entries in {root} ...", flush=True)
        generate(str(root), args.n)
        print(f"  generated in {time.perf_counter() - start:.0f} s", flush=True)
    try:
        n = count_entries(root)
        print(f"cache: {root}, {n} hidet entries; kcache: {' '.join(kc)}")
        cases = {
            "ls --op <TAB>": ["kcache", "--cache-dir", str(root), "ls", "--op", ""],
            "ls --space <TAB>": ["kcache", "--cache-dir", str(root), "ls", "--space", ""],
            "inspect 00<TAB>": ["kcache", "--cache-dir", str(root), "inspect", "00"],
            "inspect <TAB> (all)": ["kcache", "--cache-dir", str(root), "inspect", ""],
        }
        version = kc + ["--version"]
        for words in cases.values():  # warm-up: bytecode, the directory listings in the page cache
            timed(kc, tab_env(env, words))
        timed(version, env)
        ratios = {}
        for label, words in cases.items():
            base, tab = [], []
            lines = 0
            for _ in range(args.runs):
                base.append(timed(version, env)[0])
                t, lines = timed(kc, tab_env(env, words))
                tab.append(t)
            b, k = statistics.median(base), statistics.median(tab)
            ratios[label] = k / b
            target = " (target <= 1.3)" if label == "ls --op <TAB>" else ""
            print(f"{label:<22} {k * 1000:7.1f} ms, {lines:>6} values; kcache --version {b * 1000:6.1f} ms: "
                  f"ratio {k / b:.3f}{target}; fastest runs {min(tab) * 1000:.1f} vs {min(base) * 1000:.1f} ms: "
                  f"{min(tab) / min(base):.3f}")
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    print("target met" if ratios["ls --op <TAB>"] <= 1.3 else "target missed")


if __name__ == "__main__":
    main()
