"""The layout interface: every registered layout implements it, and its declared path shapes agree with
what its scan finds in the real fixture caches."""

from __future__ import annotations

import sys
import types

import pytest

from kcache_cli import layouts
from kcache_cli.layouts.base import Layout, ModuleLayout
from kcache_cli.layouts.shapes import SHAPES
from kcache_cli.scan import scan_cache

REAL = ("hidet", "tilus", "tilelang")


def test_registry_is_the_shapes():
    assert layouts.NAMES == tuple(s.name for s in SHAPES)
    for name in layouts.NAMES:
        layout = layouts.get(name)
        assert isinstance(layout, Layout) and layout.name == name
        assert layout.kinds and all(layout.kind_shape(k) is not None for k in layout.kinds)
        for method in ("scan", "judge", "describe"):  # what has no default
            own = getattr(type(layout), method) is not getattr(Layout, method)
            if isinstance(layout, ModuleLayout):  # forwarded: the module must define the function
                fn = getattr(sys.modules[type(layout).__module__], method, None)
                own = callable(fn) and fn.__module__ == type(layout).__module__
            assert own, f"{name} lacks {method}"
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
        assert layout.judge(e.path, e.kind).status == e.status, e.relpath
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


def test_module_layout_forwards_to_its_own_module_functions(tmp_path, monkeypatch):
    """ModuleLayout calls the function of a method's name defined in the subclass's module, falls back to
    Layout's default where there is none, and ignores a same-named function imported from elsewhere."""
    mod = types.ModuleType("kcache_test_fake_layout")
    exec("def judge(path, kind, deep=False, *, root=None):\n    return ('judged', path, kind, deep, root)\n"
         "def log_files(entry):\n    return ['log of', entry]\n", mod.__dict__)
    mod.describe = sys.modules["kcache_cli.layouts.hidet"].describe  # imported, not the module's own
    monkeypatch.setitem(sys.modules, mod.__name__, mod)

    class Fake(ModuleLayout):
        shape = SHAPES[0]

    Fake.__module__ = mod.__name__
    fake = Fake()
    assert fake.judge("/x", "op", True, root="/r") == ("judged", "/x", "op", True, "/r")
    assert fake.log_files("e") == ["log of", "e"]
    assert fake.relocation_problem("e") is None  # Layout's default
    with pytest.raises(NotImplementedError):  # hidet's describe was imported: Layout's default runs
        fake.describe(tmp_path, "e")
    assert fake.detect(tmp_path) is False  # Layout's default: no top-level directory of the shape
