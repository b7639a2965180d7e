"""Export and import of a 10,000-entry cache against GNU tar on the same tree, in one run.

    python bench/bench_archive.py [--entries 10000] [--repeat 3] [--dir DIR] [--baseline-ref REF] [--floor]

For each compression (gzip, zstd): `kcache export` against `tar -czf` / `tar --zstd -cf` of the
same cache, and `kcache import` into an empty root against `tar -xzf` / `tar --zstd -xf` into an
empty directory. Each command runs `--repeat` times (alternating with its baseline) and the best
time counts; kcache runs as a subprocess, start-up included, as tar does. Target:
within 1.2x of tar. The tree lives in DIR (default: /dev/shm when it exists, so that the disk's
writeback does not drown the comparison; pass --dir to measure a real disk). With --baseline-ref,
kcache as of that git ref runs alternately with this tree too, and the two are compared. With --floor,
bench/floor_export.py (the reads, hashes, headers and zstd of an export in Python, over the same
processes, and nothing else) runs alternately with the zstd export too: how far the export is from what
Python can do at all.
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

from common import baseline_tree, module_cmd  # noqa: E402
from gen_cache import generate  # noqa: E402

TARGET = 1.2


def timed(cmd: list[str], before=None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children: user + system)."""
    import resource

    if before:
        before()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def fresh(path: Path):
    def make() -> None:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
    return make


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--baseline-ref", help="also time kcache as of this git ref, alternating with this tree")
    ap.add_argument("--floor", action="store_true", help="also time bench/floor_export.py against tar --zstd")
    args = ap.parse_args()
    if shutil.which("tar") is None:
        print("tar not found", file=sys.stderr)
        return 1
    kcache = module_cmd("-q")
    load0 = _load()
    with tempfile.TemporaryDirectory(prefix="kcache-bench-archive-", dir=args.dir) as tmp:
        tmp = Path(tmp)
        root = tmp / "cache"
        generate(str(root), args.entries)
        base = None
        if args.baseline_ref:
            base = ["env", f"PYTHONPATH={baseline_tree(args.baseline_ref, tmp / 'base')}", *kcache]
        files = sum(len(f) for _, _, f in os.walk(root))
        print(f"cache: {args.entries} entries, {files} files in {root}")
        rows = []
        paired: list[tuple[str, float, float]] = []  # (what, this tree's best wall time, the baseline's)
        for comp, suffix, tar_c, tar_x in (("gzip", ".tar.gz", ["-czf"], ["-xzf"]),
                                           ("zstd", ".tar.zst", ["--zstd", "-cf"], ["--zstd", "-xf"])):
            ours, theirs = tmp / f"kcache{suffix}", tmp / f"tar{suffix}"
            exp: dict[str, list] = {"kcache": [], "tar": [], "base": [], "floor": []}
            imp: dict[str, list] = {"kcache": [], "tar": [], "base": []}
            for _ in range(args.repeat):
                exp["tar"].append(timed(["tar", *tar_c, str(theirs), "-C", str(root), "ops"]))
                exp["kcache"].append(timed([*kcache, "--cache-dir", str(root), "export", str(ours)]))
                if base:
                    exp["base"].append(timed([*base, "--cache-dir", str(root), "export", str(tmp / f"b{suffix}")]))
                if args.floor and comp == "zstd":
                    exp["floor"].append(timed([sys.executable, str(HERE / "floor_export.py"), str(root),
                                               str(tmp / "floor.tar.zst"), "--procs", str(os.cpu_count() or 1)]))
            for _ in range(args.repeat):
                dst_t, dst_k, dst_b = tmp / "dst-tar", tmp / "dst-kcache", tmp / "dst-base"
                imp["tar"].append(timed(["tar", *tar_x, str(theirs), "-C", str(dst_t)], fresh(dst_t)))
                imp["kcache"].append(timed([*kcache, "--cache-dir", str(dst_k), "import", str(ours), "--json"],
                                           fresh(dst_k)))
                if base:
                    imp["base"].append(timed([*base, "--cache-dir", str(dst_b), "import", str(ours), "--json"],
                                             fresh(dst_b)))
            n_k = sum(len(f) for _, _, f in os.walk(tmp / "dst-kcache" / "ops"))
            n_t = sum(len(f) for _, _, f in os.walk(tmp / "dst-tar" / "ops"))
            if n_k != n_t:
                print(f"MISMATCH: kcache imported {n_k} files, tar extracted {n_t}", file=sys.stderr)
                return 1
            if exp["floor"]:
                rows.append(("floor zstd", min(exp["floor"]), min(exp["tar"])))
            for what, times in (("export", exp), ("import", imp)):
                k, t = min(times["kcache"]), min(times["tar"])  # the best wall time, with its CPU time
                rows.append((f"{what} {comp}", k, t))
                if base:
                    paired.append((f"{what} {comp}", k[0], min(times["base"])[0]))
            rows.append((f"size {comp}", ours.stat().st_size / 1e6, theirs.stat().st_size / 1e6))
        print(f"load average before: {load0}, after: {_load()} ({os.cpu_count()} cpus)")
        print(f"{'':<16}{'kcache':>9}{'tar':>9}{'ratio':>8}   {'kcache cpu':>10}{'tar cpu':>9}{'ratio':>8}")
        worst = 0.0
        for name, k, t in rows:
            if name.startswith("size"):
                print(f"{name + ' (MB)':<16}{k:>9.2f}{t:>9.2f}{k / t:>7.2f}x")
                continue
            print(f"{name:<16}{k[0]:>8.2f}s{t[0]:>8.2f}s{k[0] / t[0]:>7.2f}x   {k[1]:>9.2f}s{t[1]:>8.2f}s"
                  f"{k[1] / t[1]:>7.2f}x")
            if not name.startswith("floor"):
                worst = max(worst, k[0] / t[0])
        verdict = "within" if worst <= TARGET else "OVER"
        print(f"worst wall-time ratio {worst:.2f}x: {verdict} the {TARGET}x target")
        for name, k, b in paired:
            print(f"{name:<16} this tree {k:.2f}s, {args.baseline_ref} {b:.2f}s: {k / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
