"""Triton's own cache lookup, run in a loader venv (triton 3.1, 3.2 or 3.9; no GPU needed).

    python probe_triton.py make ROOT           compile the kernels below into the cache ROOT; prints
                                               {"version", "kernels": {<key dir>: {"name", "detail"}}}
    python probe_triton.py ROOT ENTRY SOURCE   compile them again against ROOT and say what Triton
    python probe_triton.py --batch             did with the key directory ENTRY (probe_common.py)

The verdict is that of the kernel whose key directory is ENTRY's first component; the other kernels are
looked up too (a damage must not spill over), and a key no kernel here looks up is "unused".
A verdict is the loader's own behaviour, measured here, never assumed:
- hit: `triton.compile` returned the cached kernel without running a backend stage, and the cubin it
  returned is one the CUDA tools load (Triton's own `asm["sass"]`, which runs its cuobjdump);
- recompile: the stages ran, and a second `compile` then hit (Triton wrote over the entry);
- miss-forever: the stages ran again on the second `compile` (Triton never replaces what breaks it);
- crash: `compile` (or loading what it returned) raised.
Hit detection: 3.9's compilation listener (`knobs.compilation.listener`, cache_hit) and, for every
version, a wrapper around the backend's `add_stages` (the stages run only on a miss).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
if sys.argv[1] == "make":
    os.environ["TRITON_CACHE_DIR"] = os.path.abspath(sys.argv[2])

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from probe_common import main  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler import compiler as tcompiler  # noqa: E402
from triton.runtime import cache as tcache  # noqa: E402

V39 = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 3)


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


@triton.jit
def amd_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)


ADD = ("x_ptr:*fp32", "y_ptr:*fp32", "out_ptr:*fp32", "n:i32")
SCALE = ("x_ptr:*fp32", "out_ptr:*fp32", "n:i32")
# (name, function, signature, BLOCK, target: a CUDA compute capability or an AMD arch (3.9 only))
KERNELS = (("add_kernel", add_kernel, ADD, 256, 80), ("add_kernel", add_kernel, ADD, 1024, 90),
           ("scale_kernel", scale_kernel, SCALE, 128, 80)) + \
    ((("amd_kernel", amd_kernel, SCALE, 128, "gfx942"),) if V39 else ())


def source(fn, sig: tuple[str, ...], block: int) -> ASTSource:
    """The same kernel in each version's ASTSource spelling."""
    names = [s.split(":")[0] for s in sig]
    types = [s.split(":")[1] for s in sig]
    if V39:
        signature = dict(zip(names, types)) | {"BLOCK": "constexpr"}
        return ASTSource(fn=fn, signature=signature, constexprs={"BLOCK": block})
    if triton.__version__.startswith("3.2"):
        signature = dict(zip(names, types)) | {"BLOCK": "constexpr"}
        return ASTSource(fn=fn, signature=signature, constants={"BLOCK": block})
    return ASTSource(fn=fn, signature=dict(enumerate(types)), constants={len(types): block})


class Watch:
    """What one `compile` did: the key directory it looked in, and whether backend stages ran."""

    def __init__(self) -> None:
        self.dirs: list[str] = []
        self.stages = 0
        self.hit: bool | None = None
        init = tcache.FileCacheManager.__init__

        def record(mgr, key, *a, **kw):
            init(mgr, key, *a, **kw)
            if not (a or kw):
                self.dirs.append(os.path.basename(mgr.cache_dir))
        tcache.FileCacheManager.__init__ = record
        make = tcompiler.make_backend

        def backend(target):
            b = make(target)
            add = b.add_stages

            def counted(*args, **kwargs):
                self.stages += 1
                return add(*args, **kwargs)
            b.add_stages = counted
            return b
        tcompiler.make_backend = backend
        if V39:
            from triton import knobs

            def listen(*, cache_hit, **_):
                self.hit = cache_hit
            knobs.compilation.listener = listen


def sass(kernel) -> str:
    """The disassembly, by the cuobjdump Triton ships (what its own `asm["sass"]` runs), of the cubin
    `compile` returned: fails on a broken binary as loading it on a GPU would. One spelling for every
    version (3.1's `tools.disasm` imports a module it no longer has)."""
    import subprocess
    import tempfile

    if "hsaco" in kernel.asm:  # AMD: binutils' readelf over the code object hipModuleLoadData would load
        with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
            f.write(kernel.asm["hsaco"])
            f.flush()
            done = subprocess.run(["readelf", "-h", "-S", "-W", f.name], capture_output=True, text=True)
        if done.returncode != 0 or "Error" in done.stderr:
            raise RuntimeError(f"readelf: {done.stderr.strip()[:200]}")
        return done.stdout
    tool = os.path.join(os.path.dirname(tcompiler.__file__), "..", "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def once(watch: Watch, fn, sig, block, cc):
    """(key dir, ran stages, error) of one `triton.compile` and the load of what it returned."""
    watch.dirs.clear()
    before, watch.hit = watch.stages, None
    try:
        target = GPUTarget("hip", cc, 64) if isinstance(cc, str) else GPUTarget("cuda", cc, 32)
        k = triton.compile(source(fn, sig, block), target=target)
        if not sass(k).strip():
            raise RuntimeError("cuobjdump printed no SASS")
        err = None
    except BaseException as exc:  # noqa: BLE001 - any failure is the loader crashing
        err = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        if os.environ.get("PROBE_DEBUG"):
            traceback.print_exc()
    ran = watch.stages > before
    if V39 and watch.hit is not None and watch.hit == ran:
        err = err or f"the listener said cache_hit={watch.hit} while stages ran={ran}"
    return (watch.dirs[0] if watch.dirs else None), ran, err


WATCH: list[Watch] = []


def probe(make: bool) -> dict:
    if not WATCH:
        WATCH.append(Watch())
    watch = WATCH[0]
    out = {}
    for name, fn, sig, block, cc in KERNELS:
        key, ran, err = once(watch, fn, sig, block, cc)
        if make:
            out[key] = {"name": name, "verdict": "made", "detail": err or ""}
            continue
        if err:
            verdict, detail = "crash", err
        elif not ran:
            verdict, detail = "hit", "no backend stage ran"
        else:
            _, again, err2 = once(watch, fn, sig, block, cc)
            verdict = "crash" if err2 else ("miss-forever" if again else "recompile")
            detail = err2 or ("compiled again on a second lookup" if again else "compiled once, then hit")
        out[key or f"?{name}"] = {"name": name, "verdict": verdict, "detail": detail}
    return {"version": triton.__version__, "kernels": out}


def probe_one(root: str, entry: str, source: str) -> tuple[str, str]:
    os.environ["TRITON_CACHE_DIR"] = os.path.abspath(root)
    found = probe(False)
    key = os.path.normpath(entry).split(os.sep)[0]
    mine = found["kernels"].get(key)
    if mine is None:
        return "unused", f"no kernel Triton {found['version']} compiles looks up {key}"
    others = sorted(v["verdict"] for k, v in found["kernels"].items() if k != key and v["verdict"] != "hit")
    return mine["verdict"], mine["detail"] + (f" (other kernels: {', '.join(others)})" if others else "")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        print(json.dumps(probe(True)))
    else:
        main(probe_one)
