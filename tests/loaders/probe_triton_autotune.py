"""Run by a Triton venv (3.9 or 3.2; no GPU needed): the autotuner's own disk cache
(`Autotuner.check_disk_cache`, `cache_results=True`) against the cache $TRITON_CACHE_DIR, the device's
target given (the only thing here not Triton's own: `driver.active.get_current_target`, which needs a GPU).
Prints one JSON line: {"used": true} (Triton took the timings from `<fn>.autotune.json`, no benchmark),
{"used": false} (it benchmarked and wrote the file), or {"error": "..."} (its lookup raised)."""

import json
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class _Target:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"],
                 cache_results=True)
@triton.jit
def kc_tuned(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def main() -> None:
    driver.set_active(_Target())
    tuner = kc_tuned

    def bench() -> None:
        tuner.configs_timings = {c: [float(c.kwargs["BLOCK"])] for c in tuner.configs}

    try:
        out = {"used": tuner.check_disk_cache((1024,), tuner.configs, bench)}
    except Exception as exc:  # what Triton raised is the verdict
        out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
