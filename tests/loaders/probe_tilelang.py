"""tilelang 0.1.15's own disk-cache lookup, run in the tilelang loader venv (CPU only).

    python probe_tilelang.py ROOT ENTRY REF

ROOT is the (damaged) cache, REF an undamaged copy of it: REF says which binary format each
cuda-binaries entry holds (the format the caller would ask for). Prints one JSON object:
{"version": "0.1.15", "kernels": {<relpath>: {"verdict", "detail"}}} for every kernel entry
(`<version>/<platform>/kernels/<key>`) and binary entry (`<version>/cuda-binaries/<key>`) in REF, then,
last, ENTRY's {"verdict", "detail"} (tests/loaders/matrix.py's run_probe).

Kernels go through tilelang's real `TVMFFIKernelCache._load_kernel_from_disk` (missing-file check,
manifest integrity check, params, `runtime.load_module` of executable.so): only the two adapter steps
that need the original PrimFunc (which a cache never holds) are stubbed. When it returns nothing, the
probe runs tilelang's own repair step of `_save_kernel_to_disk` (`_remove_incomplete_cache_dir`, then
the rename a fresh compile would publish): if the old directory is gone, tilelang recompiled over it
(recompile); if it stays, every later lookup misses again (miss-forever). Binaries go through
`CUDABinaryCache.load`; a miss there is forever, since `save` never replaces an existing directory.
"""

from __future__ import annotations

import json
import os
import sys

ROOT, ENTRY, REF = os.path.abspath(sys.argv[1]), sys.argv[2], os.path.abspath(sys.argv[3])
os.environ["TILELANG_CACHE_DIR"] = ROOT

import tilelang  # noqa: E402
from tilelang.backend.module import create_backend_context  # noqa: E402
from tilelang.cache.cuda_binary_cache import CUDABinaryCache  # noqa: E402
from tilelang.jit.adapter import tvm_ffi  # noqa: E402
from tilelang.jit.adapter.kernel_cache import TVMFFIKernelCache  # noqa: E402

# The only steps of the load that need the kernel's PrimFunc (never stored in the cache).
tvm_ffi.TVMFFIKernelAdapter._uses_ffi_callee_allocated_output_abi = lambda self: True
tvm_ffi.TVMFFIKernelAdapter._post_init = lambda self: None


def kernel_verdict(cache: TVMFFIKernelCache, ctx, path: str) -> tuple[str, str]:
    key = os.path.basename(path)
    cache._get_cache_path = lambda k, _p=path: _p  # the entry under test, whatever namespace it is in
    try:
        kernel = cache._load_kernel_from_disk(key, ctx, None, {}, None, None, False)
    except BaseException as exc:  # noqa: BLE001 - the loader crashing
        return "crash", f"{type(exc).__name__}: {exc}"[:200]
    if kernel is not None:
        return "hit", "loaded from disk"
    try:
        cache._remove_incomplete_cache_dir(path)
    except OSError as exc:
        return "miss-forever", f"repair failed ({type(exc).__name__}): the entry stays and misses again"
    if os.path.lexists(path):
        return "miss-forever", "load missed, and the entry is whole by name: a fresh compile cannot replace it"
    return "recompile", "load missed; tilelang removed the entry and publishes a fresh one"


def binary_verdict(path: str, fmt: str) -> tuple[str, str]:
    key = os.path.basename(path)
    CUDABinaryCache._get_cache_root = classmethod(lambda cls, _p=os.path.dirname(path): _p)
    try:
        data = CUDABinaryCache.load(key, fmt)
    except BaseException as exc:  # noqa: BLE001
        return "crash", f"{type(exc).__name__}: {exc}"[:200]
    if data is not None:
        return "hit", f"{len(data)} bytes"
    if os.path.lexists(path):
        return "miss-forever", "load missed and save never replaces an existing directory"
    return "recompile", "load missed; the directory is gone, so a fresh compile publishes one"


def main() -> dict:
    ctx = create_backend_context({"kind": "cuda", "arch": "sm_80"}, None, "tvm_ffi")
    cache = TVMFFIKernelCache()
    out = {}
    for version in sorted(os.listdir(REF)):
        vdir = os.path.join(REF, version)
        for platform in sorted(os.listdir(vdir)):
            kdir = os.path.join(vdir, platform, "kernels")
            if platform.startswith(".") or not os.path.isdir(kdir):
                continue
            for key in sorted(os.listdir(kdir)):
                rel = f"{version}/{platform}/kernels/{key}"
                verdict, detail = kernel_verdict(cache, ctx, os.path.join(ROOT, rel))
                out[rel] = {"verdict": verdict, "detail": detail}
        bdir = os.path.join(vdir, "cuda-binaries")
        for key in sorted(os.listdir(bdir)) if os.path.isdir(bdir) else ():
            fmt = "fatbin" if os.path.exists(os.path.join(bdir, key, "kernel.fatbin")) else "cubin"
            rel = f"{version}/cuda-binaries/{key}"
            verdict, detail = binary_verdict(os.path.join(ROOT, rel), fmt)
            out[rel] = {"verdict": verdict, "detail": detail}
    return {"version": tilelang.__version__, "kernels": out}


if __name__ == "__main__":
    found = main()
    print(json.dumps(found))
    print(json.dumps(found["kernels"].get(os.path.normpath(ENTRY))
                     or {"verdict": "unused", "detail": f"tilelang never looks {ENTRY} up"}))
