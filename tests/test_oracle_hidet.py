"""The loader oracle for hidet (DESIGN.md sections 2.1, 2.8, 10 and 11): real hidet 0.6.1, in its own venv,
looks up and loads each damaged entry (tests/loaders/probe_hidet.py), and kcache's `ls`, `verify`,
`inspect`, `prune --broken --dry-run` and a real `prune --broken` must say what hidet does.

Two tiers: the fast one replays kcache's side of every case on the recorded sources against the recorded
verdicts (tests/loaders/recorded.py); the slow one runs real hidet, and fails when the record is stale."""

from __future__ import annotations

import os
import shutil

import pytest
from loaders import cases_hidet, matrix, recorded
from loaders.matrix import installed_for_kcache, loses_used_entry, prepare, run_cases, save_results
from loaders.venvs import SPECS, python_for

VERSION = next(p.split("==")[1] for p in SPECS["hidet"] if p.startswith("hidet=="))


@pytest.fixture(scope="module")
def real_results(tmp_path_factory):
    python = python_for("hidet")
    base = tmp_path_factory.mktemp("oracle-hidet")
    (base / "src").mkdir()
    root, graph = cases_hidet.hidet_source(base / "src", python)
    env = installed_for_kcache(python, "hidet", base / "kcache-sees")
    cases = matrix.only_selected(cases_hidet.cases(graph))
    results = run_cases(cases, {"hidet": root}, base / "cases", {"hidet": python}, kcache_env=env)
    save_results(results, "hidet")
    if recorded.RECORD and not os.environ.get("KCACHE_ORACLE_ONLY"):
        recorded.save("hidet", results, {"graph": graph}, {"hidet": root})
    return results


@pytest.fixture(scope="module")
def replayed_results(tmp_path_factory):
    base = tmp_path_factory.mktemp("replay-hidet")
    sources = recorded.extract("hidet", base / "src")
    env = recorded.fake_installed("hidet", VERSION, base / "kcache-sees")
    cases = cases_hidet.cases(recorded.load("hidet")["extra"]["graph"])

    def copies(case, workdir, which):
        return prepare(case, sources["hidet"], workdir, which)

    try:
        return recorded.replay("hidet", cases, copies, base / "cases", kcache_env=env)
    finally:
        shutil.rmtree(base, ignore_errors=True)


TIERS = ["replayed", pytest.param("real", marks=pytest.mark.slow)]


@pytest.fixture(params=TIERS)
def hidet_results(request):
    return request.getfixturevalue(f"{request.param}_results")


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


@pytest.mark.slow
def test_the_recorded_verdicts_are_current(real_results):
    recorded.assert_current("hidet", real_results)
