"""Rules the code keeps, checked on its source: no layout named outside kcache_cli/layouts/ (the
registry is how the rest of kcache learns about layouts), and no function longer than 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from kcache_cli.layouts.shapes import SHAPES

PACKAGE = Path(__file__).resolve().parents[1] / "kcache_cli"
MAX_LINES = 60


def _sources(skip_layouts: bool) -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    return [f for f in files if not (skip_layouts and (PACKAGE / "layouts") in f.parents)]


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name a layout)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_no_layout_name_literal_outside_layouts():
    """A string literal that is a layout's name ("hidet", "tilus"...) or starts a path into one
    ("hidet.toml", ".hidet_cache") names the layout: only kcache_cli/layouts/ may."""
    names = {s.name for s in SHAPES}
    found = []
    for path in _sources(skip_layouts=True):
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value.strip().lower().lstrip(".~/")
                words = text.replace("_", " ").replace(".", " ").replace("/", " ").split()
                if text in names or (words and words[0] in names and len(node.value) < 40):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}")
    assert not found, "layout names outside kcache_cli/layouts/:\n" + "\n".join(found)


def test_functions_are_at_most_60_lines():
    long = []
    for path in _sources(skip_layouts=False):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_LINES} lines:\n" + "\n".join(long)


def test_no_citation_of_a_design_document_the_repository_does_not_have():
    """The design reference lives outside this repository: code and packaging cite the README instead."""
    assert not (PACKAGE.parent / "DESIGN.md").exists()
    files = [*_sources(skip_layouts=False), PACKAGE.parent / "pyproject.toml"]
    cited = [str(p.relative_to(PACKAGE.parent)) for p in files if "DESIGN.md" in p.read_text()]
    assert not cited, f"cite a DESIGN.md this repository lacks: {cited}"


# ---- writes under a root go through kcache_cli/fs/write.py (held directory fds) ------------------

_PATH_WRITES = (
    r"\bos\.(mkdir|makedirs|rename|replace|unlink|utime|symlink|link)\(",
    r"\.touch\(", r"\bos\.open\(os\.path\.join", r"\.write_(text|bytes)\(", r"\.mkdir\(parents",
    r"\bshutil\.(copy|copy2|copyfile|copytree|move)\(",
    r"""(?<![\w.])open\([^()]*(\([^()]*\)[^()]*)*,\s*(mode\s*=\s*)?["'][^"']*[wxa+]""",
)
_EXEMPT = "# not under a root: "


def path_writes(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each write by path: a call in _PATH_WRITES on a line that does not end
    with `# not under a root: <why>`."""
    import re

    pattern = re.compile("|".join(_PATH_WRITES))
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        if pattern.search(code) and not re.search(re.escape(_EXEMPT) + r"\S", line):
            out.append((n, line.strip()))
    return out


def test_the_write_rule_sees_what_it_forbids():
    bad = ('os.rename(a, b)\nos.replace(tmp, final)\nPath(p).touch()\nos.unlink(os.path.join(d, n))\n'
           'os.open(os.path.join(root, "x"), flags)\np.write_text("x")\nwith open(path, "wb") as f:\n'
           'open(os.path.join(a, b), mode="a")\nshutil.copytree(a, b)\nos.utime(p, None)\n')
    assert [n for n, _ in path_writes(bad)] == list(range(1, 11))
    fine = ('fswrite.rename_at(a, x, b, y)\nwith open(path, "rb") as f:\nopen(p, "wb")  # not under a root: '
            'the user\'s archive\n# os.rename(a, b) in a comment\nos.rmdir(d)\n')
    assert path_writes(fine) == []


def test_no_write_by_path_outside_the_fs_modules():
    """Every write, rename, unlink, mkdir, symlink or utime under a cache root or a file:// remote goes
    through kcache_cli/fs/write.py (or fsdelete's removal walk): a path a co-user can swap is never
    written through. A write that is not under any root says why on its line."""
    found = []
    for path in _sources(skip_layouts=False):
        if path.parent == PACKAGE / "fs" and path.name in {"read.py", "write.py", "delete.py"}:
            continue
        for n, line in path_writes(path.read_text()):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line}")
    assert not found, "writes by path outside kcache_cli/fs/{read,write,delete}.py:\n" + "\n".join(found)


# ---- no dead code (vulture), private names stay private ---------------------------------------------

def test_no_dead_code():
    """vulture finds no unused function, class, variable, attribute or import in kcache_cli at 60%
    confidence or more; what only Typer, pickle or the tests use is named in tests/vulture_whitelist.py."""
    import vulture

    v = vulture.Vulture()
    v.scavenge([str(PACKAGE), str(Path(__file__).with_name("vulture_whitelist.py"))])
    dead = [f"{Path(i.filename).relative_to(PACKAGE.parent)}:{i.first_lineno}: {i.message} ({i.confidence}%)"
            for i in v.get_unused_code(min_confidence=60)]
    assert not dead, "dead code (remove it, or whitelist a real dynamic use with its reason):\n" + "\n".join(dead)


def test_the_dead_code_check_sees_dead_code(tmp_path):
    import vulture

    (tmp_path / "m.py").write_text("def used():\n    return 1\n\n\ndef forgotten():\n    return used()\n")
    v = vulture.Vulture()
    v.scavenge([str(tmp_path)])
    assert [i.name for i in v.get_unused_code(min_confidence=60)] == ["forgotten"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_imports(path: Path, source: str) -> list[str]:
    """Each `_name` the module at `path` takes from another kcache_cli module: `from m import _x`, or
    `m._x` on a kcache_cli module it imported. A package's own private submodule (`from
    kcache_cli.layouts import _facts` inside kcache_cli/layouts/) is the package's business."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(source, str(path))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            if not base.startswith("kcache_cli"):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__") and base != package:
                    found.append(f"{node.lineno}: from {base} import {a.name}")
                elif not a.name.startswith("_"):
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.partition(".")[0] for a in node.names
                           if a.name.startswith("kcache_cli") and (a.asname or "." not in a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_private_names_stay_private():
    """No kcache_cli module uses an `_underscore` name of another: what two modules share is public."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{hit}" for path in _sources(skip_layouts=False)
             for hit in private_imports(path, path.read_text())]
    assert not found, "private names used from another module:\n" + "\n".join(found)


def test_the_private_name_rule_sees_what_it_forbids():
    here = PACKAGE / "archive" / "importer.py"
    bad = ("from kcache_cli.archive.export import _split, plan_export\nfrom kcache_cli import state\n"
           "from .manifest import _reject\nstate._stamp_name('x')\n")
    assert private_imports(here, bad) == ["1: from kcache_cli.archive.export import _split",
                                          "3: from kcache_cli.archive.manifest import _reject",
                                          "4: state._stamp_name"]
    fine = ("from kcache_cli.archive.export import plan_export\nfrom kcache_cli import state\n"
            "state.stamp_name('x')\nself._own = 1\n")
    assert private_imports(here, fine) == []
    assert private_imports(PACKAGE / "layouts" / "base.py", "from kcache_cli.layouts import _facts\n") == []


def unicode_digit_tests(source: str) -> list[int]:
    """Lines calling str.isdigit, isdecimal or isnumeric: true of "²" and other scripts' digits, which int()
    refuses or no file of ours holds; units.is_digits (ASCII digits only) is the one test."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
            and node.attr in ("isdigit", "isdecimal", "isnumeric")]


def test_digits_are_tested_as_ascii_in_one_place():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in _sources(skip_layouts=False)
             for line in unicode_digit_tests(path.read_text()) if path != PACKAGE / "util" / "units.py"]
    assert not found, "str.isdigit outside units.is_digits (use is_digits: ASCII only):\n" + "\n".join(found)
    assert unicode_digit_tests("x = '2'.isdigit()\n") == [1]
    from kcache_cli.util.units import is_digits

    assert is_digits("42") and not is_digits("\u00b2") and not is_digits("\u0663") and not is_digits("")
