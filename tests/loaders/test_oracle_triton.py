"""The loader oracle for Triton 3.1, 3.2 and 3.9 (DESIGN.md sections 2.4, 2.8 and 10).

Real caches are made in the session by each Triton release itself (tests/loaders/probe_triton.py `make`:
`triton.compile` for a GPUTarget, no GPU needed): 64-hex keys (3.1), 43-character base64url (3.2) and
52-character base32 (3.9). Each case damages a copy, the probe runs Triton's own lookup on it, and kcache's
ls/verify/inspect/prune --broken (dry and real) must agree with what Triton did (matrix.agree).

Triton's group files hold absolute paths, so every copy is first made to point at itself, as Triton would
have written it there (`settle`); the "moved" case leaves the paths of the original root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from loaders import matrix, recorded
from loaders.matrix import (
    Case,
    CaseResult,
    add_file,
    chain,
    copy_root,
    dangling_link,
    empty,
    garbage,
    kcache_view,
    link_to_good,
    loses_used_entry,
    missing,
    mode000,
    one_mtime,
    run_probes,
    truncated,
)
from loaders.venvs import python_for

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe_triton.py"
VERSIONS = ("triton39", "triton32", "triton31")
SOURCES: dict[str, Path] = {}  # the session's undamaged roots, for the copied-root case
OLD = time.time() - 3 * 3600  # a leftover untouched for three hours: no live writer

# ---------------------------------------------------------------------------------------------- sources


def make_cache(venv: str, dest: Path, **env: str) -> dict[str, str]:
    """A real cache written by Triton `venv` into `dest`: {key dir: kernel name}."""
    done = subprocess.run([str(python_for(venv)), str(PROBE), "make", str(dest)], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(dest.parent), **env), timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    made = json.loads(done.stdout.splitlines()[-1])["kernels"]
    assert all(not k["detail"] for k in made.values()), made
    return {key: k["name"] for key, k in made.items()}


@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict[str, tuple[Path, dict[str, str]]]:
    """venv (or "triton39-binary-only") -> (root, {key: kernel name}), made once per session, lazily."""
    SOURCES.clear()

    class Lazy(dict):
        def __missing__(self, name: str):
            venv, _, variant = name.partition("-")
            root = tmp_path_factory.mktemp(name) / "cache"
            env = {"TRITON_STORE_BINARY_ONLY": "1"} if variant == "binary-only" else {}
            self[name] = (root, make_cache(venv, root, **env))
            SOURCES[name] = root
            return self[name]
    return Lazy()


def settle(root: Path, written_at: Path | None = None) -> None:
    """Point every group file's child paths at this copy, as Triton writes them (absolute paths), or at
    `written_at` (the root the cache was written in before it was moved here)."""
    for key in os.listdir(root):
        for g in Path(root, key).glob("__grp__*.json"):
            group = json.loads(g.read_text())
            group["child_paths"] = {n: str((written_at or root) / key / n) for n in group["child_paths"]}
            g.write_text(json.dumps(group))


# ---------------------------------------------------------------------------------------------- damages


def edit_group(key: str, name: str, edit) -> callable:
    def go(root: Path) -> None:
        g = root / key / f"__grp__{name}.json"
        group = json.loads(g.read_text())
        g.write_text(json.dumps(edit(group, root / key)))
    return go


def group_link(key: str, name: str, edit) -> callable:
    """The group file becomes a symlink to a copy kept beside the root, edited (Triton opens it through
    the link; kcache never rewrites through one)."""
    def go(root: Path) -> None:
        g = root / key / f"__grp__{name}.json"
        kept = root.parent / "kept" / g.name
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(edit(g.read_text(), root / key))
        g.unlink()
        g.symlink_to(os.path.relpath(kept, g.parent))
    return go


def astray(key: str, name: str, gone: bool = False, cubin: bool = False) -> callable:
    """Child paths sent outside the entry, to no copy of it: the ttir to a text file, the llir to a copy
    under another name (and, with `cubin`, the cubin to a copy whose name does not end in .cubin); with
    `gone`, every other child into a root that does not exist (a moved cache tampered with)."""
    def go(root: Path) -> None:
        d, other = root / key, root.parent / "elsewhere"
        other.mkdir(exist_ok=True)
        (other / "notes").write_text("not IR\n")
        shutil.copy(d / f"{name}.llir", other / "llir-copy")
        paths = {f"{name}.ttir": str(other / "notes"), f"{name}.llir": str(other / "llir-copy")}
        if cubin:
            shutil.copy(d / f"{name}.cubin", other / "kernel.bin")
            paths[f"{name}.cubin"] = str(other / "kernel.bin")
        g = d / f"__grp__{name}.json"
        group = json.loads(g.read_text())
        kept = {n: str(root.parent / "gone" / key / n) if gone else p for n, p in group["child_paths"].items()}
        g.write_text(json.dumps({**group, "child_paths": {**kept, **paths}}))
    return go


def temp_dir(key: str, when: float | None = OLD, files: tuple[str, ...] = ("add_kernel.cubin",)) -> callable:
    """A `tmp.pid_*` directory as Triton >= 3.2 leaves it when killed between a write and its rename."""
    def go(root: Path) -> None:
        d = root / key / "tmp.pid_4242_0b8e5c2a-1d7e-4c1c-9d53-6a7e0c1f2b3d"
        d.mkdir()
        for f in files:
            (d / f).write_bytes(b"\x7fELF partial")
        if when is not None:
            for p in (*d.iterdir(), d):
                os.utime(p, (when, when))
    return go


def temp_file(key: str, name: str) -> callable:
    """Triton 3.1's temp file (`<file>.tmp.pid_<pid>_<uuid>` beside the file), left by a killed write."""
    def go(root: Path) -> None:
        p = root / key / f"{name}.tmp.pid_4242_0b8e5c2a1d7e"
        p.write_bytes(b"partial")
        os.utime(p, (OLD, OLD))
    return go


