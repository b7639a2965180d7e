"""A cache changed while kcache reads it: an entry the scan listed as a directory and that is a symlink out
of the cache by the time verify (or inspect, explain) describes it is never read through the link."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.layouts import hidet, tilus
from kcache_cli.layouts.base import Here
from kcache_cli.ops.verify import verify_cache

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "real" / "hidet"
TILUS = FIXTURE.parent / "tilus"
MARK = "OUTSIDE-THE-CACHE"


@pytest.fixture
def swapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the cache, a directory outside it): each hidet op entry becomes a symlink to that directory (holding
    an entry's files, its texts marked) just after the scan listed it, as describe starts on it."""
    root, outside = tmp_path / "cache", tmp_path / "outside"
    shutil.copytree(FIXTURE, root)
    first = next((root / "ops" / "cuda_space_0").glob("*/*"))
    shutil.copytree(first, outside)
    for n in ("compile.sh", "nvcc_output.txt", "version.txt", "nvcc_log.txt"):
        (outside / n).write_text(f"{MARK} nvcc -arch=sm_99 {n}\n")
    judged = hidet._deep_judgement

    def swap_then_judge(root_: Path, entry):
        shutil.rmtree(entry.path)
        os.symlink(outside, entry.path)
        return judged(root_, entry)

    monkeypatch.setattr(hidet, "_deep_judgement", swap_then_judge)
    return root, outside


def test_describe_never_reads_through_an_entry_swapped_for_a_link(swapped: tuple[Path, Path]) -> None:
    root, outside = swapped
    opened: list[str] = []
    real_open = os.open

    def watch(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        opened.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fd

    os.open = watch  # type: ignore[assignment]
    try:
        result = verify_cache(root)
    finally:
        os.open = real_open  # type: ignore[assignment]
    assert result.checked and all(c.status != "complete" for c in result.checked)
    assert [p for p in opened if p.startswith(str(outside) + "/")] == []


def test_inspect_shows_nothing_read_through_an_entry_swapped_for_a_link(swapped: tuple[Path, Path]) -> None:
    root, _ = swapped
    entry = next(e for e in scan_cache(root).entries if e.layout == "hidet")
    details = hidet.describe(root, entry)
    assert details.status != "complete"
    assert MARK not in repr((details.compile_command, details.compiler_output, details.facts))


def test_tilus_describe_never_reads_through_a_program_swapped_for_a_link(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root, outside = tmp_path / "cache", tmp_path / "outside"
    shutil.copytree(TILUS, root, symlinks=True)
    program = next((root / "programs").iterdir())
    shutil.copytree(program, outside, symlinks=True)
    (outside / "options.txt").write_text(f"{MARK} arch='sm_99'\n")
    entry = next(e for e in scan_cache(root).entries if e.kind == "program")
    listed = tilus.list_files

    def swap_then_list(path: str, warn=None) -> tuple:  # describe's first step
        shutil.rmtree(entry.path)
        os.symlink(outside, entry.path)
        return listed(path, warn)

    monkeypatch.setattr(tilus, "list_files", swap_then_list)
    details = tilus.describe(root, entry)
    assert MARK not in repr(details.facts) and "sm_99" not in repr(details.facts)


def test_hidet_explain_never_reads_through_an_entry_swapped_for_a_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "cache", tmp_path / "outside"
    shutil.copytree(FIXTURE, root)
    entry = next(e for e in scan_cache(root).entries if e.layout == "hidet")  # listed as a directory
    shutil.copytree(entry.path, outside)
    (outside / "version.txt").write_text("9.9.9\n")
    (outside / "compile.sh").write_text(f"{MARK}\nnvcc -arch=sm_99 source.cu\n")
    shutil.rmtree(entry.path)
    os.symlink(outside, entry.path)
    here = Here("3.12", None, {"hidet": None}, None, "none", {})
    verdict = hidet.explain(root, entry, here)  # hidet not installed: the miss names the version recorded
    assert "9.9.9" not in repr(verdict) and "sm_99" not in repr(verdict)
