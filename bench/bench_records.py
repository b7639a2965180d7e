"""The per-entry record work of import, push, pull and `remote ls` (issue 23: one EntryKey held by every
record) against a baseline kcache_cli tree, in one run.

    git archive main kcache_cli | tar -x -C /tmp/kcache-base
    python bench/bench_records.py --baseline /tmp/kcache-base [--entries 20000] [--runs 7]

Each phase runs on `--entries` hidet manifest records, in a fresh interpreter per run, ours and the
baseline's alternately; the median counts. Phases: `records_from_json` (import's workers check every
record), `to_json` of each EntryRecord (export writes them), import's result lines (`_imported` and
`to_json`), push's result lines (`_moved`), and remote index entries (`remote_entry` and `to_json`).
Target: each phase at most 1.05x the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.05

_WORKER = r'''
import json, sys, time
from kcache_cli.archive.importer import _imported
from kcache_cli.archive.manifest import ImportLimits, records_from_json
from kcache_cli.remote.manage import remote_entry
from kcache_cli.remote.push import _moved

n = int(sys.argv[1])
raw = []
for i in range(n):
    h = f"{i:016x}"
    raw.append({"layout": "hidet", "kind": "op", "target": "cuda", "space": "cuda_space_0", "op": "add",
                "hash": h, "relpath": f"ops/cuda_space_0/add/{h}", "status": "complete", "compiler": "nvcc",
                "arch": "sm_90", "platform": None, "files": {n: [100 + j, "%064x" % (i * 8 + j)] for j, n in
                enumerate(("compile.sh", "lib.so", "meta.json", "source.cu", "task.txt", "version.txt"))},
                "links": {}, "dirs": [], "locks": [".lock"]})
out = {}
t = time.perf_counter(); recs = records_from_json(raw, 0, ImportLimits())
out["records_from_json"] = time.perf_counter() - t
t = time.perf_counter(); [r.to_json() for r in recs]; out["record_to_json"] = time.perf_counter() - t
t = time.perf_counter(); [_imported(r, 1000, "import", True, None).to_json(None) for r in raw]
out["import_lines"] = time.perf_counter() - t
t = time.perf_counter(); [_moved(r, "push", True, None).to_json() for r in recs]
out["push_lines"] = time.perf_counter() - t
summaries = [{k: r[k] for k in ("kind", "target", "space", "op", "hash")} | {"files": 6, "size": 600,
             "arch": "sm_90", "pushed": "2026-01-01T00:00:00+00:00"} for r in raw]
t = time.perf_counter(); [remote_entry("hidet", r["relpath"], s).to_json() for r, s in zip(raw, summaries)]
out["remote_entries"] = time.perf_counter() - t
print(json.dumps(out))
'''


def run(tree: str, entries: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run([sys.executable, "-c", _WORKER, str(entries)], env=env, capture_output=True, text=True,
                          check=True, cwd="/")
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="a directory holding the baseline's kcache_cli package")
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    ours: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    for _ in range(args.runs):
        ours.append(run(str(REPO), args.entries))
        base.append(run(args.baseline, args.entries))
    print(f"{args.entries} entries, median of {args.runs} alternating runs (load {os.getloadavg()[0]:.2f})")
    worst = 0.0
    for phase in ours[0]:
        a, b = statistics.median(r[phase] for r in ours), statistics.median(r[phase] for r in base)
        worst = max(worst, a / b)
        print(f"  {phase:18} ours {a * 1000:8.1f} ms   baseline {b * 1000:8.1f} ms   {a / b:5.2f}x")
    print(f"worst {worst:.2f}x (target <= {TARGET}x): {'ok' if worst <= TARGET else 'OVER'}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
