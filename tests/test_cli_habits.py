"""The command line fits its users' habits, for every registered command (including ones added later):
help with an example, global options after the subcommand, plain output without a terminal or with
NO_COLOR, --json for data, and every error one line on stderr with a non-zero exit."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES, copy_tree
from typer.main import get_command

from kcache_cli.cli.app import full_app

app = full_app()

GROUP = get_command(app)
COMMANDS = sorted(GROUP.commands)
HIDET = FIXTURES / "hidet"
HASH = "ad252b064b266eea"  # softmax, cuda_space_0
GLOBAL_OPTIONS = ("--cache-dir", "--json", "-q", "--quiet", "--debug")
ANSI = re.compile(r"\x1b[\[\]()]")
BOX = re.compile(r"[\u2500-\u257f]")  # box drawing


def _clean(text: str) -> bool:
    return not ANSI.search(text) and not BOX.search(text)


def _one_line_error(run) -> None:
    assert run.exit_code not in (0, None), run
    assert run.stdout == "", run.stdout
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr
    assert "Traceback" not in run.stderr


def test_the_commands_others_are_writing_are_seen_too():
    assert {"dir", "ls", "inspect", "log", "stats"} <= set(COMMANDS)


# ---- help ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_has_an_example(kcache, name):
    doc = (GROUP.commands[name].callback.__doc__ or "").strip()
    assert doc.splitlines()[-1].strip().startswith(f"Example: kcache {name}"), f"{name}'s docstring: {doc!r}"
    run = kcache(name, "--help")
    assert run.exit_code == 0 and f"Example: kcache {name}" in run.stdout, run.stdout


def test_top_level_help_has_an_example(kcache):
    run = kcache("--help")
    assert run.exit_code == 0 and "Example: kcache " in run.stdout
    assert all(name in run.stdout for name in COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_and_argument_has_help(name):
    missing = [p.name for p in GROUP.commands[name].params if not getattr(p, "hidden", False) and not p.help]
    assert missing == [], f"{name}: no help for {missing}"


# ---- global options after the subcommand --------------------------------------------------------------------
@pytest.mark.parametrize("name", COMMANDS)
def test_global_options_are_accepted_after_every_subcommand(kcache, name, tmp_path):
    # Click parses every option before acting on --help: an unknown one fails the whole line.
    run = kcache(name, "-q", "--quiet", "--debug", "--json", "--cache-dir", str(tmp_path / "c"), "--help")
    assert run.exit_code == 0, run.stderr
    bad = kcache(name, "--no-such-option", "--help")
    assert bad.exit_code == 2


def test_quiet_after_the_subcommand_silences_stderr(kcache, tmp_path):
    env = {"KCACHE_DIR": str(tmp_path / "missing")}  # an explicit --cache-dir must exist
    loud = kcache("ls", env=env)
    assert "no cache at" in loud.stderr
    for args in (("ls", "-q"), ("ls", "--quiet"), ("-q", "ls"), ("stats", "-q")):
        run = kcache(*args, env=env)
        assert run.exit_code == 0 and run.stderr == "", args


def test_global_options_mean_the_same_before_and_after(kcache):
    before = kcache("--cache-dir", str(HIDET), "--json", "ls")
    after = kcache("ls", "--json", "--cache-dir", str(HIDET))
    assert before.exit_code == after.exit_code == 0
    assert before.json()["entries"] == after.json()["entries"] and len(after.json()["entries"]) == 5
    # log declares neither --cache-dir nor --json: the hidden global copies take them
    log = kcache("log", HASH, "--raw", "--cache-dir", str(HIDET), "-q")
    assert log.exit_code == 0 and "nvcc" in log.stdout


def test_debug_after_the_subcommand_keeps_usage_errors_on_one_line(kcache):
    _one_line_error(kcache("ls", "--debug", "--limit", "x"))
    _one_line_error(kcache("--debug", "ls", "--no-such-option"))


# ---- plain output --------------------------------------------------------------------------------------
def test_output_without_a_terminal_is_plain(kcache, monkeypatch):
    """In-process runs write to a pipe: no ANSI escapes, no box drawing, for data and for help."""
    monkeypatch.delenv("NO_COLOR")  # the autouse fixture sets it; here only "not a terminal" counts
    runs = [kcache("--cache-dir", str(HIDET), *args) for args in
            (("ls",), ("stats",), ("inspect", HASH), ("log", HASH), ("dir",))]
    runs += [kcache("--help")] + [kcache(name, "--help") for name in COMMANDS]
    for run in runs:
        assert run.exit_code == 0, run.stderr
        assert _clean(run.stdout), run.stdout
        assert _clean(run.stderr), run.stderr
    assert "softmax" in runs[0].stdout and "Usage: kcache" in runs[5].stdout


def _in_a_terminal(args: list[str], env: dict) -> str:
    """Run the real kcache with stdin/stdout/stderr on a pseudo-terminal; return what it printed."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kcache_cli", *args], stdin=slave, stdout=slave,
                                stderr=slave, env=env, close_fds=True)
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                proc.kill()
                raise AssertionError("kcache in a terminal printed nothing for 60 s")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=60)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)


