"""`kcache prune --max-size` down to half of an N-entry cache (default 100,000, bench/gen_cache.py),
against the shell doing the same work: `du -sb` of the cache plus `rm -rf` of the same victims.
Both run in one go on identical copies (cp -a keeps the mtimes, so the least recently used entries
are the same); the script checks both copies end up holding the same entries, then prints the ratio
(target: within 1.5x).

Usage: python bench/bench_prune.py [N] [--dir DIR] [--keep]"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_cache import generate  # noqa: E402

TARGET = 1.5


def kcache(*args: str) -> list[str]:
    return [sys.executable, "-m", "kcache_cli", *args]


def entry_dirs(root: str) -> set[str]:
    out = set()
    ops = os.path.join(root, "ops")
    for space in os.listdir(ops):
        for op in os.listdir(os.path.join(ops, space)):
            for h in os.listdir(os.path.join(ops, space, op)):
                out.add(f"{space}/{op}/{h}")
    return out


def settle() -> None:
    """Let the filesystem finish writing back (and discarding) before a timed phase."""
    subprocess.run(["sync"])
    time.sleep(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", nargs="?", type=int, default=100_000, help="entries in the cache (default 100000)")
    ap.add_argument("--dir", help="where to build the caches (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the caches afterwards")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="kcache-bench-prune-")
    a, b = os.path.join(work, "kcache"), os.path.join(work, "shell")
    try:
        t = time.perf_counter()
        generate(a, args.n)
        subprocess.run(["cp", "-a", a, b], check=True)
        print(f"generated 2 x {args.n} entries in {time.perf_counter() - t:.0f}s ({work})")

        # the victims: what kcache would remove (a dry run on its own copy, untimed), mapped onto the shell's
        # copy. Planned on `a`, not `b`: `cp -a` read every file of `a`, so where the mount records reads (relatime)
        # `a`'s entries were all used just now, and kcache's last use (atime) orders them unlike `b`'s.
        plan = subprocess.run(kcache("--cache-dir", a, "prune", "--max-size", f"{10**18}B", "--dry-run", "--json"),
                              capture_output=True, text=True, check=True)
        total = json.loads(plan.stdout)["size_before"]
        half = total // 2
        plan = subprocess.run(kcache("--cache-dir", a, "prune", "--max-size", f"{half}B", "--dry-run", "--json"),
                              capture_output=True, text=True, check=True)
        removed = json.loads(plan.stdout)["removed"]  # least recently used first
        victims = [os.path.join(b, os.path.relpath(r["removed_path"], a)) for r in removed]
        # two rounds, each removing half of the victims, timed in the order kcache, shell, shell, kcache:
        # the disk's own drift (writeback, discards) then weighs on both sides alike
        cut = len(victims) // 2
        first_limit = total - sum(r["size"] for r in removed[:cut])
        rounds = [(first_limit, victims[:cut]), (half, victims[cut:])]
        for root in (a, b):  # same warm caches for both
            subprocess.run(["du", "-sb", root], capture_output=True, check=True)
        print(f"cache: {total} bytes in entries; limit {half}; {len(victims)} victims, in 2 rounds")

        def shell_round(batch: list[str]) -> float:
            listing = os.path.join(work, "victims")
            with open(listing, "wb") as f:
                f.write(b"\0".join(os.fsencode(v) for v in batch))
            settle()
            t = time.perf_counter()
            subprocess.run(["du", "-sb", b], capture_output=True, check=True)
            with open(listing, "rb") as f:
                subprocess.run(["xargs", "-0", "rm", "-rf", "--"], stdin=f, check=True)
            return time.perf_counter() - t

        def kcache_round(limit: int) -> tuple[float, dict]:
            settle()
            t = time.perf_counter()
            run = subprocess.run(kcache("--cache-dir", a, "-q", "prune", "--yes", "--max-size", f"{limit}B", "--json"),
                                 capture_output=True, text=True)
            took = time.perf_counter() - t
            if run.returncode != 0:
                sys.exit(f"kcache prune failed: {run.stderr}")
            return took, json.loads(run.stdout)

        k1, r1 = kcache_round(rounds[0][0])
        s1 = shell_round(rounds[0][1])
        s2 = shell_round(rounds[1][1])
        k2, r2 = kcache_round(rounds[1][0])
        ours, shell = k1 + k2, s1 + s2
        result = {"entries": r1["entry_count"] + r2["entry_count"], "freed": r1["freed"] + r2["freed"],
                  "size_after": r2["size_after"]}
        print(f"round 1: kcache {k1:.2f}s, shell {s1:.2f}s; round 2: shell {s2:.2f}s, kcache {k2:.2f}s")

        same = entry_dirs(a) == entry_dirs(b)
        print(f"du -sb + rm -rf of the victims: {shell:7.2f}s")
        print(f"kcache prune --max-size:        {ours:7.2f}s  ({result['entries']} entries, "
              f"{result['freed']} bytes freed, size after {result['size_after']} <= {half})")
        print(f"same entries left in both copies: {'yes' if same else 'NO'}")
        ratio = ours / shell
        print(f"ratio kcache/shell: {ratio:.2f}x (target <= {TARGET}x) -> {'OK' if ratio <= TARGET else 'SLOW'}")
        if not same:
            sys.exit(1)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
