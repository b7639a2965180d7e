"""The small things a newcomer met (issue 36): Ctrl-C says what was removed whenever it lands, an
interrupt that reaches the top is never silent, "did you mean" never offers the prefix just refused,
diff never suggests an option it lacks, and a missing file named on the command line is a usage error."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from test_delete import gen

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import state


def _interrupt_before(monkeypatch, owner, name: str) -> list[str]:
    """SIGINT to this process just before `owner.name` runs (as a Ctrl-C landing there); what ran."""
    real = getattr(owner, name)
    ran: list[str] = []

    def wrapped(*a, **k):
        if not ran:
            ran.append(name)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(owner, name, wrapped)
    return ran


@pytest.mark.parametrize("command", [("prune", "--max-size", "0"), ("clear", "--all")])
def test_ctrl_c_while_the_trash_is_emptied_says_what_was_removed(kcache, tmp_path, monkeypatch, command):
    from kcache_cli.ops import delete

    root = gen(tmp_path, 60)
    ran = _interrupt_before(monkeypatch, delete._Deleter, "finish")
    r = kcache("--cache-dir", root, *command, "--yes")
    assert ran and r.exit_code == 130, (r.stdout, r.stderr)
    assert "interrupted: removed 60 of 60 entries" in r.stderr and "nothing half-removed" in r.stderr
    assert not scan_cache(root).entries  # every entry left the cache whole
    again = kcache("--cache-dir", root, "prune", "--broken", "--yes")  # the next run empties the trash
    assert again.exit_code == 0, again.stderr
    assert list(state.trash_dir(root).iterdir()) == []


def test_ctrl_c_while_the_result_prints_says_what_was_removed(kcache, tmp_path, monkeypatch):
    from kcache_cli.cli import cmd_delete

    root = gen(tmp_path, 30)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd_delete, "_table", interrupted)
    r = kcache("--cache-dir", root, "prune", "--max-size", "0", "--yes", "--list")  # a row per entry
    assert r.exit_code == 130
    assert "interrupted: removed 30 of 30 entries" in r.stderr, r.stderr


def test_an_interrupt_that_reaches_the_top_is_said(kcache, fixture_copy, monkeypatch):
    """Typer turns a KeyboardInterrupt into a silent exit 130; kcache says `Error: interrupted`."""
    from kcache_cli.cli import cmd_read

    root = fixture_copy("hidet")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd_read, "_ls_table", interrupted)
    r = kcache("--cache-dir", root, "ls")
    assert r.exit_code == 130 and r.stderr == "Error: interrupted\n", r.stderr


def test_did_you_mean_never_offers_the_prefix_just_refused(kcache, fixture_copy):
    root = fixture_copy("hidet")
    for args in (("ls", "8d1f7691", "--op", "relu"), ("verify", "8d1f7691", "--op", "relu")):
        r = kcache("--cache-dir", root, *args)
        assert r.exit_code == 2 and "8d1f7691" in r.stderr
        assert "did you mean 8d1f7691" not in r.stderr, r.stderr
    near = kcache("--cache-dir", root, "ls", "8d1f7692")
    assert near.exit_code == 2 and "did you mean 8d1f7691?" in near.stderr  # a real typo still gets one


def test_diff_never_suggests_an_option_it_lacks(kcache, fixture_copy):
    import shutil

    root = fixture_copy("hidet")
    shutil.copytree(root / "ops/cuda_space_0", root / "ops/cuda_space_2")
    r = kcache("--cache-dir", root, "diff", "ad252b06", "8d1f7691")
    assert r.exit_code == 2 and "ambiguous" in r.stderr and "path" in r.stderr
    assert "--space" not in r.stderr, r.stderr
    assert "--space" in kcache("--cache-dir", root, "inspect", "ad252b06").stderr  # inspect has it


def test_a_missing_file_on_the_command_line_is_a_usage_error(kcache, fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    missing = kcache("--cache-dir", root, "import", tmp_path / "nope.tar.zst")
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: cannot read"), missing.stderr
    nowhere = kcache("--cache-dir", root, "export", tmp_path / "no" / "dir" / "x.tar", "--op", "add")
    assert nowhere.exit_code == 2 and "is not a directory" in nowhere.stderr, nowhere.stderr
    assert not (tmp_path / "no").exists()
    for args in (("ls", str(tmp_path / "nope")), ("inspect", str(tmp_path / "nope"))):
        assert kcache("--cache-dir", root, *args).exit_code == 2
    assert Path(root).is_dir()
