"""The house kcache_cli lives in, checked on its imports: every module stands on a floor, imports only
from its own floor or below, and the import graph has no cycle. Every import counts: at module level,
inside functions and under TYPE_CHECKING (a type-only import still ties the two modules together).

Floors, lowest first (STYLE.md, "For kcache"): file-system primitives -> the data model -> layouts/ ->
the engines -> cli/. A new module gets a line in `FLOORS` (the test says which one is missing)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parents[1] / "kcache_cli"

PRIMITIVES, MODEL, LAYOUTS, ENGINES, CLI = range(5)
FLOOR_NAMES = ("primitives", "model", "layouts", "engines", "cli")

# The floors are folders: a package line covers its submodules, and no module sits loose at the top but
# the package itself, its __main__ and the Triton hook (a public name: TRITON_CACHE_MANAGER points at it).
FLOORS: dict[str, int] = {
    "kcache_cli": PRIMITIVES,  # the package itself holds only __version__
    # the lowest floor: file-system primitives, small services, and bytes other tools wrote
    "kcache_cli.fs": PRIMITIVES,  # held directory fds: read, write, delete; .kcache/ state, locks, read-marks
    "kcache_cli.util": PRIMITIVES,  # errors, units, terminal-safe text, worker pools, progress, signing
    "kcache_cli.formats": PRIMITIVES,  # task files, ELF/cubin, GPU arch names, torch's Mega-Cache framing
    # the data model: records, the vocabulary, judging helpers and the registry of path shapes
    "kcache_cli.model": MODEL,
    "kcache_cli.layouts.shapes": MODEL,  # the registry of path shapes: data the vocabulary's names come from
    # one module per cache layout
    "kcache_cli.layouts": LAYOUTS,
    # the engines: what a command knows (catalog), what it does (ops), archives and remotes
    "kcache_cli.catalog": ENGINES,
    "kcache_cli.ops": ENGINES,
    "kcache_cli.archive": ENGINES,
    "kcache_cli.remote": ENGINES,
    "kcache_cli.triton_hook": ENGINES,  # a Triton cache manager that stamps hits
    # the command line
    "kcache_cli.cli": CLI,
    "kcache_cli.__main__": CLI,
}
LOOSE = frozenset({"kcache_cli", "kcache_cli.__main__", "kcache_cli.triton_hook"})


# Modules of layouts/ every layout module may import; any other module there is one layout's own (its
# `<name>.py`, or a helper `<name>_*.py` of that layout alone, like triton_remote.py).
LAYOUT_SHARED = frozenset({"kcache_cli.layouts", "kcache_cli.layouts.base", "kcache_cli.layouts._common",
                           "kcache_cli.layouts.shapes", "kcache_cli.layouts._facts",
                           "kcache_cli.layouts.remote_format", "kcache_cli.layouts.image_format",
                           "kcache_cli.layouts.homes"})


class Cycle(NamedTuple):
    path: list[str]  # a shortest cycle through the component's first module, first == last
    members: list[str]  # every module of the strongly connected component

    def __str__(self) -> str:
        others = sorted(set(self.members) - set(self.path))
        return " -> ".join(self.path) + (f"   (the circle also takes in {', '.join(others)})" if others else "")


class Edge(NamedTuple):
    importer: str
    imported: str
    where: str  # "kcache_cli/layouts/base.py:31"


def floor_of(module: str, floors: dict[str, int] = FLOORS) -> int | None:
    """The floor of the longest entry of `floors` that is `module` or a package holding it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        floor = floors.get(".".join(parts[:n]))
        if floor is not None:
            return floor
    return None