def age_all(root: Path) -> None:
    """Every file and directory untouched for three hours, keeping one mtime where a case set one."""
    stamps = {os.lstat(p).st_mtime for p in root.rglob("*")}
    when = min(OLD, *stamps) if len(stamps) == 1 else OLD
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (when, when), follow_symlinks=False)
    os.utime(root, (when, when))


# ---------------------------------------------------------------------------------------------- cases


def file_cases(venv: str, key: str, name: str, files: list[str]) -> list[Case]:
    out = []
    for f in files:
        rel = f"{key}/{f}"
        for what, damage in (("missing", missing(rel)), ("empty", empty(rel)), ("truncated", truncated(rel)),
                             ("garbage", garbage(rel)), ("a link to a good copy", link_to_good(rel)),
                             ("a dangling link", dangling_link(rel))):
            out.append(Case("triton", f"{f.replace(name, '<name>')} {what}", key, damage, venv=venv))
        out.append(Case("triton", f"{f.replace(name, '<name>')} mode 000", key, mode000(rel), venv=venv,
                        as_owner=True))
    return out


def cases_for(venv: str, key: str, name: str, files: list[str], full: bool) -> list[Case]:
    """Every damage for Triton `venv`'s kernel `key` (all of them on 3.9; the key-shape subset elsewhere)."""
    grp = f"__grp__{name}.json"
    c = lambda what, damage, **kw: Case("triton", what, key, damage, venv=venv, **kw)  # noqa: E731
    out = [
        c("intact", lambda root: None),
        c("moved root (written at a path that is gone)", lambda root: settle(root, root.parent / "gone")),
        c("copied root (written at a path that still holds it)", lambda root: settle(root, SOURCES[venv])),
        c("group missing", missing(f"{key}/{grp}")),
        c("group garbage", garbage(f"{key}/{grp}")),
        c("cubin missing", missing(f"{key}/{name}.cubin")),
        c("ttir missing", missing(f"{key}/{name}.ttir")),
        c("metadata missing", missing(f"{key}/{name}.json")),
        c("metadata garbage", garbage(f"{key}/{name}.json")),
        c("ttir empty", empty(f"{key}/{name}.ttir")),
    ]
    if venv == "triton31":
        out.append(c("old temp file of a killed write (3.1)", temp_file(key, f"{name}.cubin")))
    else:
        out.append(c("old tmp.pid_* inside a complete kernel", temp_dir(key)))
    if not full:
        return out
    out += file_cases(venv, key, name, files)
    drop = lambda n: lambda g, d: {**g, "child_paths": {k: v for k, v in g["child_paths"].items() if k != n}}  # noqa
    out += [
        c("junk file added", add_file(f"{key}/notes.txt")),
        c("one mtime for every file", one_mtime()),
        c("group does not list the cubin", edit_group(key, name, drop(f"{name}.cubin"))),
        c("group does not list the metadata", edit_group(key, name, drop(f"{name}.json"))),
        c("group lists a file that is not there", edit_group(key, name, lambda g, d: {
            **g, "child_paths": {**g["child_paths"], f"{name}.extra": str(d / f"{name}.extra")}})),
        c("group child_paths is a list", edit_group(key, name, lambda g, d: {"child_paths": list(g["child_paths"])})),
        c("group without child_paths", edit_group(key, name, lambda g, d: {"paths": g["child_paths"]})),
        c("group a link to a copy written under a gone root", group_link(key, name, lambda text, d: json.dumps(
            {"child_paths": {n: str(d.parent.parent / "gone" / d.name / n) for n in json.loads(text)["child_paths"]}}
        ))),
        c("group a link to a file that is not JSON", group_link(key, name, lambda text, d: "root:x:0:0::/:/bin/sh\n")),
        c("group sends two children to other files", astray(key, name)),
        c("group sends two children to other files, the rest into a gone root", astray(key, name, gone=True)),
        c("group sends the cubin to a copy not named .cubin", astray(key, name, cubin=True)),
        c("fresh tmp.pid_* inside a complete kernel", temp_dir(key, when=None)),
        c("group-less kernel with an old tmp.pid_*", chain(missing(f"{key}/{grp}"), temp_dir(key))),
        c("key directory mode 000", mode000(key), as_owner=True),
    ]
    return out


