"""Pull from a shared cache against import of the same entries, and a build --remote hit against the
compile it saves; one run, one machine.

    python bench/bench_remote.py [--entries 1000] [--repeat 3] [--dir DIR]

1. A generated 1,000-entry hidet cache of real-sized entries (about 35 kB each, 10 files, like the
   fixtures' ops) is pushed to a local redis-server this script starts, and exported to a .tar.zst.
   Then `kcache pull` into an empty root against `kcache import` of the .tar.zst into an empty root,
   each a subprocess, alternating, best of --repeat. Target: pull within 1.5x of import.
2. `kcache build TASK --remote` on a second node where the remote has the entry (a pull, no compile)
   against the compile that the first node ran (the bare compiler command): nvcc for sm_90 where
   nvcc is installed (hidet's kernels are CUDA), else g++.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import kcache_cmd
from gen_cache import generate

TARGET = 1.5
CPU_TASK = """Task(
  name: bench_add
  parameters: 
    a: tensor(float32, [512])
  inputs: [a]
  outputs: [a]
  computations: 
    a: float32[512] where a[v] = a[v]
  attributes: {}
)"""
CUDA_SOURCE = """#include <cuda_runtime.h>
__global__ void bench_add(const float* a, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] * 2.0f + 1.0f;
}
extern "C" int launch_bench_add(const float* a, float* c, int n) {
    bench_add<<<(n + 255) / 256, 256>>>(a, c, n);
    return (int)cudaGetLastError();
}
"""
CPU_SOURCE = """#include <vector>
#include <algorithm>
#include <numeric>
extern "C" int bench_add(const float* a, float* c, int n) {
    std::vector<float> v(a, a + n);
    std::sort(v.begin(), v.end());
    std::partial_sum(v.begin(), v.end(), c);
    return 0;
}
"""


def best(cmd: list[str], before, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        before()
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return min(times)


def fresh(path: Path):
    def make() -> None:
        shutil.rmtree(path, ignore_errors=True)
    return make


def pull_vs_import(work: Path, url: str, n: int, repeat: int) -> float:
    src = work / "src"
    generate(str(src), n, lib_size=32768)
    archive = work / "entries.tar.zst"
    t_export = best(kcache_cmd("export", str(archive), "--cache-dir", str(src)), lambda: None, 1)
    t_push = best(kcache_cmd("push", "--cache-dir", str(src), "--remote", url), lambda: None, 1)
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    print(f"{n} entries, {size / 1e6:.1f} MB ({size / n / 1e3:.1f} kB each); archive "
          f"{archive.stat().st_size / 1e6:.1f} MB", flush=True)
    print(f"(once) push {t_push * 1000:.1f} ms, export .tar.zst {t_export * 1000:.1f} ms", flush=True)
    a, b = work / "pulled", work / "imported"
    t_import = t_pull = float("inf")
    for _ in range(repeat):  # alternate, so that a busy moment hurts both
        t_import = min(t_import, best(kcache_cmd("import", str(archive), "--cache-dir", str(b)), fresh(b), 1))
        t_pull = min(t_pull, best(kcache_cmd("pull", "--cache-dir", str(a), "--remote", url), fresh(a), 1))
    ratio = t_pull / t_import
    verdict = "OK" if ratio <= TARGET else "OVER TARGET"
    print(f"pull of {n} entries from Redis   kcache pull {t_pull * 1000:8.1f} ms  import .tar.zst "
          f"{t_import * 1000:8.1f} ms  ratio {ratio:5.2f}x (target <= {TARGET}x) {verdict}", flush=True)
    return ratio


def hit_vs_compile(work: Path, url: str, repeat: int) -> float:
    task = work / "task"
    task.mkdir()
    (task / "task.txt").write_text(CPU_TASK)
    nvcc = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.access("/usr/local/bin/nvcc", os.X_OK) else None)
    out = work / "bare.so"
    if nvcc:
        (task / "source.cu").write_text(CUDA_SOURCE)
        extra = ["--arch", "sm_90", "--nvcc", nvcc]
        compile_cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-O3", "-arch=sm_90", str(task / "source.cu"),
                       "-o", str(out)]
    else:
        (task / "source.cc").write_text(CPU_SOURCE)
        extra = []
        compile_cmd = [shutil.which("g++") or "g++", "-shared", "-fPIC", "-O3", str(task / "source.cc"), "-o", str(out)]
    node_a = work / "node-a"
    t = time.perf_counter()
    subprocess.run(kcache_cmd("build", str(task), "--cache-dir", str(node_a), "--remote", url, *extra), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = time.perf_counter() - t
    t_compile = best(compile_cmd, lambda: None, repeat)
    node_b = work / "node-b"
    t_hit = best(kcache_cmd("build", str(task), "--cache-dir", str(node_b), "--remote", url, *extra), fresh(node_b),
                 repeat)
    ratio = t_hit / t_compile
    name = os.path.basename(compile_cmd[0])
    print(f"build --remote: first node (compile + push) {first * 1000:.1f} ms", flush=True)
    print(f"build --remote hit (pull)        kcache {t_hit * 1000:8.1f} ms  bare {name} {t_compile * 1000:8.1f} ms  "
          f"ratio {ratio:5.2f}x (lower is better: the compile it saves)", flush=True)
    return ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args()
    from redis_server import REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        print("redis-server not found (apt-get install redis-server)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-remote-", dir=args.dir))
    server = RedisServer(work / "redis")
    try:
        pull_vs_import(work, server.url, args.entries, args.repeat)
        hit_vs_compile(work, server.url, args.repeat)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
