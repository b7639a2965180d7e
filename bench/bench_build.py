"""Benchmark `kcache build` against its baselines, in the same run, and print the ratios.

    python bench/bench_build.py [--runs N] [--hit-runs N] [--arch sm_90]

* miss: `kcache build` of a new task vs the bare `nvcc -shared -Xcompiler -fPIC -O3 -arch=ARCH`
  on the same source (target: within 1.05x), for a small vector add (about 1 s of nvcc) and a
  heavier kernel (a few seconds);
* hit: `kcache build` of a task already in the cache (default arch: nvcc's default, memoised) vs
  a minimal Typer app doing nothing (target: within 1.3x);
* parallel: 8 new CUDA tasks with `-j 2` vs `-j 1` (target: at most 0.6x).

Runs are interleaved (baseline, kcache, baseline, ...) and medians compared, so that load on the
machine hits both sides alike. CPU time (user + system of the process and its children) is printed
too: on a busy machine it moves much less than wall-clock time. Python writes bytecode for these runs
(as an installed kcache has it), even when PYTHONDONTWRITEBYTECODE is set in the calling shell.
"""

from __future__ import annotations

import argparse
import os
import resource
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

# A heavier kernel (16 unrolled template instances, a few seconds of nvcc): the same fixed cost of
# kcache shows as a smaller share of a longer compile.
LARGE_SOURCE = """#include <cuda_runtime.h>
template <int N, int M> __global__ void stencil_{name}(const float* __restrict__ a, float* __restrict__ b, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.f;
    #pragma unroll
    for (int k = 0; k < N; ++k) {{ acc += a[(i + k * M) % n] * (k + {n}) - a[(i * M + k) % n] * 0.5f; }}
    b[i % n] = acc;
}}
""" + "".join(f"template __global__ void stencil_{{name}}<{N}, {M}>"
              "(const float* __restrict__, float* __restrict__, int);\n"
              for N in (16, 32) for M in range(1, 9))

MINIMAL_TYPER = """import typer

app = typer.Typer()


@app.command()
def main() -> None:
    pass


app()
"""


def make_task(where: Path, name: str, n: int, large: bool = False) -> Path:
    d = where / f"{name}_{n}"
    d.mkdir(parents=True)
    (d / "task.txt").write_text(TASK.format(name=name, n=n))
    (d / "source.cu").write_text((LARGE_SOURCE if large else SOURCE).format(name=name, n=n))
    return d


def kcache_cmd() -> list[str]:
    script = Path(sys.executable).with_name("kcache")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kcache_cli"]


class Sample:
    """Wall-clock and CPU (user + system, the process and everything it waited for) seconds."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def run(self, cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode(errors='replace')}")


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def compare(label: str, base_name: str, base: Sample, name: str, ours: Sample, target: float) -> float:
    """Print wall and CPU medians and their ratios; the wall ratio is the one judged."""
    bw, kw = statistics.median(base.wall), statistics.median(ours.wall)
    bc, kc = statistics.median(base.cpu), statistics.median(ours.cpu)
    print(f"{label:9} {base_name} {ms(bw)}, {name} {ms(kw)}: ratio {kw / bw:.3f} (target <= {target}); "
          f"CPU {ms(bc)} vs {ms(kc)}: ratio {kc / bc:.3f}  [medians of {len(base.wall)}]")
    return kw / bw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="interleaved runs for the miss comparison")
    ap.add_argument("--large-runs", type=int, default=3, help="interleaved runs with the heavier kernel (0: skip)")
    ap.add_argument("--hit-runs", type=int, default=30, help="interleaved runs for the hit comparison")
    ap.add_argument("--tasks", type=int, default=8, help="tasks for the -j comparison")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the -j comparison")
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
        Sample().run(kc + ["--cache-dir", str(root), "build", str(warm / "task.txt")], env=env)
        Sample().run([sys.executable, str(typer_app)], env=env)

        # -- miss: kcache build of a new task vs the same bare nvcc command
        for label, large, runs in (("miss:", False, args.runs), ("miss big:", True, args.large_runs)):
            if runs <= 0:
                continue
            bare, built = Sample(), Sample()
            for i in range(runs):
                t = make_task(tasks, "big" if large else "miss", 100 + i, large)
                scratch = work / f"bare-{t.name}"
                scratch.mkdir()
                shutil.copy(t / "source.cu", scratch / "source.cu")
                bare.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-O3", f"-arch={args.arch}", "-o", "lib.so",
                          "source.cu"], cwd=scratch, env=env)
                built.run(kc + ["--cache-dir", str(root), "build", str(t / "task.txt"), "--arch", args.arch],
                          env=env)
            results["miss_large" if large else "miss"] = compare(label, "bare nvcc", bare, "kcache build", built,
                                                                 1.05)
            print(f"{'':9} kcache's fixed cost on a miss (start-up, lock, files, fsync, publish): "
                  f"{ms(statistics.median(built.wall) - statistics.median(bare.wall))} wall, "
                  f"{ms(statistics.median(built.cpu) - statistics.median(bare.cpu))} CPU")

        # -- hit: an entry already built (default arch) vs a minimal Typer app
        base, hit = Sample(), Sample()
        hit_cmd = kc + ["--cache-dir", str(root), "build", str(warm / "task.txt")]
        for _ in range(args.hit_runs):
            base.run([sys.executable, str(typer_app)], env=env)
            hit.run(hit_cmd, env=env)
        results["hit"] = compare("hit:", "minimal Typer app", base, "kcache build (hit)", hit, 1.3)

        # -- parallel: N new tasks with -j 2 vs -j 1
        j1, j2 = Sample(), Sample()
        for r in range(args.rounds):
            batch1, batch2 = work / f"j1-{r}", work / f"j2-{r}"
            for i in range(args.tasks):
                make_task(batch1, "par", 1000 + 100 * r + i)
                make_task(batch2, "par", 5000 + 100 * r + i)
            j1.run(kc + ["--cache-dir", str(work / f"cache-j1-{r}"), "build", str(batch1), "-j", "1",
                         "--arch", args.arch], env=env)
            j2.run(kc + ["--cache-dir", str(work / f"cache-j2-{r}"), "build", str(batch2), "-j", "2",
                         "--arch", args.arch], env=env)
        w1, w2 = statistics.median(j1.wall), statistics.median(j2.wall)
        results["parallel"] = w2 / w1
        print(f"parallel: {args.tasks} tasks -j 1 {w1:.2f} s, -j 2 {w2:.2f} s: ratio {w2 / w1:.3f} "
              f"(target <= 0.6; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = results["miss"] <= 1.05 and results["hit"] <= 1.3 and results["parallel"] <= 0.6
    print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          "(wall-clock ratios need a quiet machine)")
    print("all targets met" if ok else "some targets missed")


if __name__ == "__main__":
    main()
