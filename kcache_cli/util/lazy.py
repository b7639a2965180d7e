"""Modules a command uses, named at the top of the command's module and loaded at their first use.

`kcache --help` and a TAB only declare commands; the engines a command's body calls come with the
command. `lazy_module(name)` is `import name` run when the first attribute is read (the standard
library's `importlib.util.LazyLoader`), so a command module lists every module it uses at its top
(tests/test_imports.py counts these as imports) and still starts in a minimal Typer app's time."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from types import ModuleType


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
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    if parent:
        setattr(sys.modules[parent], child, module)
    return module
