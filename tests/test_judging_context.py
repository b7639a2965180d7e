"""A judgement is handed its context, it fetches none (issue 23): the entry's directory held open (an
`EntryDir` opened from the anchored root) and a `Judging` (deep or cheap, the compiler version in use,
the clock). It resolves no path of its own: once every entry of a real cache is held open, the whole
cache can move to another name and every judgement still reads the same files and says the same."""

from __future__ import annotations

import os
import threading

import pytest

from kcache_cli import layouts
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts.base import Judging

REAL = ("hidet", "tilus", "tilelang", "triton")


def _judged(root, deep: bool) -> tuple[dict[str, tuple], list]:
    """Every entry a layout judges, held open from one anchor, with its judgement now."""
    anchor = fsread.Anchor(root)
    held, verdicts = [], {}
    for e in scan_cache(root).entries:
        layout = layouts.get(e.layout)
        if not e.hash or layout.leftover(e) is not None or os.path.islink(e.path):
            continue
        d = EntryDir.open(e.path, anchor)
        held.append((e, d))
        j = layout.judge(d, e.kind, layout.judging(deep))
        verdicts[e.relpath] = (j.status, j.reason)
    return verdicts, held


@pytest.mark.parametrize("deep", [False, True], ids=["cheap", "deep"])
@pytest.mark.parametrize("name", REAL)
def test_a_judgement_reads_only_through_what_it_is_handed(fixture_copy, tmp_path, name, deep):
    root = fixture_copy(name)
    if name == "triton":
        root = root / "cache"  # the fixture holds Triton's cache dir; its kernels say they were made elsewhere
    before, held = _judged(root, deep)
    assert len(before) >= 2 and any(s in ("complete", "moved") for s, _ in before.values()), before
    moved = root.with_name(root.name + "-moved")
    os.rename(root, moved)  # every path the scan handed out now names nothing
    try:
        after = {}
        for e, d in held:
            layout = layouts.get(e.layout)
            j = layout.judge(d, e.kind, layout.judging(deep))
            after[e.relpath] = (j.status, j.reason.replace(str(moved), str(root)) if j.reason else None)
        assert after == before
    finally:
        for _, d in held:
            d.close()


def test_the_version_in_use_is_passed_not_looked_up(fixture_copy):
    """hidet's judgement goes by `Judging.version` alone: the same entry judged at once in two threads
    against two hidet versions gets each its own answer (no module or thread state carries one). The
    entry is one `kcache build` made (no hidet metadata): a hidet 0.6 or later compiles it again, an
    older one (or none installed) loads its lib.so."""
    root = fixture_copy("hidet")
    layout = layouts.get("hidet")
    e = next(e for e in scan_cache(root).entries if e.kind == "op" and e.status == "complete")
    for name in ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle"):
        if os.path.lexists(os.path.join(e.path, name)):
            os.unlink(os.path.join(e.path, name))
    answers: dict[str, list[tuple]] = {"0.5.0": [], "9.9.9": []}

    def judge(version: str) -> None:
        for _ in range(50):
            with EntryDir.open(e.path, fsread.anchor(root)) as d:
                j = layout.judge(d, "op", Judging(deep=True, version=version))
            answers[version].append((j.status, j.reason))

    threads = [threading.Thread(target=judge, args=(v,)) for v in answers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(answers["0.5.0"]) == {("complete", None)}
    assert len(set(answers["9.9.9"])) == 1, set(answers["9.9.9"])
    status, reason = answers["9.9.9"][0]
    assert status == "partial" and "hidet 9.9.9 compiles it again" in (reason or "")


def test_a_directory_swapped_for_a_link_is_seen_by_the_entry_it_was_opened_for(fixture_copy, tmp_path):
    """The root's anchor counts the reads it refused because a directory on the way had become a link;
    each EntryDir says whether one happened while it was open (`swapped`): the judgement in flight then
    concludes nothing. One opened afterwards starts clean; the count is the anchor's, not the process's."""
    root = fixture_copy("hidet")
    entries = [e for e in scan_cache(root).entries if e.kind == "op" and e.status == "complete"]
    anchor = fsread.Anchor(root)
    first = EntryDir.open(entries[0].path, anchor)
    space = os.path.dirname(os.path.dirname(entries[1].path))
    os.rename(space, space + ".real")
    os.symlink(space + ".real", space)
    second = EntryDir.open(entries[1].path, anchor)
    assert second.fd is None and second.swapped
    assert first.swapped  # it was open while the swap was refused: its judgement concludes nothing either
    fresh = EntryDir.open(os.path.join(root, "ops"), anchor)
    assert fresh.fd is not None and not fresh.swapped
    for d in (first, second, fresh):
        d.close()
