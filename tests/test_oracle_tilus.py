"""The loader oracle for tilus (DESIGN.md sections 2.2, 2.8, 10 and 11): real tilus 0.2.0, in its own venv,
instantiates the cached script and picks its program through the jit instance and the dispatch table
(tests/loaders/probe_tilus.py) on each damaged copy, and kcache's `ls`, `verify`, `inspect`,
`prune --broken --dry-run` and a real `prune --broken` must say what tilus does.

The fast tier replays kcache's side of every case against the recorded verdicts (tests/loaders/recorded.py);
the slow tier runs real tilus, and fails when the record is stale."""

from __future__ import annotations

import os
import shutil

import pytest
from loaders import cases_tilus, matrix, recorded
from loaders.matrix import loses_used_entry, prepare, run_cases, save_results
from loaders.venvs import python_for


@pytest.fixture(scope="module")
def real_results(tmp_path_factory):
    python = python_for("tilus")
    base = tmp_path_factory.mktemp("oracle-tilus")
    cases = matrix.only_selected(cases_tilus.cases())
    results = run_cases(cases, {"tilus": cases_tilus.FIXTURE}, base, {"tilus": python})
    save_results(results, "tilus")
    if recorded.RECORD and not os.environ.get("KCACHE_ORACLE_ONLY"):
        recorded.save("tilus", results)
    return results


@pytest.fixture(scope="module")
def replayed_results(tmp_path_factory):
    base = tmp_path_factory.mktemp("replay-tilus")

    def copies(case, workdir, which):
        return prepare(case, cases_tilus.FIXTURE, workdir, which)

    try:
        return recorded.replay("tilus", cases_tilus.cases(), copies, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["replayed", pytest.param("real", marks=pytest.mark.slow)])
def tilus_results(request):
    return request.getfixturevalue(f"{request.param}_results")


def test_kcache_agrees_with_tilus_on_every_case(tilus_results):
    bad = [f"{r.case.id}: {'; '.join(r.disagreements)}" for r in tilus_results if r.disagreements]
    assert not bad, f"{len(bad)} of {len(tilus_results)} cases disagree:\n" + "\n".join(bad)


def test_prune_broken_never_removes_what_tilus_uses(tilus_results):
    lost = [f"{r.case.id}: tilus {r.verdict.verdict}s it" for r in tilus_results if loses_used_entry(r)]
    assert not lost, "\n".join(lost)


def test_pristine_entries_are_hits(tilus_results):
    pristine = [r for r in tilus_results if r.case.name.endswith("pristine")]
    assert pristine and all(r.verdict.verdict == "hit" for r in pristine), [(r.case.id, r.verdict) for r in pristine]


@pytest.mark.slow
def test_the_recorded_verdicts_are_current(real_results):
    recorded.assert_current("tilus", real_results)