def test_no_color_on_a_terminal_is_plain(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "KCACHE_DIR")}
    env.update(COLUMNS="120", TERM="xterm-256color")
    # the control: on a terminal, help and tables are drawn and coloured
    fancy = _in_a_terminal(["ls", "--help"], env)
    assert not _clean(fancy), fancy
    env["NO_COLOR"] = "1"
    for args in (["ls", "--help"], ["--help"], ["--cache-dir", str(HIDET), "ls"], ["--cache-dir", str(HIDET), "stats"],
                 ["--cache-dir", str(HIDET), "inspect", HASH], ["--cache-dir", str(HIDET), "log", HASH]):
        out = _in_a_terminal(args, env)
        assert _clean(out), (args, out)
        assert out.strip(), args
    assert "softmax" in _in_a_terminal(["--cache-dir", str(HIDET), "ls"], env)


# ---- --json for data ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [("dir",), ("dir", "--all"), ("ls",), ("stats",), ("inspect", HASH)])
def test_json_where_output_is_data(kcache, args):
    run = kcache("--cache-dir", str(HIDET), *args, "--json")
    assert run.exit_code == 0, run.stderr
    data = json.loads(run.stdout)
    assert data or data == []


def test_json_of_nothing_is_an_empty_list(kcache, tmp_path):
    run = kcache("ls", "--json", env={"KCACHE_DIR": str(tmp_path / "missing")})
    assert run.exit_code == 0 and run.json()["entries"] == []


# ---- errors: one line on stderr, a non-zero exit ----------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("no-such-command",),                        # unknown command
    ("ls", "--no-such-option"),                  # bad option
    ("--no-such-global",),                       # bad global option
    ("inspect",),                                # missing argument
    ("ls", "--op"),                              # option without its value
    ("--cache-dir",),                            # global option without its value
    ("ls", "--limit", "x"),                      # bad value
    ("stats", "--top", "-1"),                    # out of range
    ("ls", "--status", "nope"),                  # bad choice
    ("ls", "--sort", "sideways"),                # bad choice, checked by the command
    ("ls", "--space", "a b/c/d"),                # malformed space
    ("inspect", "0000nothing"),                  # no such entry
    ("--debug", "ls", "--no-such-option"),       # --debug does not turn a usage error into a traceback
])
def test_every_error_is_one_line(kcache, args):
    _one_line_error(kcache("--cache-dir", str(HIDET), *args) if args[0] != "--cache-dir" else kcache(*args))


@pytest.mark.parametrize("name", COMMANDS)
def test_unknown_option_of_every_command_is_one_line(kcache, name, tmp_path):
    run = kcache(name, "--no-such-option", "--cache-dir", str(tmp_path / "c"))
    _one_line_error(run)
    assert run.exit_code == 2 and "--no-such-option" in run.stderr


@pytest.mark.parametrize("name", [n for n in COMMANDS if any(p.required for p in GROUP.commands[n].params)])
def test_missing_required_argument_of_every_command_is_one_line(kcache, name, tmp_path):
    run = kcache(name, "--cache-dir", str(tmp_path / "c"))
    _one_line_error(run)
    assert run.exit_code == 2


def test_bare_kcache_prints_help_not_an_error(kcache):  # and exits 0, as --help (issue 36)
    run = kcache()
    assert run.exit_code == 0
    assert "Usage: kcache" in run.stdout and run.stderr == ""


def test_errors_are_one_line_in_a_real_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KCACHE_DIR"}
    for args in (["no-such-command"], ["ls", "--limit", "x"], ["inspect"], ["ls", "--debug", "--nope"]):
        proc = subprocess.run([sys.executable, "-m", "kcache_cli", *args], capture_output=True, text=True, env=env,
                              timeout=60)
        assert proc.returncode == 2 and proc.stdout == "", (args, proc)
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("Error: "), (args, proc.stderr)


@pytest.mark.parametrize("args", [("ls", ""), ("ls", "--op", ""), ("ls", "--space", " , "), ("ls", "--layout", ""),
                                  ("export", "OUT", ""), ("verify", "")])
def test_an_empty_selector_is_a_usage_error_not_everything(kcache, tmp_path, args):
    """`kcache export out.tar "$HASH"` with HASH unset must not mean every entry."""
    args = tuple(str(tmp_path / "out.tar") if a == "OUT" else a for a in args)
    r = kcache("--cache-dir", str(HIDET), *args)
    assert r.exit_code == 2 and "is empty" in r.stderr and len(r.stderr.splitlines()) == 1, (r.stdout, r.stderr)
    assert not (tmp_path / "out.tar").exists()


