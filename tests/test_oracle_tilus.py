"""The loader oracle for tilus (DESIGN.md sections 2.2, 2.8 and 10): real tilus 0.2.0, in its own venv,
instantiates the cached script and picks its program through the jit instance and the dispatch table
(tests/loaders/probe_tilus.py) on each damaged copy, and kcache's `ls`, `verify`, `inspect`,
`prune --broken --dry-run` and a real `prune --broken` must say what tilus does."""

from __future__ import annotations

import os

import pytest
from loaders import cases_tilus
from loaders.matrix import loses_used_entry, run_cases, save_results
from loaders.venvs import python_for


@pytest.fixture(scope="module")
def tilus_results(tmp_path_factory):
    python = python_for("tilus")
    base = tmp_path_factory.mktemp("oracle-tilus")
    cases = cases_tilus.cases()
    only = os.environ.get("KCACHE_ORACLE_ONLY")  # a substring of case ids, to replay a few
    if only:
        cases = [c for c in cases if only in c.id]
    results = run_cases(cases, {"tilus": cases_tilus.FIXTURE}, base, {"tilus": python})
    save_results(results, "tilus")
    return results


def test_kcache_agrees_with_tilus_on_every_case(tilus_results):
    bad = [f"{r.case.id}: {'; '.join(r.disagreements)}" for r in tilus_results if r.disagreements]
    assert not bad, f"{len(bad)} of {len(tilus_results)} cases disagree:\n" + "\n".join(bad)


def test_prune_broken_never_removes_what_tilus_uses(tilus_results):
    lost = [f"{r.case.id}: tilus {r.verdict.verdict}s it" for r in tilus_results if loses_used_entry(r)]
    assert not lost, "\n".join(lost)


def test_pristine_entries_are_hits(tilus_results):
    pristine = [r for r in tilus_results if r.case.name.endswith("pristine")]
    assert pristine and all(r.verdict.verdict == "hit" for r in pristine), [(r.case.id, r.verdict) for r in pristine]
