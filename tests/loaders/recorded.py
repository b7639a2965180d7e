"""The loader oracle's recorded verdicts (DESIGN.md section 11): what the real loaders did with every case,
kept in tests/loaders/recorded/ so that the fast tier replays kcache's side of every case without a venv.

For each layout:
  recorded/<layout>.json             the pins of the loader venvs, each case's verdict (by `case_key`), and
                                     what the layout's cases are built from (hidet's graph, Triton's kernels)
  recorded/<layout>-sources.tar.gz   the undamaged trees the real packages made in the slow run that recorded
                                     the verdicts (only for layouts whose source the loader makes in the run)

The slow tier runs the real loaders and fails when their verdicts or the pins differ from the record
(`stale`); `KCACHE_ORACLE_RECORD=1 pytest -m slow tests/test_oracle_*.py tests/loaders/test_oracle_*.py`
writes it anew. The fast tier (`replay`) builds every case from the recorded sources, runs kcache's commands
in-process on the damaged copies and holds them against the recorded verdicts; it fails too when the cases
in the code and the record differ.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

from loaders.matrix import Case, CaseResult, Verdict, kcache_view
from loaders.venvs import SPECS

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "recorded"
RECORD = os.environ.get("KCACHE_ORACLE_RECORD") == "1"

Prepare = Callable[[Case, Path, tuple[str, ...]], tuple[Path, ...]]


def case_key(case: Case) -> str:
    """A case's name in the record: its loader venv, its source tree and what was done (no hash: a
    regenerated source may name its entries otherwise)."""
    return f"{case.venv or case.layout}|{case.source or '-'}|{case.name}"


def pins(venvs: set[str]) -> dict[str, list[str]]:
    return {v: list(SPECS[v]) for v in sorted(venvs)}


def _venvs(cases: list[Case]) -> set[str]:
    return {c.venv or c.layout for c in cases}


def load(layout: str) -> dict:
    path = RECORDED / f"{layout}.json"
    if not path.exists():
        raise AssertionError(f"no recorded verdicts at {path}: run the slow tier with KCACHE_ORACLE_RECORD=1")
    return json.loads(path.read_text())


def save(layout: str, results: list[CaseResult], extra: dict | None = None,
         sources: dict[str, Path] | None = None) -> None:
    """Write the record of a real run: the verdicts, the pins, `extra`, and the source trees (tar.gz)."""
    RECORDED.mkdir(exist_ok=True)
    keys = [case_key(r.case) for r in results]
    assert len(set(keys)) == len(keys), "two cases share a key: name them apart"
    doc = {"layout": layout, "pins": pins(_venvs([r.case for r in results])), "extra": extra or {},
           "cases": {case_key(r.case): {"verdict": r.verdict.verdict, "detail": r.verdict.detail[:300],
                                        "entry": r.case.entry} for r in results}}
    (RECORDED / f"{layout}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if sources:
        with tarfile.open(RECORDED / f"{layout}-sources.tar.gz", "w:gz", compresslevel=9) as tar:
            for name, root in sorted(sources.items()):
                tar.add(root, arcname=name)


def stale(layout: str, results: list[CaseResult]) -> list[str]:
    """Where a real run differs from the record (empty: the record is current). With KCACHE_ORACLE_RECORD=1
    the record is written instead, and nothing differs."""
    if RECORD:
        return []
    doc = load(layout)
    out = []
    now = pins(_venvs([r.case for r in results]))
    if doc["pins"] != now:
        out.append(f"pins: recorded {doc['pins']}, now {now}")
    seen = {case_key(r.case): r.verdict.verdict for r in results}
    for key in sorted(seen.keys() | doc["cases"].keys()):
        was = doc["cases"].get(key, {}).get("verdict")
        if was != seen.get(key):
            out.append(f"{key}: recorded {was}, the real loader now {seen.get(key)}")
    return out


def extract(layout: str, dest: Path) -> dict[str, Path]:
    """The recorded source trees of `layout`, unpacked under `dest`: {source name: its root}."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(RECORDED / f"{layout}-sources.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
        names = {m.name.split("/", 1)[0] for m in tar.getmembers()}
    return {n: dest / n for n in sorted(names)}


def replay(layout: str, cases: list[Case], prepare: Prepare, workdir: Path,
           kcache_env: dict[str, str] | None = None) -> list[CaseResult]:
    """kcache's side of every case, held against the recorded verdicts: two damaged copies a case (the
    read-only commands and the dry run on one, the real prune on the other), no loader run."""
    doc = load(layout)
    keys = [case_key(c) for c in cases]
    missing = sorted(set(keys) - doc["cases"].keys())
    extra = sorted(doc["cases"].keys() - set(keys))
    assert not missing and not extra, (f"the recorded {layout} verdicts are out of date (KCACHE_ORACLE_RECORD=1 "
                                       f"pytest -m slow rewrites them): not recorded {missing[:5]}, "
                                       f"no longer a case {extra[:5]}")
    assert doc["pins"] == pins(_venvs(cases)), f"{layout}: the record's pins are not tests/loaders/venvs.py's"
    out = []
    for i, (case, key) in enumerate(zip(cases, keys)):
        view_root, prune_root = prepare(case, workdir / f"case{i:03d}", ("view", "prune"))
        rec = doc["cases"][key]
        view = kcache_view(view_root, prune_root, as_owner=case.as_owner, inspect=(case.entry,), env=kcache_env)
        out.append(CaseResult(case, Verdict(rec["verdict"], rec["detail"]), view))
    return out


def fake_installed(package: str, version: str, where: Path) -> dict[str, str]:
    """What matrix.installed_for_kcache gives the real run, for the replay: a `<package>-<version>.dist-info`
    with its METADATA in a directory kcache sees on its path, as the loader venv's own would be."""
    dist = where / f"{package}-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    return {"PYTHONPATH": str(where)}


def save_tree(name: str, root: Path) -> None:
    """A tree a real package made in the slow tier (an Inductor cache, vLLM's), kept as recorded/<name>.tar.gz
    for the fast tier's tests of kcache on it."""
    RECORDED.mkdir(exist_ok=True)
    with tarfile.open(RECORDED / f"{name}.tar.gz", "w:gz", compresslevel=9) as tar:
        tar.add(root, arcname=root.name)


def extract_tree(name: str, dest: Path) -> Path:
    """recorded/<name>.tar.gz unpacked under `dest`: the tree's root."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(RECORDED / f"{name}.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
        top = {m.name.split("/", 1)[0] for m in tar.getmembers()}
    assert len(top) == 1, top
    return dest / top.pop()


def assert_current(layout: str, results: list[CaseResult]) -> None:
    """The slow tier's check: the real loaders still do what the record says (or KCACHE_ORACLE_RECORD=1)."""
    import pytest

    if os.environ.get("KCACHE_ORACLE_ONLY"):
        pytest.skip("a replay of a few cases")
    diff = stale(layout, results)
    assert not diff, (f"the real loaders no longer do what tests/loaders/recorded/{layout}.json says "
                      "(KCACHE_ORACLE_RECORD=1 pytest -m slow rewrites it):\n" + "\n".join(diff))