def all_cases(sources) -> list[Case]:
    out = []
    for venv in VERSIONS:
        root, kernels = sources[venv]
        key = sorted(k for k, n in kernels.items() if n == "add_kernel")[0]
        files = sorted(os.listdir(root / key))
        out += cases_for(venv, key, "add_kernel", files, full=venv == "triton39")
    root, kernels = sources["triton39"]
    key = sorted(k for k, n in kernels.items() if n == "amd_kernel")[0]
    amd = lambda what, damage: Case("triton", f"AMD (gfx942): {what}", key, damage, venv="triton39")  # noqa: E731
    out += [amd("intact", lambda root: None), amd("hsaco missing", missing(f"{key}/amd_kernel.hsaco")),
            amd("hsaco truncated", truncated(f"{key}/amd_kernel.hsaco")),
            amd("hsaco empty", empty(f"{key}/amd_kernel.hsaco")),
            amd("amdgcn garbage", garbage(f"{key}/amd_kernel.amdgcn"))]
    root, kernels = sources["triton39-binary-only"]
    key = sorted(k for k, n in kernels.items() if n == "add_kernel")[0]
    c = lambda what, damage: Case("triton", f"TRITON_STORE_BINARY_ONLY: {what}", key, damage,  # noqa: E731
                                  venv="triton39", source="triton39-binary-only")
    out += [c("intact", lambda root: None), c("cubin missing", missing(f"{key}/add_kernel.cubin")),
            c("metadata empty", empty(f"{key}/add_kernel.json"))]
    return out


# ---------------------------------------------------------------------------------------------- running


def prepare(case: Case, source: Path, workdir: Path, copies: tuple[str, ...] = matrix.COPIES) -> tuple[Path, ...]:
    """matrix.prepare for Triton: each copy is settled (its group paths lead into itself, as Triton
    writes them) before the damage."""
    roots = []
    for what in copies:
        (workdir / what).mkdir(parents=True, exist_ok=True)
        root = copy_root(source, workdir / what / "cache")
        settle(root)
        case.damage(root)
        if "fresh" not in case.name:  # a cache at rest (a fresh group-less kernel is `building`: test_triton.py)
            age_all(root)
        roots.append(root)
    return tuple(roots)


