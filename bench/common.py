"""Helpers for the bench scripts: time whole commands, take medians, print ratios."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# `python -m kcache_cli` without the current directory first on sys.path (what -P does from Python 3.11):
# run from a tree's own directory, -m imports that tree's kcache_cli whatever PYTHONPATH names, and a
# comparison with another git ref then times this tree against itself.
KCACHE = [sys.executable, "-c", "import runpy, sys; del sys.path[0]; "
          "runpy.run_module('kcache_cli', run_name='__main__', alter_sys=True)"]


def module_cmd(*args: str) -> list[str]:
    """`python -m kcache_cli` (KCACHE): the entry point of whichever tree PYTHONPATH names (else the installed
    one), for comparisons with another git ref (the console script calls this tree's entry function, which
    an older tree may lack)."""
    return KCACHE + list(args)


def kcache_cmd(*args: str) -> list[str]:
    """The installed console script when it sits next to this Python (as a user runs it), else -m."""
    script = Path(sys.executable).with_name("kcache")
    return ([str(script)] if script.exists() else KCACHE) + list(args)


def wall(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> float:
    return timed(cmd, env, cwd)[0]


def timed(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the command and the children it waited for)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def compare(label: str, ours: list[str], baseline: list[str], runs: int, target: float,
            env: dict | None = None, warmup: int = 1, before=None, before_baseline=None) -> float:
    """Run the two commands alternately `runs` times (`before()` ahead of each of ours, and
    `before_baseline()` of each of the baseline's); print medians of wall and CPU time and the ratios
    ours/baseline. The wall ratio is the one judged; CPU time moves less with the load of a shared
    machine (forked workers count in it)."""
    def prepare(hook) -> None:
        if hook:
            hook()

    for _ in range(warmup):
        prepare(before)
        wall(ours, env)
        prepare(before_baseline)
        wall(baseline, env)
    a, b = [], []
    for _ in range(runs):
        prepare(before)
        a.append(timed(ours, env))
        prepare(before_baseline)
        b.append(timed(baseline, env))
    ma, mb = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
    ca, cb = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
    ratio = ma / mb
    verdict = "OK" if ratio <= target else "OVER TARGET"
    print(f"{label:<44} kcache {ma * 1000:8.1f} ms  baseline {mb * 1000:8.1f} ms  ratio {ratio:5.2f}x "
          f"(target <= {target}x) {verdict}; CPU {ca * 1000:.0f} vs {cb * 1000:.0f} ms: {ca / max(cb, 1e-9):.2f}x",
          flush=True)
    return ratio


def ensure_cache(root: Path, n: int, seed_layout: bool = False, equal_mtimes: bool = False) -> Path:
    """A generated hidet-style cache of n entries, made once and reused (marker file)."""
    marker = root / f".generated-{n}{'-seed' if seed_layout else ''}{'-equal' if equal_mtimes else ''}"
    if not marker.exists():
        import shutil

        sys.path.insert(0, str(BENCH))
        from gen_cache import generate

        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        t = time.perf_counter()
        print(f"generating {n} entries in {root} ...", file=sys.stderr, flush=True)
        generate(str(root), n, seed_layout=seed_layout, equal_mtimes=equal_mtimes)
        marker.touch()
        print(f"  done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return root


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def baseline_tree(ref: str, where: Path) -> Path:
    """kcache_cli as of git `ref` of this repository, exported into `where`: run a command with
    `PYTHONPATH=<where>` to time that tree against this one in the same window (never written to)."""
    where.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(BENCH.parent), "archive", ref, "kcache_cli"], capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where
