"""The loader oracle for tilelang 0.1.15 (DESIGN.md sections 2.3, 2.8 and 10).

The real cache tilelang wrote (tests/fixtures/real/tilelang: one kernel, one cuda-binaries entry) is
damaged copy by copy; tests/loaders/probe_tilelang.py runs tilelang's own `_load_kernel_from_disk` (its
missing-file and manifest checks, params, the executable's load) and `CUDABinaryCache.load` on each, and
kcache's ls/verify/inspect/prune --broken (dry and real) must agree with what tilelang did."""

from __future__ import annotations

import json
import os
import shutil
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

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "fixtures" / "real" / "tilelang"
KERNEL = "0.1.15/linux-x86_64/kernels/cb68ca6910905a22415eeff34244c6b161f51a79389abd03689b1d0f2155a46e"
BINARY = "0.1.15/cuda-binaries/4bc9129df33af894bfd1791f214310dc6766749861079ac4b7eafa97e565e687"
KERNEL_FILES = ("device_kernel.cu", "host_kernel.cu", "executable.so", "params.json", "manifest.json")
BINARY_FILES = ("kernel.cubin", "metadata.json")
OLD = time.time() - 3 * 3600
DEEP = b"[" * 100_000 + b"]" * 100_000  # past Python's recursion limit in json.load
BLIND = ("ls hashes a file only when it changed after its manifest/metadata; a record edited after the "
         "files it describes is seen by verify, inspect and prune --broken")


def edit_json(rel: str, edit) -> callable:
    def go(root: Path) -> None:
        p = root / rel
        p.write_text(json.dumps(edit(json.loads(p.read_text())), indent=2, sort_keys=True))
    return go


def same_size_edit(rel: str) -> callable:
    """One byte of a source changed, its size kept (tilelang checks sources by size only)."""
    def go(root: Path) -> None:
        p = root / rel
        data = bytearray(p.read_bytes())
        data[len(data) // 2] = ord("#") if data[len(data) // 2] != ord("#") else ord("/")
        p.write_bytes(bytes(data))
    return go


def staging(rel: str, when: float | None) -> callable:
    """A `.staging/` write left by a killed tilelang (old) or in flight (fresh)."""
    def go(root: Path) -> None:
        d = root / rel
        d.mkdir(parents=True)
        (d / "kernel.cubin").write_bytes(b"\x7fELF half")
        if when is not None:
            for p in (d / "kernel.cubin", d):
                os.utime(p, (when, when))
    return go


def file_cases(entry: str, files: tuple[str, ...]) -> list[Case]:
    out = []
    for f in files:
        rel = f"{entry}/{f}"
        for what, damage in (("missing", missing(rel)), ("empty", empty(rel)), ("truncated", truncated(rel)),
                             ("garbage", garbage(rel)), ("a link to a good copy", link_to_good(rel)),
                             ("a dangling link", dangling_link(rel))):
            out.append(Case("tilelang", f"{f} {what}", entry, damage))
        out.append(Case("tilelang", f"{f} mode 000", entry, mode000(rel), as_owner=True))
    return out


def all_cases() -> list[Case]:
    k = lambda what, damage, **kw: Case("tilelang", what, KERNEL, damage, **kw)  # noqa: E731
    b = lambda what, damage, **kw: Case("tilelang", what, BINARY, damage, **kw)  # noqa: E731
    files = lambda m: {n: r for n, r in m["files"].items() if n != "executable.so"}  # noqa: E731
    out = [k("kernel intact", lambda root: None), b("binary intact", lambda root: None)]
    out += file_cases(KERNEL, KERNEL_FILES) + file_cases(BINARY, BINARY_FILES)
    out += [
        k("device_kernel.cu edited at the same size", same_size_edit(f"{KERNEL}/device_kernel.cu")),
        k("host_kernel.cu edited at the same size", same_size_edit(f"{KERNEL}/host_kernel.cu")),
        k("manifest does not list executable.so", edit_json(f"{KERNEL}/manifest.json", lambda m: {
            **m, "files": files(m)})),
        k("manifest without files", edit_json(f"{KERNEL}/manifest.json", lambda m: {"version": 1})),
        k("manifest records a wrong size for a source", edit_json(f"{KERNEL}/manifest.json", lambda m: {
            **m, "files": {**m["files"], "host_kernel.cu": {**m["files"]["host_kernel.cu"], "size": 1}}})),
        k("manifest records a wrong sha256 for a source", edit_json(f"{KERNEL}/manifest.json", lambda m: {
            **m, "files": {**m["files"], "host_kernel.cu": {**m["files"]["host_kernel.cu"], "sha256": "0" * 64}}})),
        k("manifest records a wrong sha256 for params.json", edit_json(f"{KERNEL}/manifest.json", lambda m: {
            **m, "files": {**m["files"], "params.json": {**m["files"]["params.json"], "sha256": "0" * 64}}}),
          ls_blind=BLIND),
        k("manifest nested 100,000 deep", add_file(f"{KERNEL}/manifest.json", DEEP)),
        k("junk file added to the kernel", add_file(f"{KERNEL}/notes.txt")),
        k("one mtime for every file", one_mtime()),
        k("kernel directory mode 000", mode000(KERNEL), as_owner=True),
        k("old .staging write beside it", staging("0.1.15/linux-x86_64/.staging/cb68-4242-0b8e", OLD)),
        k("fresh .staging write beside it", staging("0.1.15/linux-x86_64/.staging/cb68-4242-0b8f", None)),
        b("metadata with a wrong format tag", edit_json(f"{BINARY}/metadata.json", lambda m: {
            **m, "format": "tilelang.cuda-binary-cache.v0"})),
        b("metadata without a size", edit_json(f"{BINARY}/metadata.json", lambda m: {
            x: v for x, v in m.items() if x != "size"})),
        b("metadata without a sha256", edit_json(f"{BINARY}/metadata.json", lambda m: {
            x: v for x, v in m.items() if x != "sha256"})),
        b("metadata with a wrong sha256", edit_json(f"{BINARY}/metadata.json", lambda m: {**m, "sha256": "0" * 64}),
          ls_blind=BLIND),
        b("metadata size as a string", edit_json(f"{BINARY}/metadata.json", lambda m: {**m, "size": str(m["size"])})),
        b("metadata nested 100,000 deep", add_file(f"{BINARY}/metadata.json", DEEP)),
        b("junk file added to the binary", add_file(f"{BINARY}/notes.txt")),
        b("one mtime for every file (binary)", one_mtime()),
        b("binary directory mode 000", mode000(BINARY), as_owner=True),
        b("binary directory emptied", chain(missing(f"{BINARY}/kernel.cubin"), missing(f"{BINARY}/metadata.json"))),
        b("old .staging/cuda-binaries write beside it", staging("0.1.15/.staging/cuda-binaries/4bc9.4242.ab", OLD)),
    ]
    return out


def writable(root: Path) -> None:
    """The fixture is kept read-only; a cache tilelang wrote is its owner's to change (0755/0644)."""
    for dirpath, _dirs, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o644 if not n.endswith(".so") else 0o755)


