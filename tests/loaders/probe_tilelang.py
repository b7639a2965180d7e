"""tilelang 0.1.15's own disk-cache lookup, run in the tilelang loader venv (CPU only).

    python probe_tilelang.py ROOT ENTRY REF      (or --batch: probe_common.py)

ROOT is the (damaged) cache, ENTRY a kernel entry (`<version>/<platform>/kernels/<key>`) or binary entry
(`<version>/cuda-binaries/<key>`), REF an undamaged copy of the cache: REF says which binary format a
cuda-binaries entry holds (the format the caller would ask for).

Kernels go through tilelang's real `TVMFFIKernelCache._load_kernel_from_disk` (missing-file check,
manifest integrity check, params, `runtime.load_module` of executable.so): only the two adapter steps
that need the original PrimFunc (which a cache never holds) are stubbed. When it returns nothing, the
probe runs tilelang's own repair step of `_save_kernel_to_disk` (`_remove_incomplete_cache_dir`, then
the rename a fresh compile would publish): if the old directory is gone, tilelang recompiled over it
(recompile); if it stays, every later lookup misses again (miss-forever). Binaries go through
`CUDABinaryCache.load`; a miss there is forever, since `save` never replaces an existing directory.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# tilelang makes its namespace directories here when the cache object is made: the first case's root, or,
# for a batch, a directory of the probe's own (every case then names its entry's path itself)
if sys.argv[1] == "--batch":
    import atexit
    import shutil
    import tempfile

    os.environ["TILELANG_CACHE_DIR"] = tempfile.mkdtemp(prefix="tilelang-probe-")
    atexit.register(shutil.rmtree, os.environ["TILELANG_CACHE_DIR"], True)  # the probe's own scratch
else:
    os.environ["TILELANG_CACHE_DIR"] = os.path.abspath(sys.argv[1])

from probe_common import main  # noqa: E402
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


STATE: dict[str, object] = {}


def probe_one(root: str, entry: str, ref: str) -> tuple[str, str]:
    if not STATE:
        STATE["ctx"] = create_backend_context({"kind": "cuda", "arch": "sm_80"}, None, "tvm_ffi")
        STATE["cache"] = TVMFFIKernelCache()
    parts = os.path.normpath(entry).split(os.sep)
    path = os.path.join(os.path.abspath(root), *parts)
    if len(parts) == 4 and parts[2] == "kernels":
        return kernel_verdict(STATE["cache"], STATE["ctx"], path)  # type: ignore[arg-type]
    if len(parts) == 3 and parts[1] == "cuda-binaries":
        fmt = "fatbin" if os.path.exists(os.path.join(ref, entry, "kernel.fatbin")) else "cubin"
        return binary_verdict(path, fmt)
    return "unused", f"tilelang never looks {entry} up"


if __name__ == "__main__":
    main(probe_one)
