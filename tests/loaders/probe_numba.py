"""Run by the numba venv's python (tests/loaders/venvs.py "numba") with NUMBA_CACHE_DIR set, or empty
(then numba caches in `__pycache__/` beside the source): import argv[1]'s kc_numba
(tests/fixtures/real/make/kc_numba.py, copied there; argv[2]: the module's name when it was renamed),
call `kc_add` for (int64, int64) and (float64, float64), and print one JSON line: {"hits": n,
"misses": n} from the dispatcher's stats (numba's own cache counters; "jit": false added when
NUMBA_DISABLE_JIT left a plain function), or {"error": "..."} when numba's call raised."""

import importlib
import json
import sys


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    kc_numba = importlib.import_module(sys.argv[2] if len(sys.argv) > 2 else "kc_numba")

    try:
        assert kc_numba.kc_add(1, 2) == 3 and kc_numba.kc_add(1.5, 2.0) == 3.5
    except Exception as exc:  # what numba raised is the verdict
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}))
        return
    stats = getattr(kc_numba.kc_add, "stats", None)
    if stats is None:  # NUMBA_DISABLE_JIT: the plain Python function, no cache read or written
        print(json.dumps({"hits": 0, "misses": 0, "jit": False}))
        return
    print(json.dumps({"hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}))


if __name__ == "__main__":
    main()
