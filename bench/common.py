"""Helpers for the bench scripts: time whole commands, take medians, print ratios."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
KCACHE = [sys.executable, "-m", "kcache_cli"]


def kcache_cmd(*args: str) -> list[str]:
    """The installed console script when it sits next to this Python (as a user runs it), else -m."""
    script = Path(sys.executable).with_name("kcache")
    return ([str(script)] if script.exists() else KCACHE) + list(args)


def wall(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env, cwd=cwd)
    return time.perf_counter() - t


def compare(label: str, ours: list[str], baseline: list[str], runs: int, target: float,
            env: dict | None = None, warmup: int = 1) -> float:
    """Run the two commands alternately `runs` times; print medians and the ratio ours/baseline."""
    for _ in range(warmup):
        wall(ours, env)
        wall(baseline, env)
    a, b = [], []
    for _ in range(runs):
        a.append(wall(ours, env))
        b.append(wall(baseline, env))
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = ma / mb
    verdict = "OK" if ratio <= target else "OVER TARGET"
    print(f"{label:<44} kcache {ma * 1000:8.1f} ms  baseline {mb * 1000:8.1f} ms  ratio {ratio:5.2f}x "
          f"(target <= {target}x) {verdict}", flush=True)
    return ratio


def ensure_cache(root: Path, n: int) -> Path:
    """A generated hidet-style cache of n entries, made once and reused (marker file)."""
    marker = root / f".generated-{n}"
    if not marker.exists():
        import shutil

        sys.path.insert(0, str(BENCH))
        from gen_cache import generate

        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        t = time.perf_counter()
        print(f"generating {n} entries in {root} ...", file=sys.stderr, flush=True)
        generate(str(root), n)
        marker.touch()
        print(f"  done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return root


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