def _module_name(path: Path, top: Path) -> tuple[str, bool]:
    """(dotted name, is a package) of a source file under `top`'s parent."""
    parts = list(path.relative_to(top.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of `name` that is one of `modules` (an imported attribute -> its module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """The modules of `modules` an import statement in `module` loads (relative imports resolved)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            up = package[: len(package) - node.level + 1]
            base = ".".join(up + ([base] if base else []))
        # `from pkg import sub` loads pkg.sub when that is a module, else an attribute of pkg
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = (_known(n, modules) for n in names)
    return sorted({t for t in found if t is not None and t != module})


def import_edges(sources: dict[Path, str], top: Path) -> list[Edge]:
    """Every import from one module under `top` to another, with where it is written."""
    named = {path: _module_name(path, top) for path in sources}
    modules = {name for name, _ in named.values()}
    edges = []
    for path, text in sources.items():
        module, is_package = named[path]
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                where = f"{path.relative_to(top.parent)}:{node.lineno}"
                edges += [Edge(module, t, where) for t in _targets(node, module, is_package, modules)]
            elif _lazy_target(node) in modules:  # lazy_module("kcache_cli.x"): an import run at first use
                edges.append(Edge(module, _lazy_target(node), f"{path.relative_to(top.parent)}:{node.lineno}"))
    return edges


def _lazy_target(node: ast.AST) -> str | None:
    """The module a `lazy_module("...")` call names (kcache_cli/util/lazy.py), else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "lazy_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def cycles(edges: list[Edge]) -> list[Cycle]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, []).append(e.imported)
        graph.setdefault(e.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(set(graph[start]))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(set(graph[child])))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [Cycle(_cycle_in(graph, c), c) for c in components]


def _cycle_in(graph: dict[str, list[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, found breadth-first inside it."""
    members, start = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(set(graph[node]) & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in the component {component}")


def upward(edges: list[Edge], floors: dict[str, int] = FLOORS) -> list[str]:
    """Each import of a module on a higher floor, as a line to print."""
    out = []
    for e in edges:
        low, high = floor_of(e.importer, floors), floor_of(e.imported, floors)
        if low is not None and high is not None and high > low:
            out.append(f"{e.where}: {e.importer} ({FLOOR_NAMES[low]}) imports {e.imported} ({FLOOR_NAMES[high]})")
    return out


def between_layouts(edges: list[Edge], package: str = "kcache_cli.layouts",
                    shared: frozenset[str] = LAYOUT_SHARED) -> list[str]:
    """Each import of one layout's module by another layout's (`inductor` importing `triton`), as a line to
    print. A layout reaches another through the registry at run time, and shares code through `_common`."""
    def owner(module: str) -> str | None:
        if not module.startswith(package + ".") or module in shared:
            return None
        return module[len(package) + 1:].split(".")[0].split("_")[0] or None

    out = []
    for e in edges:
        a, b = owner(e.importer), owner(e.imported)
        if a is not None and b is not None and a != b:
            out.append(f"{e.where}: layout {e.importer} imports another layout's {e.imported}")
    return out


def _package_edges() -> list[Edge]:
    return import_edges({p: p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}, PACKAGE)


def test_every_module_has_a_floor():
    names = sorted(_module_name(p, PACKAGE)[0] for p in PACKAGE.rglob("*.py"))
    # the top package's own entry stands for __init__ only: every other module is placed by name
    floors = {k: v for k, v in FLOORS.items() if k != "kcache_cli"}
    missing = [n for n in names if n != "kcache_cli" and floor_of(n, floors) is None]
    assert not missing, "modules with no floor (add them to FLOORS in tests/test_imports.py): " + ", ".join(missing)


def test_every_module_sits_in_its_floors_folder():
    """The tree shows the floors: every module is in a folder FLOORS names, none loose at the top."""
    names = sorted(_module_name(p, PACKAGE)[0] for p in PACKAGE.rglob("*.py"))
    loose = [n for n in names if n.count(".") == 1 and n not in LOOSE and n.split(".")[1] not in
             {k.split(".")[1] for k in FLOORS if "." in k}]
    assert not loose, "modules loose at the top of kcache_cli/ (put each in its floor's folder): " + ", ".join(loose)
    inside = [k for k in FLOORS if k.count(".") > 1 and k != "kcache_cli.layouts.shapes"]
    assert not inside, f"a floor is a folder, not a module inside one: {inside}"


def test_no_import_cycle():
    found = cycles(_package_edges())
    assert not found, "import cycles:\n" + "\n".join(map(str, found))


def test_no_import_from_a_higher_floor():
    found = upward(_package_edges())
    assert not found, "imports from a higher floor:\n" + "\n".join(found)


def test_no_layout_imports_another():
    found = between_layouts(_package_edges())
    assert not found, "layouts importing each other:\n" + "\n".join(found)


def test_the_layout_rule_sees_what_it_forbids():
    edges = [Edge("p.layouts.inductor", "p.layouts.triton", "p/layouts/inductor.py:3"),
             Edge("p.layouts.vllm", "p.layouts.base", "p/layouts/vllm.py:4"),
             Edge("p.layouts.triton", "p.layouts.triton_remote", "p/layouts/triton.py:5"),
             Edge("p.layouts.tilus", "p.layouts.hidet", "p/layouts/tilus.py:6"),
             Edge("p.layouts.hidet", "p.layouts", "p/layouts/hidet.py:7"),
             Edge("p.scan", "p.layouts.hidet", "p/scan.py:8")]
    assert between_layouts(edges, "p.layouts", frozenset({"p.layouts", "p.layouts.base"})) == [
        "p/layouts/inductor.py:3: layout p.layouts.inductor imports another layout's p.layouts.triton",
        "p/layouts/tilus.py:6: layout p.layouts.tilus imports another layout's p.layouts.hidet"]


def test_the_import_rules_see_what_they_forbid(tmp_path):
    """The checker on a small made-up package: relative, function-level, TYPE_CHECKING and lazy_module
    imports are edges; a cycle is found and printed; an upward edge is reported, a same-floor one is not."""
    top = tmp_path / "pkg"
    sources = {
        top / "__init__.py": "",
        top / "low.py": "def f():\n    from .sub import high\n",
        top / "sub" / "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import high\n",
        top / "sub" / "high.py": "from ..low import f\nimport pkg.sub.other as o\n",
        top / "sub" / "other.py": "import os\nfrom pkg import low\n",
        top / "lazy.py": 'low = lazy_module("pkg.low")\n',
    }
    edges = import_edges(sources, top)
    assert {(e.importer, e.imported) for e in edges} == {
        ("pkg.low", "pkg.sub.high"), ("pkg.sub", "pkg.sub.high"), ("pkg.sub.high", "pkg.low"),
        ("pkg.sub.high", "pkg.sub.other"), ("pkg.sub.other", "pkg.low"), ("pkg.lazy", "pkg.low"),
    }
    assert ("pkg.low", "pkg.sub.high", "pkg/low.py:2") in edges
    members = ["pkg.low", "pkg.sub.high", "pkg.sub.other"]
    edges = [e for e in edges if e.importer != "pkg.lazy"]
    assert cycles(edges) == [Cycle(["pkg.low", "pkg.sub.high", "pkg.low"], members)]
    assert str(cycles(edges)[0]) == "pkg.low -> pkg.sub.high -> pkg.low   (the circle also takes in pkg.sub.other)"
    floors = {"pkg": 0, "pkg.sub": 1}
    assert upward(edges, floors) == ["pkg/low.py:2: pkg.low (primitives) imports pkg.sub.high (model)"]
    assert cycles([e for e in edges if e.importer != "pkg.low"]) == []
