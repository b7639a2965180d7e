"""What real hidet does with one cache entry: its own lookup-and-load path, on CPU.

Run by the hidet venv's python (tests/loaders/venvs.py): probe_hidet.py ROOT ENTRY SOURCE
  ROOT    a (damaged) copy of a hidet cache; hidet.option.cache_dir points at it
  ENTRY   ops/<target>_space_<level>/<op>/<hash> or graphs/<hash>, relative to ROOT
  SOURCE  the undamaged tree the copy was made from: the task is rebuilt from its task.pickle (hidet
          never reads an entry's own task files when it looks the entry up; it hashes the task in memory)
Prints one JSON line {"verdict": hit|reuse|recompile|crash, "detail": ...} (see matrix.py).

How the verdict is measured, never assumed: hidet's decisions are spied on where hidet makes them
(`verify_disk_cache` said yes → loaded as is; `compile_task_from_scratch` entered → it rewrote the
metadata; `should_skip_build` said no, or a compiler ran → it compiled). An operator is built with
`build_task` exactly as hidet's graph execution builds it; a cpu kernel is then called. A graph is loaded
with `load_compiled_graph` and, on cpu, run. CUDA entries are loaded (libcudart is on the library path)
but not run: there is no GPU. Events go to a file as well, since hidet may compile in worker processes.
"""

from __future__ import annotations

import os

from probe_common import crash_text, events, log, main, with_cudart


def _spy(module, name: str, before=None, after=None) -> None:
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        if before:
            before(*args, **kwargs)
        out = real(*args, **kwargs)
        if after:
            after(out, *args, **kwargs)
        return out

    setattr(module, name, wrapper)


def install_spies() -> None:
    import importlib

    # by module path: hidet.drivers re-exports functions under the same names as these modules
    backend = importlib.import_module("hidet.backend.build")
    build_module = importlib.import_module("hidet.drivers.build_module")
    build_task = importlib.import_module("hidet.drivers.build_task")

    _spy(build_task, "verify_disk_cache", after=lambda ok, *a, **k: log("cache-valid" if ok else "cache-invalid"))
    _spy(build_task, "compile_task_from_scratch", before=lambda *a, **k: log("rewrite"))
    _spy(build_module, "should_skip_build", after=lambda skip, *a, **k: log("skip-build" if skip else "build"))
    _spy(backend.SourceCompiler, "run_compile_command", before=lambda *a, **k: log("compiler"))


def _no_gpu_stream() -> None:
    """hidet's graph runner profiles each kernel through `current_stream().synchronize()` even on cpu; with
    no GPU that asks the CUDA driver and fails. Only that is replaced: nothing in the cache is involved."""
    import hidet.cuda

    class _Stream:
        def synchronize(self) -> None:
            pass

    hidet.cuda.current_stream = lambda *a, **k: _Stream()


def _inputs(signatures):
    import hidet

    return [hidet.randn([int(d) for d in s.shape], dtype=s.dtype, device="cpu") for s in signatures]


def probe_op(root: str, entry: str, source: str) -> str:
    import hidet

    _, space, _, _ = entry.split("/")
    target, level = space.split("_space_")
    hidet.option.search_space(int(level))
    pickle = os.path.join(source, entry, "task.pickle")
    if not os.path.exists(pickle):  # an entry without one (kcache build): make_hidet.py kept its task
        pickle = os.path.join(os.path.dirname(source), "tasks", os.path.basename(entry) + ".pickle")
    task = hidet.load_task(pickle)
    compiled = task.build(target)
    if target == "cpu":
        out = compiled(*_inputs(compiled.meta_data.inputs))
        return f"loaded and ran: output {list(out.shape)}"
    return "loaded (cuda: not run, no GPU)"


def probe_graph(root: str, entry: str) -> str:
    from hidet.runtime import load_compiled_graph

    graph = load_compiled_graph(os.path.join(root, entry))
    if all(s.device == "cpu" for s in graph.meta.inputs):
        _no_gpu_stream()
        out = graph(*_inputs(graph.meta.inputs))
        return f"loaded and ran: output {list(out.shape)}"
    return "loaded (cuda: not run, no GPU)"


def _reset() -> None:
    """A new case in the same process: hidet's in-memory cache of compiled tasks would answer first."""
    import importlib

    importlib.import_module("hidet.drivers.build_task").compiled_task_cache.cached.clear()


def probe_one(root: str, entry: str, source: str) -> tuple[str, str]:
    import hidet

    if not getattr(probe_one, "ready", False):
        hidet.option.parallel_build(False)
        install_spies()
        probe_one.ready = True  # type: ignore[attr-defined]
    _reset()
    hidet.option.cache_dir(root)
    error, detail = None, ""
    try:
        detail = probe_graph(root, entry) if entry.startswith("graphs/") else probe_op(root, entry, source)
    except Exception as exc:  # the loader's crash is the measurement
        error = crash_text(exc)
    seen = events()
    if "build" in seen or "compiler" in seen:
        return "recompile", error or detail
    if error is not None:
        return "crash", error
    return ("reuse" if "rewrite" in seen else "hit"), detail


if __name__ == "__main__":
    with_cudart()
    main(probe_one)
