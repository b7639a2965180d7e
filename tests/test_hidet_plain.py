"""hidet's one-pass judgement of the usual op entry (layouts/hidet.py _plain_op) never answers otherwise than
the rule (_judge_module's general steps): case by case, an op entry made from the real one
(tests/fixtures/real/hidet) and changed one way, judged for each hidet that may be installed, with its files
written in hidet's order or all at one time (a copy: the rule then reads lib.so's header and meta.json), the
scan's entry comes out the same with the one-pass judgement and without it; and the pristine entry is judged
in one pass (the fast path is not dead code that the comparison passes by default)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
from as_user import NOBODY, run_as

from kcache_cli.catalog.scan_context import ScanContext
from kcache_cli.layouts import hidet
from kcache_cli.model.records import COMPLETE

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "real" / "hidet" / "ops" / "cuda_space_0" / "softmax"
KEY = "ad252b064b266eea"
RUNNING = ["0.6.1", "0.7.0", ""]  # the entry's own hidet, another, none installed


def _rewrite(k: Path, name: str, data: bytes) -> None:
    """`name` holding `data`, its mtime as before."""
    t = os.stat(k / name).st_mtime
    (k / name).write_bytes(data)
    os.utime(k / name, (t, t))


def _meta(k: Path, change: Callable[[dict], object]) -> None:
    meta = json.loads((k / "meta.json").read_text())
    change(meta)
    _rewrite(k, "meta.json", json.dumps(meta).encode())


def _later(k: Path, name: str, seconds: float = 10) -> None:
    """`name` touched `seconds` after func_types.pickle was written."""
    t = os.stat(k / hidet.FUNC_TYPES).st_mtime + seconds
    os.utime(k / name, (t, t))


def _linked(k: Path, name: str) -> None:
    (k / name).rename(k.parent / name)
    (k / name).symlink_to(k.parent / name)


def _fifo(k: Path, name: str) -> None:
    (k / name).unlink()
    os.mkfifo(k / name)


def _elf_cut(k: Path) -> None:
    """lib.so cut short of the section table its ELF header places."""
    data = (k / "lib.so").read_bytes()
    _rewrite(k, "lib.so", data[: len(data) // 2])


CASES: dict[str, Callable[[Path], object]] = {
    "pristine": lambda k: None,
    "lib.so cut short": _elf_cut,
    "lib.so not ELF": lambda k: _rewrite(k, "lib.so", b"#" * 4096),
    "lib.so of 63 bytes": lambda k: _rewrite(k, "lib.so", (k / "lib.so").read_bytes()[:63]),
    "lib.so of one byte": lambda k: _rewrite(k, "lib.so", b"x"),
    "lib.so empty": lambda k: _rewrite(k, "lib.so", b""),
    "no lib.so": lambda k: (k / "lib.so").unlink(),
    "lib.so newer": lambda k: _later(k, "lib.so"),
    "lib.so newer, cut short": lambda k: (_elf_cut(k), _later(k, "lib.so")),
    "no func_types.pickle": lambda k: (k / hidet.FUNC_TYPES).unlink(),
    "func_types.pickle of 2 bytes": lambda k: _rewrite(k, hidet.FUNC_TYPES, b"\x80\x04"),
    "func_types.pickle without STOP": lambda k: _rewrite(k, hidet.FUNC_TYPES, b"\x80\x04" + b"x" * 40),
    "func_types.pickle written late, whole": lambda k: _later(k, hidet.FUNC_TYPES),
    "func_types.pickle written late, cut": lambda k: (_rewrite(k, hidet.FUNC_TYPES, b"\x80\x04" + b"x" * 40),
                                                      _later(k, hidet.FUNC_TYPES)),
    "meta.json not JSON": lambda k: _rewrite(k, "meta.json", b"{"),
    "meta.json empty": lambda k: _rewrite(k, "meta.json", b""),
    "meta.json without target": lambda k: _meta(k, lambda m: m.pop("target")),
    "meta.json a list": lambda k: _rewrite(k, "meta.json", b"[]"),
    "meta.json over a megabyte": lambda k: _meta(k, lambda m: m.update(pad="x" * (1 << 20))),
    "meta.json newer": lambda k: _later(k, "meta.json"),
    "meta.json newer, not JSON": lambda k: (_rewrite(k, "meta.json", b"{"), _later(k, "meta.json")),
    "no meta.json": lambda k: (k / "meta.json").unlink(),
    "version.txt another hidet's": lambda k: _rewrite(k, "version.txt", b"0.5.0"),
    "version.txt another hidet's, meta.json not JSON": lambda k: (_rewrite(k, "version.txt", b"0.5.0"),
                                                                  _rewrite(k, "meta.json", b"{")),
    "version.txt empty": lambda k: _rewrite(k, "version.txt", b""),
    "no version.txt": lambda k: (k / "version.txt").unlink(),
    "dispatch table": lambda k: (k / hidet.DISPATCH).write_text("a b\n1 2\n"),
    "dispatch table not integers": lambda k: (k / hidet.DISPATCH).write_text("a b\n1 x\n"),
    "symlinked lib.so": lambda k: _linked(k, "lib.so"),
    "symlinked meta.json": lambda k: _linked(k, "meta.json"),
    "symlinked task.txt": lambda k: _linked(k, "task.txt"),
    "FIFO for version.txt": lambda k: _fifo(k, "version.txt"),
    "FIFO for task.txt": lambda k: _fifo(k, "task.txt"),
    "FIFO for source.cu": lambda k: _fifo(k, "source.cu"),
    "directory for meta.json": lambda k: ((k / "meta.json").unlink(), (k / "meta.json").mkdir()),
    "a subdirectory": lambda k: (k / "extra").mkdir(),
    "lib.so of mode 000": lambda k: os.chmod(k / "lib.so", 0),
    "meta.json of mode 000": lambda k: os.chmod(k / "meta.json", 0),
    "func_types.pickle of mode 000": lambda k: os.chmod(k / hidet.FUNC_TYPES, 0),
    "task.txt read-only": lambda k: os.chmod(k / "task.txt", 0o444),
    "candidates.json read-only": lambda k: os.chmod(k / "candidates.json", 0o444),
    "another user's files": lambda k: [os.chown(f, 65534, 65534) for f in k.iterdir()],
    "another user's meta.json": lambda k: os.chown(k / "meta.json", 65534, 65534),
    "kcache's build (no hidet marker)": lambda k: [(k / n).unlink() for n in hidet.HIDET_MARKERS if (k / n).exists()],
}

ORDERS = ["hidet's", "one time"]


def _entry(tmp_path: Path, order: str) -> Path:
    """The real op entry in a cache of its own, its files written as hidet writes them (the sources, lib.so,
    its metadata, then func_types.pickle within a second), or all at one time as a copy leaves them."""
    k = tmp_path / "ops" / "cuda_space_0" / "softmax" / KEY
    shutil.copytree(FIXTURE / KEY, k)
    t = time.time() - 7200
    for f in k.iterdir():
        os.utime(f, (t, t))
    if order == "hidet's":
        for name in ("task.txt", "version.txt", "meta.json", "candidates.txt", "candidates.json"):
            os.utime(k / name, (t - 5, t - 5))
        os.utime(k / hidet.FUNC_TYPES, (t + 0.5, t + 0.5))
    return k


def _both(k: Path, running: str) -> tuple[object, object, bool]:
    """The scan's entry by the rule alone, the same with the one-pass judgement, and whether that
    judgement answered."""
    ctx = ScanContext(k.parents[3], lambda m: None)
    job = hidet.OpJob(str(k), k.name, "cuda", "cuda_space_0", "softmax", running)
    answered: list[bool] = []
    real = hidet._plain_op

    def told(*a) -> bool:
        answered.append(real(*a))
        return answered[-1]

    out = []
    for plain in (False, True):
        hidet._plain_op = told if plain else (lambda *a: False)  # type: ignore[assignment]
        try:
            out.append(hidet._op_entry(ctx, job))
        finally:
            hidet._plain_op = real
    return out[0], out[1], any(answered)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("running", RUNNING)
@pytest.mark.parametrize("case", list(CASES))
def test_one_pass_answers_as_the_rule(tmp_path: Path, case: str, running: str, order: str) -> None:
    k = _entry(tmp_path, order)
    CASES[case](k)
    ruled, fast, answered = _both(k, running)
    assert fast == ruled
    if answered:  # it answers only what the rule finds complete
        assert ruled.status == COMPLETE  # type: ignore[attr-defined]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("running", RUNNING)
def test_the_usual_entry_is_judged_in_one_pass(tmp_path: Path, running: str, order: str) -> None:
    ruled, fast, answered = _both(_entry(tmp_path, order), running)
    assert answered and fast == ruled
    assert (fast.status, fast.op, fast.files) == (COMPLETE, "softmax", 12)  # type: ignore[attr-defined]


@pytest.mark.parametrize("order", ORDERS)
def test_what_the_one_pass_reads(tmp_path: Path, order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy's entry (all files at one time) has lib.so's header and meta.json read, never version.txt; an
    entry as hidet wrote it has nothing read."""
    k = _entry(tmp_path, order)
    ctx = ScanContext(tmp_path, lambda m: None)
    read: list[str] = []
    real = hidet.fsread.read_listed
    monkeypatch.setattr(hidet.fsread, "read_listed", lambda fd, name, *a, **kw: (read.append(name), real(
        fd, name, *a, **kw))[1])
    with ctx.open_entry(str(k)) as d:
        names, _, mtimes = ctx.read_dir(d)
        assert names is not None and hidet._plain_op(d, names, mtimes)
    assert read == ([] if order == "hidet's" else ["lib.so", "meta.json"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as another user")
@pytest.mark.parametrize("owned", ["all", "all but meta.json"])
def test_another_users_files_are_judged_by_the_rule(owned: str) -> None:
    """Read as nobody, a file nobody does not own moves its atime when read (no O_NOATIME): only the rule
    reads it; an entry of nobody's own is judged in one pass."""
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # not tmp_path: nobody may search it
    try:
        os.chmod(top, 0o755)
        k = _entry(top, "one time")
        for f in [top, *top.rglob("*")]:
            os.chown(f, 0 if f.name == "meta.json" and owned != "all" else NOBODY, NOBODY)
        same, answered = _as_nobody(k)
    finally:
        shutil.rmtree(top)
    assert same
    assert answered == (owned == "all")


def _as_nobody(k: Path) -> tuple:
    """_both(k) as nobody: (same answers, answered in one pass)."""

    def both() -> tuple:
        _both(k, "0.6.1")  # the first read of a file not nobody's moves its atime (relatime)
        ruled, fast, answered = _both(k, "0.6.1")
        return fast == ruled, answered

    return run_as(NOBODY, both)
