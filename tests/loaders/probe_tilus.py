"""What real tilus 0.2.0 does with one cache entry: its own jit-instance lookup and dispatch table, on CPU.

Run by the tilus venv's python (tests/loaders/venvs.py): probe_tilus.py ROOT ENTRY SOURCE
  ROOT    a (damaged) copy of a tilus cache; tilus.option.cache_dir points at it
  ENTRY   scripts/<name>/<jit key>-<h8> or programs/<h12>, relative to ROOT
  SOURCE  the undamaged tree: the script class is rebuilt from its scripts/<name>/*/source.txt (tilus
          transpiles a script from its Python source, so the probe writes it to a module file)
Prints {"verdict": hit|reuse|recompile|crash, "detail": ...} (see matrix.py).

The script is instantiated and asked for its program for n=1024 exactly as a call does
(`InstantiatedScript._jit_instance_for` then `JitInstance._pick_best_program`: build or load every
program, then the dispatch table), for the sm_90a target the cache was built for; nothing is launched
(no GPU). It reused a program when the one it loaded lacked program.txt or options.txt before (tilus rewrites
them); it compiled when `build_ir_module` ran (spied on). A program entry is judged by the script that uses it.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os

from probe_common import crash_text, events, log, main, with_cudart

HEADER = ("import tilus\nfrom tilus import float32, int32, void_p\nfrom tilus.utils import cdiv\n"
          "from tilus.ir.layout.ops import spatial\n\n")
ARGS = (1024, 0, 0)  # n, x_ptr, y_ptr: the fixture's tuning key 1024; pointers are never dereferenced


def install_spies() -> None:
    drivers = importlib.import_module("tilus.drivers")
    real_build = drivers.build_ir_module

    def build_ir_module(*args, **kwargs):
        log("build")
        return real_build(*args, **kwargs)

    drivers.build_ir_module = build_ir_module  # build_program calls it by its module-level name


def _unwritten(root: str) -> set[str]:
    """Programs lacking program.txt or options.txt now: tilus writes both when it looks them up."""
    out = set()
    for d in glob.glob(os.path.join(root, "programs", "*")):
        if not all(os.path.exists(os.path.join(d, n)) for n in ("program.txt", "options.txt")):
            out.add(os.path.realpath(d))
    return out


def _script_source(source: str, entry: str) -> str:
    found = sorted(glob.glob(os.path.join(source, "scripts", "*", "*", "source.txt")))
    if entry.startswith("scripts/"):
        found = [os.path.join(source, entry, "source.txt")] + found
    return found[0]


def probe_one(root: str, entry: str, source: str) -> tuple[str, str]:
    import tilus
    import tilus.target

    if not getattr(probe_one, "ready", False):
        tilus.target.set_current_target(tilus.target.nvgpu_sm90a)
        install_spies()
        probe_one.ready = True  # type: ignore[attr-defined]
    importlib.import_module("tilus.lang.instantiated_script").InstantiatedScriptCache.cache.clear()
    tilus.option.cache_dir(root)
    n = getattr(probe_one, "n", 0) + 1
    probe_one.n = n  # type: ignore[attr-defined]
    module = os.path.join(os.path.dirname(os.path.abspath(root)), f"tilus_script_{n}.py")
    with open(_script_source(source, entry)) as f, open(module, "w") as out:
        out.write(HEADER + f.read())
    error, detail = None, ""
    unwritten = _unwritten(root)
    try:
        spec = importlib.util.spec_from_file_location(f"tilus_script_{n}", module)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cls = next(v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, tilus.Script)
                   and v is not tilus.Script)
        instance = cls()._jit_instance_for(*ARGS)
        program = instance._pick_best_program(ARGS)
        detail = f"loaded {os.path.relpath(program.program_dir, root)} for {os.path.relpath(instance.cache_dir, root)}"
        if os.path.realpath(program.program_dir) in unwritten:
            log("rewrite")
    except Exception as exc:  # the loader's crash is the measurement
        error = crash_text(exc)
    seen = events()
    if "build" in seen:
        return "recompile", error or detail
    if error is not None:
        return "crash", error
    return ("reuse" if "rewrite" in seen else "hit"), detail


if __name__ == "__main__":
    with_cudart()
    main(probe_one)
