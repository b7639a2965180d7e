"""`ls --op X` costs what X's entries cost (DESIGN.md section 8, issue 22): on a 100,000-entry hidet cache
where X holds 1/16 of the entries (6.25%), `kcache ls --op X --json` against `du -sb` of the whole cache.
Target: at most 0.3x. Without the whole-cache search for the newest version.txt, a filtered listing
reads only X's directories.

Usage: python bench/bench_op_filter.py [--entries 100000] [--runs 5] [--dir /tmp/kcache-bench-opfilter]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, ensure_cache, kcache_cmd, load  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--op", default="matmul")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "kcache-bench-opfilter"))
    args = ap.parse_args()
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("KCACHE_DIR", None)
    root = ensure_cache(Path(args.dir) / f"hidet-{args.entries}", args.entries)
    time.sleep(2.5)  # older than the index's racy window
    print(f"{args.entries} entries, --op {args.op} holds 1/16; cpus: {os.cpu_count()}, load: {load()}", flush=True)
    du = ["du", "-sb", str(root)]

    def kc(*a: str) -> list[str]:
        return kcache_cmd("--cache-dir", str(root), *a)

    compare(f"ls --op {args.op} --json --no-index", kc("ls", "--op", args.op, "--json", "--no-index"), du,
            args.runs, 0.3, env)
    compare(f"ls --op {args.op} --json (index)", kc("ls", "--op", args.op, "--json"), du, args.runs, 0.3, env)
    compare(f"ls --op {args.op} --space cuda_space_0 --json", kc("ls", "--op", args.op, "--space", "cuda_space_0",
                                                                  "--json"), du, args.runs, 0.3, env)
    compare("ls --json --no-index (whole cache, for scale)", kc("ls", "--json", "--no-index"), du, args.runs, 1.3,
            env)
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
