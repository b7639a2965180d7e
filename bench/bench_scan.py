"""Issue 2's speed targets, measured against baselines in the same run:

- `kcache stats --json` and `kcache ls --json` on a 100,000-entry hidet-style cache vs `du -sb` of the
  same tree (target within 1.3x);
- `kcache --version` vs a minimal Typer app (target within 1.3x).

Usage: python bench/bench_scan.py [--entries N] [--root DIR] [--runs R]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, compare, ensure_cache, kcache_cmd, load  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "kcache-bench-cache"))
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    root = ensure_cache(Path(args.root), args.entries)
    print(f"cache: {root} ({args.entries} entries), cpus: {os.cpu_count()}, load: {load()}")
    env = {**os.environ, "NO_COLOR": "1"}
    du = ["du", "-sb", str(root)]
    compare("stats --json vs du -sb", kcache_cmd("--cache-dir", str(root), "stats", "--json"), du, args.runs, 1.3, env)
    compare("ls --json vs du -sb", kcache_cmd("--cache-dir", str(root), "ls", "--json"), du, args.runs, 1.3, env)
    compare("ls --op matmul --json vs du -sb of ops/*/matmul",
            kcache_cmd("--cache-dir", str(root), "ls", "--op", "matmul", "--json"),
            ["sh", "-c", f"du -sb {root}/ops/*/matmul"], args.runs, 1.3, env)
    compare("--version vs minimal Typer app", kcache_cmd("--version"),
            [sys.executable, str(BENCH / "minimal_typer_app.py"), "--version"], max(args.runs, 20), 1.3, env)
    compare("dir vs minimal Typer app", kcache_cmd("--cache-dir", str(root), "dir"),
            [sys.executable, str(BENCH / "minimal_typer_app.py"), "--version"], max(args.runs, 20), 1.3, env)
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
