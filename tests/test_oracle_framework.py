"""The loader oracle's own rules (tests/loaders/matrix.py): agree() holds kcache's commands to DESIGN 2.8
and to each other; the damages do what they say. No loader venv is needed here."""

from __future__ import annotations

import os

import pytest
from loaders.matrix import (
    Case,
    EntryView,
    Verdict,
    agree,
    dangling_link,
    empty,
    garbage,
    link_to_good,
    missing,
    mode000,
    one_mtime,
    truncated,
)


def view(status: str, pruned: bool | None = None, **kw) -> EntryView:
    removed = status in ("partial", "failed", "corrupt") if pruned is None else pruned
    fields = {"ls": status, "reason": None, "verify": status, "inspect": status, "dry_pruned": removed,
              "pruned": removed, "deep_pruned": status in ("partial", "failed", "corrupt")}
    fields.update(kw)
    return EntryView(**fields)


@pytest.mark.parametrize("verdict, status", [("hit", "complete"), ("reuse", "complete"), ("recompile", "partial"),
                                             ("recompile", "failed"), ("crash", "corrupt"),
                                             ("miss-forever", "corrupt"), ("unused", "stale"),
                                             ("crash", "unreadable")])
def test_agreeing_views(verdict, status):
    assert agree(Verdict(verdict, ""), view(status)) == []


@pytest.mark.parametrize("verdict, status", [("hit", "corrupt"), ("reuse", "stale"), ("recompile", "complete"),
                                             ("crash", "complete"), ("hit", "unreadable"), ("unused", "corrupt")])
def test_disagreeing_status(verdict, status):
    assert agree(Verdict(verdict, ""), view(status))


def test_commands_must_agree_with_each_other():
    assert agree(Verdict("crash", ""), view("corrupt", inspect="unreadable"))
    assert agree(Verdict("crash", ""), view("corrupt", verify="unreadable", inspect="unreadable"))
    assert agree(Verdict("crash", ""), view("corrupt", dry_pruned=False))  # the dry run and the real run differ


def test_prune_must_not_remove_what_the_loader_uses_nor_keep_what_is_broken():
    assert agree(Verdict("hit", ""), view("complete", pruned=True))
    assert agree(Verdict("unused", ""), view("stale", pruned=True))  # stale is never --broken's to remove
    assert agree(Verdict("crash", ""), view("corrupt", pruned=False))


def test_prune_deep_must_remove_what_verify_calls_broken_and_nothing_the_loader_uses():
    case = Case("hidet", "x", "e", lambda root: None, ls_blind="same size, same mtime")
    assert agree(Verdict("crash", ""), view("corrupt", ls="complete", pruned=False), case) == []
    assert agree(Verdict("crash", ""), view("corrupt", ls="complete", pruned=False, deep_pruned=False), case)
    assert agree(Verdict("hit", ""), view("complete", deep_pruned=True))


def test_a_blind_ls_is_excused_only_for_ls():
    case = Case("hidet", "x", "e", lambda root: None, ls_blind="same size, same mtime")
    assert agree(Verdict("crash", ""), view("corrupt", ls="complete", pruned=False), case) == []
    assert agree(Verdict("crash", ""), view("corrupt", ls="complete", verify="complete", pruned=False), case)


def test_an_unlisted_entry_disagrees():
    assert agree(Verdict("hit", ""), None)


def test_damages(tmp_path):
    (tmp_path / "d").mkdir()
    for n in "abcdefg":
        (tmp_path / "d" / n).write_bytes(b"0123456789" * 10)
    missing("d/a")(tmp_path)
    empty("d/b")(tmp_path)
    truncated("d/c")(tmp_path)
    garbage("d/d")(tmp_path)
    link_to_good("d/e")(tmp_path)
    dangling_link("d/f")(tmp_path)
    mode000("d/g")(tmp_path)
    d = tmp_path / "d"
    assert not (d / "a").exists() and (d / "b").stat().st_size == 0 and (d / "c").stat().st_size == 50
    assert (d / "d").stat().st_size == 100 and (d / "d").read_bytes() != b"0123456789" * 10
    assert (d / "e").is_symlink() and (d / "e").read_bytes() == b"0123456789" * 10
    assert (d / "f").is_symlink() and not (d / "f").exists()
    assert (d / "g").stat().st_mode & 0o777 == 0
    one_mtime(1_600_000_000.0)(tmp_path)
    assert {os.lstat(d / n).st_mtime for n in "bcdeg"} == {1_600_000_000.0}
