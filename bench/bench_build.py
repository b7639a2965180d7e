"""Benchmark `kcache build` against its baselines, in the same run, and print the ratios.

    python bench/bench_build.py [--runs N] [--hit-runs N] [--arch sm_90]

* miss: `kcache build` of a new task vs the bare `nvcc -shared -Xcompiler -fPIC -O3 -arch=ARCH`
  on the same source (target: within 1.05x);
* hit: `kcache build` of a task already in the cache (default arch: nvcc's default, memoised) vs
  a minimal Typer app doing nothing (target: within 1.3x);
* parallel: 8 new CUDA tasks with `-j 2` vs `-j 1` (target: at most 0.6x).

Runs are interleaved (baseline, kcache, baseline, ...) and medians compared, so that load on the
machine hits both sides alike. Python writes bytecode for these runs (as an installed kcache has
it), even when PYTHONDONTWRITEBYTECODE is set in the calling shell.
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

TASK = """Task(
  name: {name}
  parameters: 
    a: tensor(float32, [{n}])
    b: tensor(float32, [{n}])
    c: tensor(float32, [{n}])
  inputs: [a, b]
  outputs: [c]
  computations: 
    c: float32[{n}] where c[v] = (a[v] + b[v])
  attributes: {{}}
)"""

SOURCE = """#include <cuda_runtime.h>
__global__ void {name}_kernel(const float* a, const float* b, float* c, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i] * {n}.0f;
}}
extern "C" int launch_{name}(const float* a, const float* b, float* c, int n) {{
    {name}_kernel<<<(n + 255) / 256, 256>>>(a, b, c, n);
    return (int)cudaGetLastError();
}}
"""

MINIMAL_TYPER = """import typer

app = typer.Typer()


@app.command()
def main() -> None:
    pass


app()
"""


def make_task(where: Path, name: str, n: int) -> Path:
    d = where / f"{name}_{n}"
    d.mkdir(parents=True)
    (d / "task.txt").write_text(TASK.format(name=name, n=n))
    (d / "source.cu").write_text(SOURCE.format(name=name, n=n))
    return d


def kcache_cmd() -> list[str]:
    script = Path(sys.executable).with_name("kcache")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kcache_cli"]


def timed(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode(errors='replace')}")
    return elapsed


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="interleaved runs for the miss comparison")
    ap.add_argument("--hit-runs", type=int, default=30, help="interleaved runs for the hit comparison")
    ap.add_argument("--tasks", type=int, default=8, help="tasks for the -j comparison")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()

    nvcc = os.environ.get("KCACHE_NVCC") or shutil.which("nvcc") or "/usr/local/bin/nvcc"
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("KCACHE_DIR", None)
    kc = kcache_cmd()
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-build-"))
    results: dict[str, float] = {}
    try:
        root = work / "cache"
        tasks = work / "tasks"
        typer_app = work / "minimal_typer.py"
        typer_app.write_text(MINIMAL_TYPER)
        # warm-up: bytecode, the nvcc binary in the page cache, kcache's compiler memo
        warm = make_task(tasks, "warm", 1)
        timed(kc + ["--cache-dir", str(root), "build", str(warm / "task.txt")], env=env)
        timed([sys.executable, str(typer_app)], env=env)

        # -- miss: kcache build of a new task vs the same bare nvcc command
        bare, built = [], []
        for i in range(args.runs):
            t = make_task(tasks, "miss", 100 + i)
            scratch = work / f"bare{i}"
            scratch.mkdir()
            shutil.copy(t / "source.cu", scratch / "source.cu")
            bare.append(timed([nvcc, "-shared", "-Xcompiler", "-fPIC", "-O3", f"-arch={args.arch}", "-o", "lib.so",
                               "source.cu"], cwd=scratch, env=env))
            built.append(timed(kc + ["--cache-dir", str(root), "build", str(t / "task.txt"), "--arch", args.arch],
                               env=env))
        b, k = statistics.median(bare), statistics.median(built)
        results["miss"] = k / b
        print(f"miss:     bare nvcc {ms(b)}, kcache build {ms(k)} (medians of {args.runs}): "
              f"ratio {k / b:.3f} (target <= 1.05)")

        # -- hit: an entry already built (default arch) vs a minimal Typer app
        base, hit = [], []
        hit_cmd = kc + ["--cache-dir", str(root), "build", str(warm / "task.txt")]
        for _ in range(args.hit_runs):
            base.append(timed([sys.executable, str(typer_app)], env=env))
            hit.append(timed(hit_cmd, env=env))
        b, k = statistics.median(base), statistics.median(hit)
        results["hit"] = k / b
        print(f"hit:      minimal Typer app {ms(b)}, kcache build (hit) {ms(k)} (medians of {args.hit_runs}): "
              f"ratio {k / b:.3f} (target <= 1.3)")

        # -- parallel: N new tasks with -j 2 vs -j 1
        batch1, batch2 = work / "j1", work / "j2"
        for i in range(args.tasks):
            make_task(batch1, "par", 1000 + i)
            make_task(batch2, "par", 2000 + i)
        j1 = timed(kc + ["--cache-dir", str(work / "cache-j1"), "build", str(batch1), "-j", "1",
                         "--arch", args.arch], env=env)
        j2 = timed(kc + ["--cache-dir", str(work / "cache-j2"), "build", str(batch2), "-j", "2",
                         "--arch", args.arch], env=env)
        results["parallel"] = j2 / j1
        print(f"parallel: {args.tasks} tasks -j 1 {j1:.2f} s, -j 2 {j2:.2f} s: ratio {j2 / j1:.3f} "
              f"(target <= 0.6; {os.cpu_count()} cores)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = results["miss"] <= 1.05 and results["hit"] <= 1.3 and results["parallel"] <= 0.6
    print("all targets met" if ok else "some targets missed")


if __name__ == "__main__":
    main()
