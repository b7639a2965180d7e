"""Triton's one-pass judgement of the usual kernel (layouts/triton.py _plain_entry) never answers otherwise
than the rule (judge_files through _Listing): case by case, a key directory made from the real kernel
(tests/fixtures/real/triton) and changed one way, the scan's entry and the index's key come out the same
with the one-pass judgement and without it; and the pristine kernel is judged in one pass (the fast path is
not dead code that the comparison passes by default)."""

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
from kcache_cli.layouts import triton
from kcache_cli.model.records import COMPLETE, ScanFilter

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "real" / "triton" / "cache"
KEY = "QKJDT6YVJBF6PBUBRY6ITHX2267DQCKVQW4DRRFH5NS63H4H25FA"  # add_kernel, sm_90a
HEX_KEY = "5e" * 32  # a key Triton <= 3.1 named
GROUP = "__grp__add_kernel.json"


def _group(k: Path) -> dict:
    return json.loads((k / GROUP).read_text())


def _write_group(k: Path, group: object, raw: str | None = None) -> None:
    _rewrite(k, GROUP, raw if raw is not None else json.dumps(group))


def _meta(k: Path, change: Callable[[dict], object]) -> None:
    meta = json.loads((k / "add_kernel.json").read_text())
    change(meta)
    _rewrite(k, "add_kernel.json", json.dumps(meta))


def _rewrite(k: Path, name: str, text: str) -> None:
    """`name` holding `text`, its mtime as before (older than the group's: the rule does not read it again)."""
    t = os.stat(k / name).st_mtime
    (k / name).write_text(text)
    os.utime(k / name, (t, t))


def _paths(k: Path, change: Callable[[str, str], str]) -> None:
    group = _group(k)
    group["child_paths"] = {n: change(n, p) for n, p in group["child_paths"].items()}
    _write_group(k, group)


def _newer(k: Path, name: str, data: bytes | None = None) -> None:
    """`name` rewritten (or touched) after the group file was written: the rule reads it again."""
    if data is not None:
        (k / name).write_bytes(data)
    t = os.stat(k / GROUP).st_mtime + 1
    os.utime(k / name, (t, t))


def _second_group(k: Path, good: bool) -> None:
    for n in ("add_kernel.json", "add_kernel.cubin"):
        shutil.copy2(k / n, k / n.replace("add_kernel", "add_two"))
    group = {"child_paths": {"add_two.json": str(k / "add_two.json"),
                             "add_two.cubin": str(k / ("add_two.cubin" if good else "nothing.cubin"))}}
    (k / "__grp__add_two.json").write_text(json.dumps(group))
    t = os.stat(k / GROUP).st_mtime
    os.utime(k / "__grp__add_two.json", (t, t))