def _git(repo, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git not found")
def test_kcache_state_never_shows_in_git_status(kcache, tmp_path):
    """A project whose numba __pycache__/ makes it a cache root (`--cache-dir .`): prune left `?? .kcache/locks/
    .gc.lock` in git status. The .kcache/ kcache makes holds a .gitignore of `*`, as pytest's .pytest_cache."""
    proj = tmp_path / "proj"
    src = next((FIXTURES / "numba").iterdir())
    copy_tree(src, proj / "__pycache__")
    (proj / ".gitignore").write_text("__pycache__/\n")
    _git(proj, "init", "-q")
    _git(proj, "add", ".gitignore")
    _git(proj, "commit", "-q", "-m", "project")
    for args in (("ls",), ("verify",), ("prune", "--broken"), ("prune", "--max-size", "1B", "--yes")):
        r = kcache("--cache-dir", proj, *args)
        assert r.exit_code in (0, 1), (args, r.stderr)
        assert _git(proj, "status", "--porcelain", "--untracked-files=all") == "", args
    assert (proj / ".kcache" / "locks").is_dir()  # the prune made its state, and git shows none of it
    assert (proj / ".kcache" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_the_state_gitignore_never_replaces_nor_follows(tmp_path):
    """A .gitignore already in .kcache/ stays as it is; a link there is not written through."""
    from kcache_cli.fs import state

    sd = tmp_path / ".kcache"
    sd.mkdir()
    (tmp_path / "elsewhere").write_text("theirs\n")
    for existing in ("mine\n", None):
        gi = sd / ".gitignore"
        if existing is None:
            gi.unlink()
            gi.symlink_to(tmp_path / "elsewhere")
        else:
            gi.write_text(existing)
        fd = os.open(sd, os.O_RDONLY | os.O_DIRECTORY)
        try:
            state.write_gitignore(fd)
        finally:
            os.close(fd)
        assert gi.read_text() == (existing or "theirs\n")
    gi.unlink()
    fd = os.open(sd, os.O_RDONLY | os.O_DIRECTORY)
    try:
        state.write_gitignore(fd)
    finally:
        os.close(fd)
    assert gi.read_text().startswith("# ") and gi.read_text().endswith("\n*\n")


@pytest.mark.parametrize("args, said", [
    (("ls", "--status", "complet"), "did you mean complete?"),
    (("ls", "--sort", "sise"), "did you mean size?"),
    (("ls", "--layout", "trito"), "did you mean triton?"),
    (("ls", "--kind", "kernal"), "did you mean kernel?"),
    (("ls", "--cache", "hidett"), "did you mean hidet?"),
])
def test_a_misspelt_choice_gets_a_did_you_mean(kcache, fixture_copy, args, said):
    """A value outside an option's choices names the closest ones first, as a misspelt op or command does,
    then every choice; one close to none names none."""
    where = () if "--cache" in args else ("--cache-dir", str(fixture_copy("hidet")))
    run = kcache(*where, *args)
    assert run.exit_code == 2 and said in run.stderr and "(choose from " in run.stderr, run.stderr
    far = kcache(*where, args[0], args[1], "zzzzzz")
    assert far.exit_code == 2 and "did you mean" not in far.stderr and "(choose from " in far.stderr, far.stderr


def test_a_misspelt_option_gets_the_same_did_you_mean(kcache):
    """`ls --opp` said click's "(Possible options: --op)", where a misspelt choice, op or hash says "did you
    mean ...?": one style for every typo."""
    run = kcache("ls", "--opp", "matmul")
    assert run.exit_code == 2 and run.stderr.startswith("Error: No such option: --opp; did you mean --op? "), \
        run.stderr
    assert "Possible options" not in run.stderr
    far = kcache("ls", "--zzzzzz")
    assert far.exit_code == 2 and "did you mean" not in far.stderr, far.stderr


@pytest.mark.parametrize("option, value", [("--kind", "kernal"), ("--status", "complet"), ("--layout", "trito")])
def test_a_misspelt_choice_is_an_error_where_there_is_no_cache(kcache, tmp_path, option, value):
    """Checked before any cache is looked for: with none at all, a typo is still exit 2, not "no kernel
    cache found" and exit 0 (the typo would pass unseen in a script run on a fresh machine)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    away = tmp_path / "nowhere"
    env = {"HOME": str(home), "KCACHE_DIR": None, "XDG_CACHE_HOME": None, "TRITON_CACHE_DIR": None,
           "TRITON_HOME": None, "TILELANG_CACHE_DIR": None, "TORCHINDUCTOR_CACHE_DIR": str(away / "inductor"),
           "CUDA_CACHE_PATH": str(away / "nv"), "VLLM_CACHE_ROOT": str(away / "vllm")}
    assert kcache("ls", env=env).stderr.startswith("no kernel cache found")  # there is none
    run = kcache("ls", option, value, env=env)
    assert run.exit_code == 2 and "did you mean" in run.stderr, run.stderr
