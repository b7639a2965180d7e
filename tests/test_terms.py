"""kcache's closed vocabularies (kcache_cli/model/terms.py): every status, action and removal word the code
uses is a member of its Literal type, so a misspelt word cannot hide where mypy does not look (a
comparison against a literal, a dict written by hand); and every record names its entry through one
EntryKey."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import get_args

import pytest

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.cli import common, complete
from kcache_cli.model import terms
from kcache_cli.model.records import EntryKey, Keyed, ScanFilter
from kcache_cli.remote.manage import remote_entry
from kcache_cli.remote.moved import MovedEntry, named

PACKAGE = Path(__file__).resolve().parents[1] / "kcache_cli"

# The attribute (or JSON field) a word is read from -> the words it may hold.
VOCABULARY = {
    "status": set(get_args(terms.Status)),
    "action": set(get_args(terms.ImportAction)) | set(get_args(terms.MoveAction)),
    "what": set(get_args(terms.RemovalWhat)),
}


def _words(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [w for e in node.elts for w in _words(e)]
    return []


def _uses(tree: ast.AST):
    """(attribute, word, line) for each literal word compared with or assigned to `x.status`, `x.action`
    or `x.what`, or written as the value of a "status"/"action"/"what" key of a dict."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for a in sides:
                if isinstance(a, ast.Attribute) and a.attr in VOCABULARY:
                    yield from ((a.attr, w, node.lineno) for b in sides for w in _words(b))
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                pairs = zip(t.elts, node.value.elts) if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    else [(t, node.value)]
                for a, v in pairs:
                    if isinstance(a, ast.Attribute) and a.attr in VOCABULARY:
                        yield from ((a.attr, w, node.lineno) for w in _words(v))
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value in VOCABULARY:
                    yield from ((k.value, w, v.lineno) for w in _words(v))


def test_the_status_type_and_its_constants_agree():
    assert terms.STATUSES == get_args(terms.Status)
    constants = {terms.COMPLETE, terms.PARTIAL, terms.FAILED, terms.CORRUPT, terms.BUILDING, terms.STALE,
                 terms.UNREADABLE, terms.MOVED}
    assert constants == set(terms.STATUSES) and len(terms.STATUSES) == 8
    assert all(terms.is_status(s) for s in terms.STATUSES) and not terms.is_status("Complete")


def test_every_status_action_and_removal_word_in_kcache_cli_is_a_member():
    found: list[tuple[str, str, str]] = []
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for attr, word, line in _uses(ast.parse(path.read_text(), str(path))):
            found.append((attr, word, f"{path.relative_to(PACKAGE)}:{line}"))
            if word not in VOCABULARY[attr]:
                bad.append(f"{path.relative_to(PACKAGE)}:{line}: {attr} {word!r}")
    assert not bad, "words outside their vocabulary (kcache_cli/model/terms.py):\n" + "\n".join(bad)
    # the walk finds the uses it is there for (else a refactoring blinded it and it passes on nothing)
    assert {attr for attr, _, _ in found} == set(VOCABULARY) and len(found) >= 10, found


def test_the_walk_catches_a_misspelt_word():
    code = 'if e.status == "compleet" or r.action in ("skip", "refused"):\n    d = {"what": "entries"}\n' \
        'p.action, p.reason = "skipp", "why"\n'
    assert sorted((a, w) for a, w, _ in _uses(ast.parse(code))) == [
        ("action", "refused"), ("action", "skip"), ("action", "skipp"), ("status", "compleet"), ("what", "entries")]


def test_the_cli_styles_and_completes_exactly_the_statuses():
    assert set(common.STATUS_STYLE) == set(terms.STATUSES)
    assert tuple(word for word, _ in complete.STATUSES) == (*terms.STATUSES, terms.BROKEN_WORD)


@pytest.mark.parametrize("name,under", [("hidet", ""), ("tilus", ""), ("triton", "cache"), ("tilelang", "")])
def test_every_status_a_real_cache_yields_is_a_member(fixture_copy, name, under):
    root = fixture_copy(name) / under
    entries = scan_cache(root, ScanFilter(), lambda m: None).entries
    assert entries
    assert {e.status for e in entries} <= set(terms.STATUSES)
    for e in entries:
        assert e.key == (e.layout, e.kind, e.target, e.space, e.op, e.hash, e.relpath)


def test_keyed_records_read_their_key_and_write_the_same_json():
    key = EntryKey("hidet", "op", "cuda", "cuda_space_2", "matmul", "ab12", "ops/cuda_space_2/matmul/ab12")
    moved = MovedEntry(key, 3, 100, "push", True, None, "sm_90")
    assert isinstance(moved, Keyed) and (moved.op, moved.space, moved.relpath, moved.hash) == (
        "matmul", "cuda_space_2", "ops/cuda_space_2/matmul/ab12", "ab12")
    assert list(moved.to_json()) == ["layout", "kind", "relpath", "file_count", "size", "action", "done", "reason",
                                     "arch"]
    assert named("?", "?", "a/b/c") == EntryKey("?", "?", None, None, None, "c", "a/b/c")
    # a remote index entry that names no kind: "" in its key, null in its JSON, never selected by a kind
    bare = remote_entry("hidet", "ops/cuda_space_2/matmul/ab12", {"files": 1}, times=False)
    assert bare.kind == "" and bare.to_json()["kind"] is None and bare.hash == "ab12"
    assert not ScanFilter(kinds=("op",)).matches(bare) and ScanFilter(spaces=("2",)).matches(remote_entry(
        "hidet", key.relpath, {"space": "cuda_space_2"}, times=False))
    full = remote_entry("hidet", key.relpath, {**key._asdict(), "files": 3, "size": 100, "arch": "sm_90"})
    assert full.key == key and json.dumps(full.to_json()) == json.dumps(
        {**key._asdict(), "file_count": 3, "size": 100, "arch": "sm_90", "pushed": None, "last_pulled": None})
