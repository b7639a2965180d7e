"""Modules a command uses, named at the top of the command's module and loaded at their first use.

`kcache --help` and a TAB only declare commands; the engines a command's body calls come with the
command. `lazy_module(name)` is `import name` run when the first attribute is read (the standard
library's `importlib.util.LazyLoader`, its module safe for threads as Python 3.13's: _LazyModule), so a
command module lists every module it uses at its top (tests/test_imports.py counts these as imports) and
still starts in a minimal Typer app's time."""

from __future__ import annotations

import _thread  # the interpreter's own: a lock without loading threading
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any


def lazy_module(name: str) -> ModuleType:
    """The module `name`: the one already imported, else one whose code runs at its first attribute.
    Its packages are found without being run either; so a package must not import its own modules in its
    __init__ (one of them loaded first would meet itself half loaded there: kcache_cli/archive/__init__.py
    hands its names on at first use instead)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    parent, _, child = name.rpartition(".")
    path = None
    if parent:
        # the spec straight from the module's dict: any other attribute would run a lazy package
        path = object.__getattribute__(lazy_module(parent), "__spec__").submodule_search_locations
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = _LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


class _LazyLoader(importlib.util.LazyLoader):
    """The standard library's LazyLoader, making the module a _LazyModule."""

    def exec_module(self, module: ModuleType) -> None:
        loader = self.loader  # type: ignore[attr-defined]  # LazyLoader's own (typeshed does not name it)
        spec: Any = module.__spec__  # module_from_spec gave it one
        spec.loader = module.__loader__ = loader
        spec.loader_state = {"__dict__": module.__dict__.copy(), "lock": _thread.RLock(), "loading": False}
        module.__class__ = _LazyModule


class _LazyModule(ModuleType):
    """importlib.util's _LazyModule as Python 3.12.3 and 3.13 have it (gh-114763): the first attribute read
    runs the module's code under a lock, and another thread reading one meanwhile waits for it. Python
    3.11's made the module a plain one before running its code: a second thread read the half-run module
    and got an AttributeError (a scan's worker threads, started when the disk is slow, hashing their first
    files at once: "module 'hashlib' has no attribute 'sha256'")."""

    def __getattribute__(self, attr: str) -> Any:
        spec = object.__getattribute__(self, "__spec__")
        state = spec.loader_state
        with state["lock"]:
            if object.__getattribute__(self, "__class__") is _LazyModule:
                if state["loading"]:  # its own code, reading the module while it runs: as a plain import would
                    return ModuleType.__getattribute__(self, attr)
                state["loading"] = True
                _run(self, spec, state["__dict__"])
        return getattr(self, attr)

    def __delattr__(self, attr: str) -> None:
        self.__getattribute__(attr)  # loaded first (and an AttributeError if it has no such attribute)
        delattr(self, attr)


def _run(module: ModuleType, spec: Any, then: dict) -> None:
    """Run the module's code into it, keep what was set on it meanwhile (a submodule named on its package),
    and make it a plain module."""
    now = ModuleType.__getattribute__(module, "__dict__")
    updated = {key: value for key, value in now.items() if key not in then or then[key] is not value}
    spec.loader.exec_module(module)
    if sys.modules.get(spec.name, module) is not module:
        raise ValueError(f"module object for {spec.name!r} substituted in sys.modules during a lazy load")
    now.update(updated)
    object.__setattr__(module, "__class__", ModuleType)