CASES: dict[str, Callable[[Path], object]] = {
    "pristine": lambda k: None,
    "moved": lambda k: _paths(k, lambda n, p: p.replace(str(k.parent), "/elsewhere/cache")),
    "path to another file": lambda k: _paths(k, lambda n, p: p.replace("add_kernel.ptx", "add_kernel.ttir")),
    "relative path": lambda k: _paths(k, lambda n, p: f"{k.name}/{n}"),
    "missing child": lambda k: (k / "add_kernel.ptx").unlink(),
    "missing metadata": lambda k: (k / "add_kernel.json").unlink(),
    "child newer, intact": lambda k: _newer(k, "add_kernel.ttir"),
    "child newer, not text": lambda k: _newer(k, "add_kernel.ttir", b"\xff\xfe\x00bad"),
    "binary newer, truncated": lambda k: _newer(k, "add_kernel.cubin", b"\x7fELF\x02\x01\x01"),
    "metadata newer": lambda k: _newer(k, "add_kernel.json"),
    "group not JSON": lambda k: _write_group(k, None, "{not json"),
    "group empty": lambda k: _write_group(k, None, ""),
    "group null": lambda k: _write_group(k, None),
    "group a list": lambda k: _write_group(k, [1, 2]),
    "no child_paths": lambda k: _write_group(k, {"other": 1}),
    "child_paths a list": lambda k: _write_group(k, {"child_paths": ["add_kernel.json"]}),
    "group lists no metadata": lambda k: _write_group(k, {"child_paths": {
        n: p for n, p in _group(k)["child_paths"].items() if n != "add_kernel.json"}}),
    "group lists itself": lambda k: _write_group(k, {"child_paths": {
        GROUP: str(k / GROUP), **_group(k)["child_paths"]}}),
    "metadata without target": lambda k: _meta(k, lambda m: m.pop("target")),
    "metadata without warp_size": lambda k: _meta(k, lambda m: m["target"].pop("warp_size")),
    "metadata null": lambda k: _rewrite(k, "add_kernel.json", "null"),
    "metadata a list": lambda k: _rewrite(k, "add_kernel.json", "[]"),
    "metadata for hip": lambda k: _meta(k, lambda m: m["target"].update(backend="hip", arch="gfx942")),
    "metadata not JSON": lambda k: _rewrite(k, "add_kernel.json", "{"),
    "metadata NaN": lambda k: _rewrite(k, "add_kernel.json", (k / "add_kernel.json").read_text()[:-1] + ', "x": NaN}'),
    "metadata too big": lambda k: _meta(k, lambda m: m.update(pad="x" * (triton.MAX_META + 1))),
    "binary not listed": lambda k: _write_group(k, {"child_paths": {
        n: p for n, p in _group(k)["child_paths"].items() if n != "add_kernel.cubin"}}),
    "binary at a path not ending .cubin": lambda k: _paths(
        k, lambda n, p: p + "x" if n == "add_kernel.cubin" else p),
    "stray file": lambda k: (k / "notes.txt").write_text("hello"),
    "symlinked child": lambda k: ((k / "add_kernel.ptx").rename(k.parent / "ptx"),
                                  (k / "add_kernel.ptx").symlink_to(k.parent / "ptx")),
    "symlinked group": lambda k: ((k / GROUP).rename(k.parent / "grp"), (k / GROUP).symlink_to(k.parent / "grp")),
    "FIFO": lambda k: os.mkfifo(k / "pipe"),
    "FIFO for the metadata": lambda k: ((k / "add_kernel.json").unlink(), os.mkfifo(k / "add_kernel.json")),
    "temp dir": lambda k: (k / "tmp.pid_12_ab").mkdir(),
    "file of mode 000": lambda k: os.chmod(k / "add_kernel.ttir", 0),
    "group of mode 000": lambda k: os.chmod(k / GROUP, 0),
    "directory of mode 000": lambda k: os.chmod(k, 0),
    "two groups": lambda k: _second_group(k, True),
    "two groups, one broken": lambda k: _second_group(k, False),
    "hard links": lambda k: os.link(k / "add_kernel.ptx", k.parent / "ptx-link"),
    "another user's files": lambda k: [os.chown(f, 65534, 65534) for f in k.iterdir()],
    "no group": lambda k: (k / GROUP).unlink(),
    "only autotune results": lambda k: ([f.unlink() for f in k.iterdir()],
                                        (k / "add.autotune.json").write_text('{"configs_timings": []}')),
}


def _kernel(tmp_path: Path, key: str = KEY) -> Path:
    """The real kernel under `key` in a cache of its own, its group paths leading into it and its files
    written as Triton writes them: the stages and metadata first, the group file a second later."""
    root = tmp_path / "cache"
    k = root / key
    shutil.copytree(FIXTURE / KEY, k)
    group = _group(k)
    group["child_paths"] = {n: str(k / n) for n in group["child_paths"]}
    (k / GROUP).write_text(json.dumps(group))
    t = time.time() - 7200
    for f in k.iterdir():
        os.utime(f, (t, t))
    os.utime(k / GROUP, (t + 1, t + 1))
    return k


