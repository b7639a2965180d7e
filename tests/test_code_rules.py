"""Rules the code keeps, checked on its source: no layout named outside kcache_cli/layouts/ (the
registry is how the rest of kcache learns about layouts), and no function longer than 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from kcache_cli.layouts.shapes import SHAPES

PACKAGE = Path(__file__).resolve().parents[1] / "kcache_cli"
MAX_LINES = 80


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


def test_functions_are_at_most_80_lines():
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
