"""The layout interface: every registered layout implements it, and its declared path shapes agree with
what its scan finds in the real fixture caches."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from kcache_cli import layouts
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts.base import CONCERNS, Layout
from kcache_cli.layouts.shapes import _FEW, SHAPES

REAL = ("hidet", "tilus", "tilelang")


def test_registry_is_the_shapes():
    assert layouts.NAMES == tuple(s.name for s in SHAPES)
    for name in layouts.NAMES:
        layout = layouts.get(name)
        assert isinstance(layout, Layout) and layout.name == name
        assert layout.kinds and all(layout.kind_shape(k) is not None for k in layout.kinds)
        for method in ("scan", "judge", "describe"):  # what has no default
            assert getattr(type(layout), method) is not getattr(Layout, method), f"{name} lacks {method}"
    with pytest.raises(KeyError):
        layouts.get("ccache")
    assert layouts.builder().shape.build_kind in layouts.builder().kinds


@pytest.mark.parametrize("name", REAL)
def test_shapes_agree_with_the_scan(fixture_copy, name):
    root = fixture_copy(name)
    assert layouts.detect(root) == (name,)
    layout = layouts.get(name)
    entries = [e for e in scan_cache(root).entries if layout.leftover(e) is None]
    assert entries
    for e in entries:
        assert layout.entry_path_problem(e.kind, e.relpath) is None, e.relpath
        assert layout.key_problem(e.kind, e.relpath, e.key) is None, e.relpath
        assert layout.key_problem(e.kind, e.relpath, e.key._replace(hash="0" * 16)) is not None
        with EntryDir.open(e.path, fsread.anchor(root)) as d:
            assert layout.judge(d, e.kind, layout.judging()).status == e.status, e.relpath
    other = next(n for n in REAL if n != name)
    e = entries[0]
    assert layouts.get(other).entry_path_problem(e.kind, e.relpath) is not None


@pytest.mark.parametrize("relpath,kind,ok", [
    ("ops/cuda_space_0/matmul/41920731adb3acf4", "op", True),
    ("ops/cuda_space_x/matmul/41920731adb3acf4", "op", False),
    ("ops/cuda_space_0/matmul/.kcache-tmp-4192", "op", False),
    ("ops/cuda_space_0/matmul", "op", False),
    ("graphs/abc", "graph", True),
    ("graphs/abc", "op", False),
])
def test_hidet_paths(relpath, kind, ok):
    assert (layouts.get("hidet").entry_path_problem(kind, relpath) is None) is ok


def _detection_roots(tmp_path: Path, fixture_copy) -> list[Path]:
    """The real caches, and roots made to look like the layouts that have no fixture here (or almost)."""
    roots = [fixture_copy(n) for n in (*REAL, "triton")]
    made = {"jit/ComputeCache/0": None, "jit/ComputeCache/index": "", "vllm/0123456789/rank_0_0/backbone": None,
            "aot/torch_aot_compile/" + "a" * 64: None, "ind/fxgraph/ab": None, "ind/aa/c" + "a" * 51 + ".py": "",
            "lookalike/ops/x": None, "lookalike/0123456789/x": None, "lookalike/ComputeCache/x": None}
    for rel, text in made.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if text is None else path.write_text(text)
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "ops").symlink_to(roots[0] / "ops")
    return [*roots, *(tmp_path / n for n in ("jit", "vllm", "aot", "ind", "lookalike", "linked", "nothing"))]


def test_a_shape_says_whether_its_layout_detects_by_itself():
    """layouts.detect answers a layout without a detect of its own from its shape, without importing it."""
    for shape in SHAPES:
        own = type(layouts.get(shape.name)).detect is not Layout.detect
        assert own == shape.own_detect, shape.name


def test_detecting_a_hidet_root_loads_no_other_layout_s_code(fixture_copy):
    root = fixture_copy("hidet")
    code = ("import sys; from kcache_cli import layouts; print(layouts.detect(sys.argv[1])); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('kcache_cli.layouts.'))))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True).stdout
    found, loaded = out.splitlines()
    assert found == "('hidet',)"
    assert "kcache_cli.layouts.hidet" in loaded.split()
    assert not {f"kcache_cli.layouts.{n}" for n in ("triton", "inductor", "tilus", "torchext", "jax", "numba")} & set(
        loaded.split())


ODD_NAMES = ["", ".", "..", ".hidden", "a", "a\n", "\n", "x.y", "-", " ", "é", "A" * 52, "0" * 64, "ab", "fxgraph",
             "cuda_space_0", "0.1.15", "ext_1", "torch_aot_compile", "__pycache__", "a" * 300]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_the_top_level_names_a_layout_takes_are_its_templates_names(shape):
    """tops() skips the regex where it can (fixed names, any visible name): the answer is still the
    templates' own first segments matched name by name."""
    firsts = [k.segments[0] for k in shape.kinds]
    assert shape.tops(ODD_NAMES) == [n for n in ODD_NAMES if any(r.match(n) for r in firsts)]

    assert shape.tops(ODD_NAMES, 2) == shape.tops(ODD_NAMES)[:2]
    # a root of many names takes the joined regex (a length range, or none: each name matched in C)
    fixed = [k.parts[0] for s in SHAPES for k in s.kinds if "{" not in k.parts[0]]  # ops, programs...
    many = [f"{n}{i}" if i % 3 else n for i in range(_FEW // 4 + 1) for n in ODD_NAMES + fixed]
    assert len(many) > _FEW
    assert shape.tops(many) == [n for n in many if any(r.match(n) for r in firsts)]
    assert shape.tops(many, 3) == shape.tops(many)[:3]


def test_a_layout_named_after_many_other_directories_is_still_detected(tmp_path):
    """held_by looks into the first few directories a layout could own, but names that prove a layout
    (Inductor's fxgraph/, the CUDA JIT cache's ComputeCache/) count wherever they are in the listing."""
    for name, layout in (("fxgraph", "inductor"), ("ComputeCache", "cudajit")):
        root = tmp_path / layout
        for i in range(200):  # more than held_by looks into: visible names any layout's regex may take
            (root / f"zz{i:03d}").mkdir(parents=True)
        (root / name).mkdir()
        names = fsread.listdir(root)
        shape = next(s for s in SHAPES if s.name == layout)
        assert shape.held_by(str(root), names), layout

def test_detection_on_real_and_look_alike_roots(tmp_path, fixture_copy):
    """Each root is detected as the layout it looks like, and a look-alike as none (the registry's answer is
    every layout's own detect)."""
    for root in _detection_roots(tmp_path, fixture_copy):
        every = tuple(n for n in layouts.NAMES if layouts.get(n).detect(root))
        assert layouts.detect(root) == every, root
    assert layouts.detect(tmp_path / "jit") == ("cudajit",) and layouts.detect(tmp_path / "ind") == ("inductor",)
    assert layouts.detect(tmp_path / "vllm") == ("vllm",) == layouts.detect(tmp_path / "aot")
    assert layouts.detect(tmp_path / "lookalike") == () == layouts.detect(tmp_path / "nothing")


def test_dependencies_as_the_layouts_declare_them(fixture_copy):
    """tilus scripts use programs (export brings them, removal keeps them); tilelang kernels embed binaries."""
    root = fixture_copy("tilus")
    tilus = layouts.get("tilus")
    scripts = [e for e in scan_cache(root).entries if e.kind == "script"]
    used = {u for s in scripts for u in tilus.uses(root, s)}
    assert used and all(u.startswith("programs/") for u in used)
    users = tilus.users(root, [str(root / u) for u in used])
    assert all(users.values()) and tilus.users_break("program") and "program" in tilus.provider_kinds
    assert tilus.link_target("script", ["programs", "0123456789ab"]) == "programs/0123456789ab"
    assert tilus.link_target("script", ["programs", ".hidden"]) is None
    assert tilus.link_target("program", ["programs", "0123456789ab"]) is None
    tl_root = fixture_copy("tilelang")
    tilelang = layouts.get("tilelang")
    binaries = [e.path for e in scan_cache(tl_root).entries if e.kind == "binary"]
    assert any(tilelang.users(tl_root, binaries).values()) and not tilelang.users_break("binary")


def test_leftovers_and_locks(fixture_copy):
    import os
    import time

    root = fixture_copy("hidet")
    hidet = layouts.get("hidet")
    op_dir = next((root / "ops" / "cuda_space_0").iterdir())
    tmp = op_dir / ".kcache-tmp-0123456789abcdef-beef"
    tmp.mkdir()
    old = time.time() - 7200
    os.utime(tmp, (old, old))
    found = [e for e in scan_cache(root).entries if e.path == str(tmp)]
    assert found and hidet.leftover(found[0]).what == "temp"
    assert hidet.leftover(found[0]).lock.endswith("/0123456789abcdef")
    assert hidet.inner_leftovers(found[0]) == []  # candidates/ is hidet's to keep (debug_cache_tuning)
    assert ".lock" in hidet.writer_locks and hidet.empty_parent_levels("op") == 2


FIFTH = Path(__file__).resolve().parent / "fifth_layout" / "objcache.py"
HOOKS = frozenset(n for n in dir(Layout) if not n.startswith("_")) | frozenset(Layout.__annotations__)


def _members(concern: type) -> dict[str, object]:
    """A concern's members: name -> the protocol's function or property, or its annotation (an attribute)."""
    out: dict[str, object] = dict(concern.__annotations__)
    out.update({n: v for n, v in vars(concern).items()
                if not n.startswith("_") and (callable(v) or isinstance(v, property))})
    return out


def concern_problems(layout: object) -> list[str]:
    """Where `layout` does not satisfy a concern: a member missing, a method whose signature (names, kinds,
    defaults, annotations as written) differs from the protocol's, an attribute of the wrong type."""
    out = []
    for concern in CONCERNS:
        for name, member in _members(concern).items():
            if not hasattr(layout, name):
                out.append(f"{concern.__name__}.{name} missing")
            elif isinstance(member, property):
                if not isinstance(inspect.getattr_static(type(layout), name), property):
                    out.append(f"{concern.__name__}.{name} is not a property")
            elif callable(member):
                want, got = inspect.signature(member), inspect.signature(getattr(type(layout), name))
                if isinstance(inspect.getattr_static(type(layout), name), staticmethod):  # the module's function
                    want = want.replace(parameters=list(want.parameters.values())[1:])  # itself: no self
                    if _widens(want, got):
                        continue
                if str(want) != str(got):
                    out.append(f"{concern.__name__}.{name}{want} but {type(layout).__name__}.{name}{got}")
            else:
                kind = {"frozenset": frozenset, "tuple": tuple}.get(str(member).split("[")[0], object)
                if not isinstance(getattr(layout, name), kind):
                    out.append(f"{concern.__name__}.{name}: {member}, not {type(getattr(layout, name)).__name__}")
    return out


def _widens(want: inspect.Signature, got: inspect.Signature) -> bool:
    """Whether a hook that is a module's function (`scan = staticmethod(scan)`) takes every call the
    protocol's signature allows, meaning the same: the protocol's parameters first, by the same names,
    kinds and annotations (or the annotation `| None` with a default), the same result; anything more it
    takes, optional."""
    wanted, given = list(want.parameters.values()), list(got.parameters.values())
    if str(want.return_annotation) != str(got.return_annotation) or len(given) < len(wanted):
        return False
    for w, g in zip(wanted, given):
        if (w.name, w.kind) != (g.name, g.kind):
            return False
        if w.default is not inspect.Parameter.empty and w.default != g.default:
            return False
        same = str(g.annotation) == str(w.annotation)
        if not (same or (str(g.annotation) == f"{w.annotation} | None" and g.default is None)):
            return False
    return all(g.default is not inspect.Parameter.empty for g in given[len(wanted):])


def test_a_widened_hook_still_takes_the_protocol_s_calls():
    def hook(d: int, kind: str, jc: str) -> str: ...
    def wider(d: int, kind: str = "op", jc: str | None = None, *, names: dict | None = None) -> str: ...
    def renamed(entry: int, kind: str, jc: str) -> str: ...
    def narrower(d: int, kind: str, jc: str, more: int) -> str: ...
    def other_result(d: int, kind: str, jc: str) -> int: ...
    want = inspect.signature(hook)
    assert _widens(want, want) and _widens(want, inspect.signature(wider))
    assert not any(_widens(want, inspect.signature(f)) for f in (renamed, narrower, other_result))


def non_hook_members(cls: type) -> list[str]:
    """Public names a layout class defines that are no member of `Layout`: a typo (`relocation_problems`)
    that would otherwise be dead code while the default runs."""
    return sorted(n for n in vars(cls) if not n.startswith("_") and n not in HOOKS)


def uncalled_hook_functions(source: str) -> list[str]:
    """Module-level functions named after a hook that the module's Layout subclass never calls: what a
    forgotten (or misspelt) delegation leaves behind while `Layout`'s default runs instead."""
    tree = ast.parse(source)
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in HOOKS}
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)
               and any(isinstance(b, ast.Name) and b.id == "Layout" for b in n.bases)]
    called = {c.func.id for cls in classes for c in ast.walk(cls)
              if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    called |= {c.args[0].id for cls in classes for c in ast.walk(cls)  # `scan = staticmethod(scan)`
               if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "staticmethod"
               and c.args and isinstance(c.args[0], ast.Name)}
    return sorted(funcs - called)


def test_the_concerns_cover_the_whole_interface():
    """Every public member of Layout belongs to exactly one concern (Protocol), and Layout satisfies each."""
    seen = [name for concern in CONCERNS for name in _members(concern)]
    assert len(seen) == len(set(seen)), sorted(n for n in seen if seen.count(n) > 1)
    assert set(seen) == HOOKS
    class Bare(Layout):  # the defaults alone
        shape = SHAPES[0]

    assert concern_problems(Bare()) == []


@pytest.mark.parametrize("name", layouts.NAMES)
def test_every_layout_satisfies_every_concern(name):
    layout = layouts.get(name)
    assert concern_problems(layout) == []
    assert non_hook_members(type(layout)) == []
    source = Path(sys.modules[type(layout).__module__].__file__ or "").read_text()
    assert uncalled_hook_functions(source) == []


def test_the_fifth_layout_follows_the_same_rules():
    assert uncalled_hook_functions(FIFTH.read_text()) == []


def test_the_rules_catch_a_typo_and_a_wrong_signature():
    """What the checks above exist for: a misspelt hook, a forgotten delegation and a signature that is not
    Layout's are each reported, where `ModuleLayout` used to run the default in silence."""
    class Typo(Layout):
        shape = SHAPES[0]

        def relocation_problems(self, entry):  # misspelt: Layout.relocation_problem would run
            return "moved"

        def judge(self, path, kind, deep=False):  # the old signature: judge(d, kind, jc) would fail
            raise NotImplementedError

    assert non_hook_members(Typo) == ["relocation_problems"]
    assert [p.split("(")[0] for p in concern_problems(Typo())] == ["EntryReader.judge"]
    source = ("from kcache_cli.layouts.base import Layout\n"
              "def scan(ctx, flt):\n    return iter(())\n"
              "def describe(root, entry):\n    return None\n"
              "def relocation_problem(entry):\n    return 'moved'\n"
              "class Mine(Layout):\n"
              "    def scan(self, ctx, flt):\n        return scan(ctx, flt)\n"
              "    def describe(self, root, entry):\n        return describe(root, entry)\n")
    assert uncalled_hook_functions(source) == ["relocation_problem"]


def test_a_short_listing_finds_the_same_tops_kind_by_kind(monkeypatch):
    """tops() of a short listing matches each kind's first segment in turn; a long one matches the
    kinds' joined regex within its widths. Both find the same names, for every layout."""
    from kcache_cli.layouts import shapes

    names = ["ops", "graphs", "programs", "scripts", "0.1.6", "0.1.6.post1+cu121", "fxgraph", "aotautograd",
             "ab", "a1", "ABC", "0123456789", "0123456789a", "torch_aot_compile", "cuda-binaries", ".hidden",
             "224QLPILB7NXXOMZ3H6EZLDE7L6FMZ2VVUUACREL6ZJP5PMGSYIA", "f" * 64, "x" * 43, "my_ext", "1bad",
             "with space", "ümlaut", "a.b", ""]
    assert len(names) <= shapes._FEW
    short = {shape.name: shape.tops(names) for shape in shapes.SHAPES}
    monkeypatch.setattr(shapes, "_FEW", -1)  # every listing long: the joined regex
    assert short == {shape.name: shape.tops(names) for shape in shapes.SHAPES}
    assert short["triton"] == ["224QLPILB7NXXOMZ3H6EZLDE7L6FMZ2VVUUACREL6ZJP5PMGSYIA", "f" * 64, "x" * 43]
    assert short["tilelang"] == ["0.1.6", "0.1.6.post1+cu121"]