def run_triton_cases(cases: list[Case], sources, workdir: Path) -> list[CaseResult]:
    """matrix.run_cases with settled copies: the probes in one batch per (venv, as_owner), then kcache."""
    prepared = [prepare(c, sources[c.source or c.venv][0], workdir / f"case{i:03d}") for i, c in enumerate(cases)]
    verdicts = {}
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault((c.venv, c.as_owner), []).append(i)
    for (venv, as_owner), idx in groups.items():
        jobs = [(prepared[i][0], cases[i].entry, sources[cases[i].source or cases[i].venv][0]) for i in idx]
        verdicts.update(zip(idx, run_probes("triton", python_for(venv), jobs, as_owner=as_owner)))
    return [CaseResult(c, verdicts[i], kcache_view(prepared[i][1], prepared[i][2], as_owner=c.as_owner,
                                                   inspect=(c.entry,)))
            for i, c in enumerate(cases)]


@pytest.fixture(scope="module")
def real_results(sources, tmp_path_factory) -> list[CaseResult]:
    cases = all_cases(sources)
    results = run_triton_cases(matrix.only_selected(cases), sources, tmp_path_factory.mktemp("oracle-triton"))
    save_results(results)
    if recorded.RECORD and not os.environ.get("KCACHE_ORACLE_ONLY"):
        used = {c.source or c.venv for c in cases}
        recorded.save("triton", results, {"kernels": {n: sources[n][1] for n in sorted(used)}},
                      {n: sources[n][0] for n in sorted(used)})
    return results


@pytest.fixture(scope="module")
def replayed_results(tmp_path_factory) -> list[CaseResult]:
    """The recorded verdicts, kcache's side run on the recorded sources (each made by its Triton release)."""
    base = tmp_path_factory.mktemp("replay-triton")
    roots = recorded.extract("triton", base / "src")
    kernels = recorded.load("triton")["extra"]["kernels"]
    sources = {n: (roots[n], kernels[n]) for n in kernels}
    SOURCES.clear()
    SOURCES.update(roots)

    def copies(case: Case, workdir: Path, which: tuple[str, ...]) -> tuple[Path, ...]:
        return prepare(case, sources[case.source or case.venv][0], workdir, which)

    try:
        return recorded.replay("triton", all_cases(sources), copies, base / "cases")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["replayed", pytest.param("real", marks=pytest.mark.slow)])
def triton_results(request) -> list[CaseResult]:
    return request.getfixturevalue(f"{request.param}_results")


def save_results(results: list[CaseResult]) -> None:
    """matrix.save_results, the entry column named by its Triton release (its path is a bare key)."""
    where = os.environ.get("KCACHE_ORACLE_RESULTS")
    if where:
        os.makedirs(where, exist_ok=True)
        named = [{**matrix.record(r), "entry": f"Triton {r.case.venv[-2]}.{r.case.venv[-1]} kernel"} for r in results]
        Path(where, "triton.json").write_text(json.dumps(named, indent=1))


def describe(r: CaseResult) -> str:
    v = r.entry_view
    seen = f"ls {v.ls} ({v.reason}), verify {v.verify}, inspect {v.inspect}, pruned {v.pruned}" if v else "unlisted"
    return f"{r.case.venv} {r.case.name}: Triton {r.verdict.verdict} ({r.verdict.detail}); kcache {seen}"


def test_the_matrix_is_big_enough(triton_results):
    if not os.environ.get("KCACHE_ORACLE_ONLY"):
        assert len(triton_results) >= 90
        assert {r.case.venv for r in triton_results} == set(VERSIONS)


def test_pristine_kernels_are_hits_in_every_version(triton_results):
    if os.environ.get("KCACHE_ORACLE_ONLY"):
        pytest.skip("a replay of a few cases")
    pristine = [r for r in triton_results if r.case.name.endswith("intact")]
    assert pristine and all(r.verdict.verdict == "hit" for r in pristine), [describe(r) for r in pristine]


def test_kcache_agrees_with_triton_on_every_case(triton_results):
    bad = [f"{describe(r)}: {'; '.join(r.disagreements)}" for r in triton_results if r.disagreements]
    assert not bad, f"{len(bad)} of {len(triton_results)} cases disagree:\n" + "\n".join(bad)


def test_prune_broken_never_removes_what_triton_uses(triton_results):
    lost = [describe(r) for r in triton_results if loses_used_entry(r)]
    assert not lost, "\n".join(lost)



@pytest.mark.slow
def test_the_recorded_verdicts_are_current(real_results):
    recorded.assert_current("triton", real_results)
