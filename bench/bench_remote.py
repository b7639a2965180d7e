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
3. Untrusted remotes, this tree against --baseline (a kcache checkout, /work/main by default), peak
   RSS of the kcache process (getrusage(RUSAGE_CHILDREN) in a wrapper) and wall time:
   `remote ls --json` of --index-entries (1,000,000) index entries, and `pull` of a 100 MiB Triton
   value that its group file names --repeats (8) times. The baseline's pull of step 1 is timed too
   (paired with this tree's), so that bounded reads are seen to cost nothing.

    python bench/bench_remote.py --only untrusted --index-entries 1000000 --repeats 8
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

from common import kcache_cmd, module_cmd
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


RSS_WRAPPER = """
import resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t, p.returncode)
"""


def tree_cmd(tree: Path | None, *args: str) -> tuple[list[str], dict]:
    """kcache of this tree, or of a baseline checkout (its sources first on the path)."""
    if tree is None:
        return kcache_cmd(*args), dict(os.environ)
    return module_cmd(*args), {**os.environ, "PYTHONPATH": str(tree)}


def peak(tree: Path | None, *args: str) -> tuple[float, float, int]:
    """(peak RSS in MB, wall seconds, exit status) of one kcache run."""
    cmd, env = tree_cmd(tree, *args)
    # `python -m` puts the working directory first on the path: the baseline runs from its own tree
    out = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *cmd], env=env, capture_output=True, text=True,
                         check=True, cwd=str(tree) if tree else None).stdout.split()
    return int(out[0]) / 1024, float(out[1]), int(out[2])


def ls_many(work: Path, url: str, n: int, baseline: Path | None) -> None:
    import json

    import redis

    r = redis.Redis.from_url(url)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        summary = {"layout": "hidet", "kind": "op", "target": "cpu", "space": "cpu_space_0", "op": f"op{i % 97}",
                   "hash": f"{i:016x}", "files": 10, "size": 35000, "pushed": "2026-01-01T00:00:00"}
        pipe.hset("kcache:v1:index", f"hidet:ops/cpu_space_0/op{i % 97}/{i:016x}", json.dumps(summary))
        if i % 20000 == 19999:
            pipe.execute()
    pipe.execute()
    for name, tree in (("this tree", None), ("baseline", baseline)):
        if name == "baseline" and tree is None:
            continue
        rss, secs, rc = peak(tree, "remote", "ls", "--remote", url, "--json")
        print(f"remote ls --json of {n} index entries  {name:9}  peak RSS {rss:7.1f} MB  {secs * 1000:8.1f} ms"
              f"  exit {rc}", flush=True)
    r.delete("kcache:v1:index")


def repeated_value(work: Path, url: str, times: int, baseline: Path | None) -> None:
    import json

    import redis

    r = redis.Redis.from_url(url)
    key = "f" * 64
    r.set(f"triton:{key}:k.cubin", os.urandom(1 << 20) * 100)
    r.set(f"triton:{key}:__grp__k.json", json.dumps({"child_paths": ["k.cubin"] * times}))
    for name, tree in (("this tree", None), ("baseline", baseline)):
        if name == "baseline" and tree is None:
            continue
        dest = work / f"triton-{name.replace(' ', '-')}"
        rss, secs, rc = peak(tree, "pull", "--cache-dir", str(dest), "--remote", url)
        print(f"pull of a 100 MiB value named {times} times  {name:9}  peak RSS {rss:7.1f} MB  {secs * 1000:8.1f} ms"
              f"  exit {rc}", flush=True)
        shutil.rmtree(dest, ignore_errors=True)
    r.delete(f"triton:{key}:k.cubin", f"triton:{key}:__grp__k.json")


def pull_vs_import(work: Path, url: str, n: int, repeat: int, baseline: Path | None = None) -> float:
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
    if baseline is not None:
        t_ours = t_base = float("inf")
        for _ in range(repeat):  # paired, alternating
            fresh(a)()
            t_ours = min(t_ours, peak(None, "pull", "--cache-dir", str(a), "--remote", url)[1])
            fresh(a)()
            t_base = min(t_base, peak(baseline, "pull", "--cache-dir", str(a), "--remote", url)[1])
        print(f"pull of {n} entries, this tree {t_ours * 1000:8.1f} ms  baseline {t_base * 1000:8.1f} ms  "
              f"ratio {t_ours / t_base:5.2f}x", flush=True)
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
    ap.add_argument("--baseline", default="/work/main" if os.path.isdir("/work/main/kcache_cli") else None,
                    help="a kcache checkout to compare with ('' for none)")
    ap.add_argument("--only", choices=("pull", "build", "untrusted"), action="append")
    ap.add_argument("--index-entries", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args()
    baseline = Path(args.baseline) if args.baseline else None
    only = set(args.only or ("pull", "build", "untrusted"))
    from redis_server import REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        print("redis-server not found (apt-get install redis-server)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-remote-", dir=args.dir))
    server = RedisServer(work / "redis")
    try:
        if "pull" in only:
            pull_vs_import(work, server.url, args.entries, args.repeat, baseline)
        if "build" in only:
            hit_vs_compile(work, server.url, args.repeat)
        if "untrusted" in only:
            ls_many(work, server.url, args.index_entries, baseline)
            repeated_value(work, server.url, args.repeats, baseline)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
