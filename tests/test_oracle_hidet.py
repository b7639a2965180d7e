"""The loader oracle for hidet (DESIGN.md sections 2.1, 2.8 and 10): real hidet 0.6.1, in its own venv,
looks up and loads each damaged entry (tests/loaders/probe_hidet.py), and kcache's `ls`, `verify`,
`inspect`, `prune --broken --dry-run` and a real `prune --broken` must say what hidet does."""

from __future__ import annotations

import os

import pytest
from loaders import cases_hidet
from loaders.matrix import installed_for_kcache, loses_used_entry, run_cases, save_results
from loaders.venvs import python_for



@pytest.fixture(scope="module")
def hidet_results(tmp_path_factory):
    python = python_for("hidet")
    base = tmp_path_factory.mktemp("oracle-hidet")
    (base / "src").mkdir()
    root, graph = cases_hidet.hidet_source(base / "src", python)
    env = installed_for_kcache(python, "hidet", base / "kcache-sees")
    cases = cases_hidet.cases(graph)
    only = os.environ.get("KCACHE_ORACLE_ONLY")  # a substring of case ids, to replay a few
    if only:
        cases = [c for c in cases if only in c.id]
    results = run_cases(cases, {"hidet": root}, base / "cases", {"hidet": python}, kcache_env=env)
    save_results(results, "hidet")
    return results


def test_the_matrix_is_big_enough(hidet_results):
    if not os.environ.get("KCACHE_ORACLE_ONLY"):
        assert len(hidet_results) >= 50


def test_kcache_agrees_with_hidet_on_every_case(hidet_results):
    bad = [f"{r.case.id}: {'; '.join(r.disagreements)}" for r in hidet_results if r.disagreements]
    assert not bad, f"{len(bad)} of {len(hidet_results)} cases disagree:\n" + "\n".join(bad)


def test_prune_broken_never_removes_what_hidet_uses(hidet_results):
    lost = [f"{r.case.id}: hidet {r.verdict.verdict}s it" for r in hidet_results if loses_used_entry(r)]
    assert not lost, "\n".join(lost)


def test_pristine_entries_are_hits(hidet_results):
    pristine = [r for r in hidet_results if r.case.name.endswith("pristine")]
    assert pristine and all(r.verdict.verdict == "hit" for r in pristine), [(r.case.id, r.verdict) for r in pristine]