def prepare(case: Case, workdir: Path, copies: tuple[str, ...] = matrix.COPIES) -> tuple[Path, ...]:
    roots = []
    for what in copies:
        (workdir / what).mkdir(parents=True, exist_ok=True)
        root = copy_root(SOURCE, workdir / what / "cache")
        writable(root)
        case.damage(root)
        roots.append(root)
    return tuple(roots)


@pytest.fixture(scope="module")
def real_results(tmp_path_factory) -> list[CaseResult]:
    python = python_for("tilelang")
    cases = matrix.only_selected(all_cases())
    work = tmp_path_factory.mktemp("oracle-tilelang")
    prepared = [prepare(c, work / f"case{i:03d}") for i, c in enumerate(cases)]
    verdicts = {}
    for as_owner in (False, True):
        idx = [i for i, c in enumerate(cases) if c.as_owner == as_owner]
        jobs = [(prepared[i][0], cases[i].entry, SOURCE) for i in idx]
        verdicts.update(zip(idx, run_probes("tilelang", python, jobs, as_owner=as_owner) if jobs else []))
    results = [CaseResult(c, verdicts[i], kcache_view(prepared[i][1], prepared[i][2], as_owner=c.as_owner,
                                                      inspect=(c.entry,)))
               for i, c in enumerate(cases)]
    where = os.environ.get("KCACHE_ORACLE_RESULTS")
    if where:  # matrix.save_results, the entry column named by its kind (its path starts with a version)
        os.makedirs(where, exist_ok=True)
        named = [{**matrix.record(r), "entry": "kernel" if r.case.entry == KERNEL else "cuda-binary"} for r in results]
        Path(where, "tilelang.json").write_text(json.dumps(named, indent=1))
    if recorded.RECORD and not os.environ.get("KCACHE_ORACLE_ONLY"):
        recorded.save("tilelang", results)
    return results


@pytest.fixture(scope="module")
def replayed_results(tmp_path_factory) -> list[CaseResult]:
    base = tmp_path_factory.mktemp("replay-tilelang")
    try:
        return recorded.replay("tilelang", all_cases(), lambda c, w, which: prepare(c, w, which), base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["replayed", pytest.param("real", marks=pytest.mark.slow)])
def tilelang_results(request) -> list[CaseResult]:
    return request.getfixturevalue(f"{request.param}_results")


def describe(r: CaseResult) -> str:
    v = r.entry_view
    seen = f"ls {v.ls} ({v.reason}), verify {v.verify}, inspect {v.inspect}, pruned {v.pruned}" if v else "unlisted"
    return f"{r.case.name}: tilelang {r.verdict.verdict} ({r.verdict.detail}); kcache {seen}"


def test_the_matrix_is_big_enough(tilelang_results):
    if not os.environ.get("KCACHE_ORACLE_ONLY"):
        assert len(tilelang_results) >= 60


def test_pristine_entries_are_hits(tilelang_results):
    if os.environ.get("KCACHE_ORACLE_ONLY"):
        pytest.skip("a replay of a few cases")
    pristine = [r for r in tilelang_results if r.case.name.endswith("intact")]
    assert pristine and all(r.verdict.verdict == "hit" for r in pristine), [describe(r) for r in pristine]


def test_kcache_agrees_with_tilelang_on_every_case(tilelang_results):
    bad = [f"{describe(r)}: {'; '.join(r.disagreements)}" for r in tilelang_results if r.disagreements]
    assert not bad, f"{len(bad)} of {len(tilelang_results)} cases disagree:\n" + "\n".join(bad)


def test_prune_broken_never_removes_what_tilelang_uses(tilelang_results):
    lost = [describe(r) for r in tilelang_results if loses_used_entry(r)]
    assert not lost, "\n".join(lost)



@pytest.mark.slow
def test_the_recorded_verdicts_are_current(real_results):
    recorded.assert_current("tilelang", real_results)