def _both(k: Path, flt: ScanFilter | None = None) -> tuple[tuple, tuple, bool]:
    """(entry, index key) by the rule alone, the same with the one-pass judgement, and whether that
    judgement answered."""
    ctx = ScanContext(k.parent, lambda m: None)
    out = []
    for plain in (False, True):
        ctx.recording = {}
        with ctx.open_entry(str(k)) as d:
            fast = triton._plain_entry(ctx, d, str(k), flt) if plain else triton._NOT_PLAIN
        with ctx.open_entry(str(k)) as d:
            entry = triton._key_entry(ctx, d, str(k), flt) if plain else _ruled(ctx, d, str(k), flt)
        out.append((entry, _key(ctx.recording.get(str(k)))))
    return out[0], out[1], fast is not triton._NOT_PLAIN


def _key(seen: tuple | None) -> tuple | None:
    """What the index keys a record with (catalog/index.py _record), of what a judgement recorded: the
    directory's atime moves with the first listing, and is in no key."""
    if seen is None:
        return None
    st, stats = seen
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns), [
        (n, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_mode) for n, s in stats]


def _ruled(ctx, d, path: str, flt) -> object:
    real = triton._plain_entry
    triton._plain_entry = lambda *a: triton._NOT_PLAIN  # type: ignore[assignment]
    try:
        return triton._key_entry(ctx, d, path, flt)
    finally:
        triton._plain_entry = real  # type: ignore[assignment]


@pytest.mark.parametrize("case", list(CASES))
def test_one_pass_answers_as_the_rule(tmp_path: Path, case: str) -> None:
    k = _kernel(tmp_path)
    CASES[case](k)
    try:
        ruled, fast, answered = _both(k)
    finally:
        os.chmod(k, 0o755)
    assert fast == ruled
    if answered:  # it answers only what the rule finds complete
        assert ruled[0].status == COMPLETE


@pytest.mark.parametrize("key", [KEY, HEX_KEY])
def test_the_usual_kernel_is_judged_in_one_pass(tmp_path: Path, key: str) -> None:
    k = _kernel(tmp_path, key)
    ruled, fast, answered = _both(k)
    assert answered and fast == ruled
    entry, seen = fast
    assert (entry.status, entry.op, entry.space, entry.files) == (COMPLETE, "add_kernel", "sm_90a", 8)
    assert seen is not None and [n for n, *_ in seen[1]] == sorted(os.listdir(k))


@pytest.mark.parametrize("op", ["add_kernel", "matmul_kernel"])
def test_an_op_filter_answers_as_the_rule(tmp_path: Path, op: str) -> None:
    ruled, fast, answered = _both(_kernel(tmp_path), ScanFilter(ops=(op,)))
    assert answered and fast == ruled
    assert (fast[0] is None) == (op != "add_kernel")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as another user")
@pytest.mark.parametrize("owned", ["all", "none", "all but the op's metadata"])
def test_another_users_files_are_judged_by_the_rule(owned: str) -> None:
    """Read as nobody, a file nobody does not own moves its atime when read (no O_NOATIME): only the rule
    reads it (and notes that), whichever of the files it is; a kernel of nobody's own is judged in one
    pass."""
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # not tmp_path: nobody may search it
    try:
        os.chmod(top, 0o755)
        k = _kernel(top)
        group = _group(k)
        if owned == "all but the op's metadata":  # the group's metadata is another file, listed first
            shutil.copy2(k / "add_kernel.json", k / "copy.json")
            group["child_paths"] = {"copy.json": str(k / "copy.json"), **group["child_paths"]}
            _write_group(k, group)
        for f in [top, *top.rglob("*")]:
            mine = owned == "all" or owned.startswith("all but") and f.name != "add_kernel.json"
            os.chown(f, NOBODY if mine or f.is_dir() else 0, NOBODY)
        same, answered, space = _as_nobody(k)
    finally:
        shutil.rmtree(top)
    assert same and space == "sm_90a"
    assert answered == (owned == "all")


def _as_nobody(k: Path) -> tuple:
    """_both(k) as nobody: (same answers, answered in one pass, the space)."""

    def both() -> tuple:
        _both(k)  # the first read of a file not nobody's moves its atime (relatime): not the next ones
        ruled, fast, answered = _both(k)
        return fast == ruled, answered, fast[0].space

    return run_as(NOBODY, both)
