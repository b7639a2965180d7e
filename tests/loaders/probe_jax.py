"""Run by the jax venv's python (tests/loaders/venvs.py "jax"): with the persistent compilation cache at
argv[1] (a size cap set, as tests/fixtures/real/make/make_jax.py made it). `fill`: run `kc_affine` (the
cache then holds it). `probe`: first compile `kc_fresh`, a key the cache does not hold (written, or not
when the cache refuses writes), then run `kc_affine`; print one JSON line: {"hits": n
(/jax/compilation_cache/cache_hits while kc_affine ran), "written": bool (kc_fresh's -cache appeared),
"warnings": [jax's cache warnings]}. The key covers the function's source location: the cache must be
filled by this file."""

import glob
import json
import os
import sys
import warnings

import jax
import jax.numpy as jnp
from jax._src import monitoring

HITS = "/jax/compilation_cache/cache_hits"


def main() -> None:
    where = sys.argv[1]
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", 64 << 20)
    hits = []
    monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event == HITS else None)

    @jax.jit
    def kc_affine(x):
        return x * 2.0 + 1.0

    @jax.jit
    def kc_fresh(x):
        return x * 3.0 - 7.0

    x = jnp.ones(4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if sys.argv[2] == "probe":
            assert float(kc_fresh(x)[0]) == -4.0
        before = len(hits)
        assert list(map(float, kc_affine(jnp.arange(4.0)))) == [1.0, 3.0, 5.0, 7.0]
    written = bool(glob.glob(os.path.join(where, "jit_kc_fresh-*-cache")))
    print(json.dumps({"hits": len(hits) - before, "written": written,
                      "warnings": [str(w.message)[:300] for w in seen if "cache" in str(w.message)]}))


if __name__ == "__main__":
    main()
