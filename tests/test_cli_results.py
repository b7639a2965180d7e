"""Answers a person and a script can trust (issues 21 and 25): `ls -q` never splits a name into two lines
and `-0` hands exact paths to `xargs -0`; `--all-caches` never takes `/` or `$HOME` for a root; an entry
named that matches nothing is exit 2 with a did-you-mean; an empty export writes nothing; a non-UTF-8
directory name does not fail an export; a reader closing the pipe early is exit 0; --json errors are
JSON on stdout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree

TIMEOUT = 120
RELU = "ops/cpu_space_0/relu/31857fe085635b31"


def cli(*args, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcache_cli", *map(str, args)], capture_output=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, **kw)


# ---- ls -q and -0 ----------------------------------------------------------------------------------
@pytest.fixture
def newline_cache(fixture_copy) -> Path:
    """The real hidet cache and an op directory named "x\\n" holding `etc` (issue 21's attack)."""
    root = fixture_copy("hidet")
    evil = root / "ops" / "cpu_space_0" / "x\n"
    evil.mkdir()
    shutil.copytree(root / RELU, evil / "etc")
    return root


def test_ls_q_never_makes_a_name_two_lines(newline_cache):
    r = cli("--cache-dir", newline_cache, "ls", "-q")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert "etc" not in lines and not any(line.startswith("etc") for line in lines)
    assert f"{newline_cache}/ops/cpu_space_0/x?/etc" in lines
    assert all(line.startswith(str(newline_cache)) for line in lines)
    assert r.stderr == b""


def test_ls_0_gives_exact_paths_to_xargs_0(newline_cache):
    r = cli("--cache-dir", newline_cache, "ls", "-0")
    assert r.returncode == 0 and r.stdout.endswith(b"\0") and b"\n" not in r.stdout.replace(b"x\n/", b"")
    paths = r.stdout[:-1].split(b"\0")
    assert f"{newline_cache}/ops/cpu_space_0/x\n/etc".encode() in paths
    # what the README says to do: every path reaches the program whole
    listed = subprocess.run(["xargs", "-0", "ls", "-d"], input=r.stdout, capture_output=True, timeout=TIMEOUT)
    assert listed.returncode == 0, listed.stderr
    assert len(paths) == 6 and all(os.path.isdir(p) for p in paths)


def test_ls_0_keeps_undecodable_bytes(fixture_copy):
    root = fixture_copy("hidet")
    odd = os.path.join(os.fsencode(root), b"ops", b"cpu_space_0", b"r\xffelu")
    shutil.copytree(os.fsencode(root / RELU), os.path.join(odd, b"31857fe085635b31"))
    raw = cli("--cache-dir", root, "ls", "-0").stdout
    assert os.path.join(odd, b"31857fe085635b31") in raw.split(b"\0")
    quiet = cli("--cache-dir", root, "ls", "-q")
    assert quiet.returncode == 0 and f"{root}/ops/cpu_space_0/r?elu/31857fe085635b31".encode() in quiet.stdout


def test_null_and_json_do_not_go_together(kcache, fixture_copy):
    r = kcache("--cache-dir", fixture_copy("hidet"), "ls", "-0", "--json")
    assert r.exit_code == 2 and "--null and --json" in r.stderr


# ---- --all-caches refusals ---------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["hidet.toml", "TRITON_CACHE_DIR"])
def test_all_caches_never_takes_home_for_a_root(kcache, tmp_path, how):
    home = Path(os.environ["HOME"])
    # entry-shaped directories in the home directory itself: what a root of $HOME would clear
    copy_tree(FIXTURES / "hidet" / "ops", home / "ops")
    precious = home / "ops" / "cpu_space_0" / "relu" / "31857fe085635b31"
    env = {}
    if how == "hidet.toml":
        (home / ".config" / "hidet").mkdir(parents=True)
        (home / ".config" / "hidet" / "hidet.toml").write_text('cache_dir = "~"\n')
    else:
        env["TRITON_CACHE_DIR"] = str(home)
        copy_tree(FIXTURES / "triton" / "cache", home / "triton-like")
    before = sorted(p.name for p in home.iterdir())
    r = kcache("clear", "--all-caches", "--all", "--yes", env=env)
    r2 = kcache("prune", "--all-caches", "--max-size", "0", env=env)
    assert precious.is_dir() and sorted(p.name for p in home.iterdir()) == before
    owner = "hidet" if how == "hidet.toml" else "triton"
    for run in (r, r2):
        assert run.exit_code == 0, run.stderr
        assert f"warning: skipping the {owner} cache at {home}: it is the home directory" in run.stderr, run.stderr
    assert kcache("ls", "--all-caches", env=env).exit_code == 0
    single = kcache("clear", "--all", "--yes", "--cache-dir", home)
    assert single.exit_code == 2 and "it is the home directory" in single.stderr


# ---- entries that match nothing ------------------------------------------------------------------
@pytest.mark.parametrize("args", [("verify", "deadbeef"), ("clear", "deadbeef", "--yes"),
                                  ("export", "x.tar", "deadbeef"), ("ls", "deadbeef"),
                                  ("clear", "ad252b06", "deadbeef", "--yes"), ("verify", "ops/cpu_space_0/relu/0")])
def test_an_entry_matching_nothing_is_exit_2(kcache, fixture_copy, tmp_path, args):
    root = fixture_copy("hidet")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    r = kcache("--cache-dir", root, *args)
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert r.stderr.startswith("Error: no entry matches") and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing removed on a typo
    assert not (tmp_path / "x.tar").exists()


def test_did_you_mean_names_the_nearest_hash_and_op(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "verify", "8d1f7619")
    assert r.exit_code == 2 and "did you mean 8d1f7691" in r.stderr, r.stderr
    r = kcache("--cache-dir", root, "clear", "matmull", "--yes")
    assert r.exit_code == 2 and "--op matmul" in r.stderr, r.stderr


def test_an_empty_export_writes_nothing_and_is_nothing_to_do(kcache, fixture_copy, tmp_path):
    """Nothing to export is one outcome, whatever the reason: no archive, a warning (under -q too), exit 0
    (DESIGN 7: nothing to do). It was exit 2 for an empty selection and 1 when every entry selected was left
    out, so a CI save step failed on a cache of moved or partial entries alone."""
    root = fixture_copy("hidet")
    for args in (("--op", "nothing"), ("--status", "failed")):
        r = kcache("-q", "--cache-dir", root, "export", tmp_path / "e.tar", *args)
        assert r.exit_code == 0 and "warning: nothing to export: no entries in" in r.stderr, r.stderr
        assert list(tmp_path.glob("*e.tar*")) == []
    r = kcache("--cache-dir", root, "export", tmp_path / "e.tar", "deadbeef")  # a name matching nothing: usage
    assert r.exit_code == 2, r.stderr


def test_all_left_out_writes_no_archive(kcache, fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    with open(root / RELU / "lib.so", "r+b") as f:
        f.truncate(100)  # selected, then left out by the deep judgement
    r = kcache("-q", "--cache-dir", root, "export", tmp_path / "e.tar", RELU, "--status", "complete")
    assert r.exit_code == 0 and "warning: nothing to export: " in r.stderr, r.stderr
    assert "no archive written" in r.stderr and r.stdout == ""
    assert [p for p in tmp_path.iterdir() if "e.tar" in p.name] == []
    for name in ("torch_ext", "jax"):  # real caches holding only moved entries (status moved: left out)
        r = kcache("--json", "--cache-dir", fixture_copy(name), "export", tmp_path / f"{name}.tar")
        assert r.exit_code == 0 and r.json()["archive"] is None and r.json()["left_out"], r.stderr
        assert "none fit to ship" in r.stderr
    assert [p for p in tmp_path.iterdir() if ".tar" in p.name] == []


# ---- non-UTF-8 names --------------------------------------------------------------------------------
def test_a_non_utf8_op_directory_does_not_fail_the_export(fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    odd = os.path.join(os.fsencode(root), b"ops", b"cpu_space_0", b"r\xffelu")
    shutil.copytree(os.fsencode(root / RELU), os.path.join(odd, b"31857fe085635b31"))
    archive = tmp_path / "all.tar"
    r = cli("--cache-dir", root, "export", archive)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(b"r\\xffelu") == 1, r.stderr  # said once, escaped
    assert b"not shaped like a hidet entry" in r.stderr  # left out as ls calls it: hidet never makes such a name
    with tarfile.open(archive) as tar:
        tops = {n.split("/")[3] for n in tar.getnames() if n.count("/") >= 3 and n.startswith("ops/")}
    assert tops == {"8d1f7691cdf75e90", "af3046266c6abdd1", "064b4a6c035246e8", "31857fe085635b31",
                    "ad252b064b266eea"}
    dest = tmp_path / "dest"
    back = cli("--cache-dir", dest, "import", archive, "--json")
    assert back.returncode == 0 and len(json.loads(back.stdout)["entries"]) == 5, back.stderr


# ---- pipes closed early, JSON errors ------------------------------------------------------------------
@pytest.mark.parametrize("args", [("stats",), ("prune", "--dry-run", "--older-than", "1s"),
                                  ("log", "--raw", "8d1f"), ("ls",), ("ls", "--json"), ("verify",),
                                  ("inspect", "8d1f"), ("ls", "-0"), ("stats", "--json")])
def test_a_reader_that_goes_early_is_exit_0(fixture_copy, args):
    """`kcache stats | head -1`: the reader's end is closed before kcache writes (a real pipe)."""
    root = fixture_copy("hidet")
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), *args], stdout=w,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(w)
    os.close(r)  # before the interpreter has even started: every write meets EPIPE
    err = proc.communicate(timeout=TIMEOUT)[1]
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"Exception ignored" not in err and b"Error" not in err, err


@pytest.mark.parametrize("args", [("ls",), ("verify",), ("explain",), ("prune", "--dry-run")])
def test_a_reader_of_stdout_and_stderr_that_goes_early_is_exit_0(fixture_copy, args):
    """`kcache ls 2>&1 | head -1`: stderr's reader is gone too, so its notes meet EPIPE as well; the
    interpreter's last flush of them must not turn the exit into 120 (buffered, as cron runs it)."""
    root = fixture_copy("hidet")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), *args], stdout=w,
                            stderr=w, stdin=subprocess.DEVNULL, env=env)
    os.close(w)
    os.close(r)
    assert proc.wait(timeout=TIMEOUT) == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("args", [("ls",), ("ls", "--json"), ("log", "8d1f"), ("stats",), ("--version",)])
def test_a_full_standard_output_is_said_so_not_an_unpublished_write(fixture_copy, args):
    """`kcache ls > /dev/full`: one line naming standard output, exit 1, no traceback; not the message of a
    write of kcache's own (whose temp file is never published), which nothing here made."""
    root = fixture_copy("hidet")
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), *args], stdout=full,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and err == "Error: cannot write the output: No space left on device (standard " \
        "output)\n", err


def test_head_1_of_a_long_listing_is_exit_0(fixture_copy):
    root = fixture_copy("hidet")
    for i in range(60):
        shutil.copytree(root / RELU, root / f"ops/cpu_space_0/relu/{i:016x}")
    r = subprocess.run(f"set -o pipefail; {sys.executable} -m kcache_cli --cache-dir {root} ls -q | head -1",
                       shell=True, executable="/bin/bash", capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr


@pytest.mark.parametrize("args,code", [(("verify", "deadbeef"), 2), (("prune", "--max-size", "10"), 2),
                                       (("inspect", "nope"), 2), (("ls", "--sort", "colour"), 2),
                                       (("ls", "--no-such-option"), 2)])
def test_json_errors_are_json_on_stdout(kcache, fixture_copy, args, code):
    r = kcache("--cache-dir", fixture_copy("hidet"), "--json", *args)
    assert r.exit_code == code
    doc = json.loads(r.stdout)
    assert doc["exit"] == code and doc["error"] and r.stderr.startswith("Error: ")


# ---- a prune that would remove more than half of the cache ---------------------------------------------
def test_a_prune_of_more_than_half_needs_yes(kcache, fixture_copy):
    root = fixture_copy("hidet")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    r = kcache("--cache-dir", root, "prune", "--max-size", "1k")
    assert r.exit_code == 2 and "more than half of the cache" in r.stderr and "--yes" in r.stderr, r.stderr
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    dry = kcache("--cache-dir", root, "prune", "--max-size", "1k", "--dry-run", "--json")
    assert dry.exit_code == 0 and len(dry.json()["removed"]) == 5
    total = kcache("--cache-dir", root, "stats", "--json").json()["size"]
    smallest = min(e["size"] for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"])
    # a budget one entry over: one entry of five goes, no question
    little = kcache("--cache-dir", root, "prune", "--max-size", f"{total - smallest}B", "--json")
    assert little.exit_code == 0 and len(little.json()["removed"]) == 1, little.stderr
    done = kcache("--cache-dir", root, "prune", "--max-size", "1k", "--yes", "--json")
    assert done.exit_code == 0 and len(done.json()["removed"]) == 4


def at_a_prompt(args: list, until: bytes, then, again: bool = False) -> tuple[int, bytes]:
    """kcache on a real terminal (a pty): once it prints `until`, `then(pid, fd)` (an answer, a signal),
    with `again` every half second while it runs (a signal landing between the prompt and the terminal's
    read is taken only when the read returns: CPython's race); (its exit status, all it printed). A
    child that does not end within 30 s is killed: never a hang."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: kcache on a real terminal, as a shell starts a foreground command
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # (xdist's workers ignore SIGINT)
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.execv(sys.executable, [sys.executable, "-m", "kcache_cli", *map(str, args)])
    seen = b""
    while until not in seen:
        seen += os.read(fd, 4096)
    then(pid, fd)
    waited = 0.0
    while True:
        if not select.select([fd], [], [], 0.5 if again else 30)[0]:
            waited += 0.5 if again else 30
            if waited < 30:
                then(pid, fd)
                continue
            os.kill(pid, signal.SIGKILL)
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), seen


def test_a_prune_of_more_than_half_asks_on_a_terminal(fixture_copy):
    root = fixture_copy("hidet")
    for answer, gone in ((b"n\n", False), (b"y\n", True)):
        code, seen = at_a_prompt(["--cache-dir", root, "prune", "--older-than", "0s"], b"Remove",
                                 lambda pid, fd, answer=answer: os.write(fd, answer))
        assert b"of the cache" in seen
        assert (code == 0) == gone, seen.decode(errors="replace")
        assert (not (root / RELU).exists()) == gone


def test_all_caches_names_a_missing_entry_whatever_the_other_caches(kcache, tmp_path):
    home = Path(os.environ["HOME"])
    hidet = copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    copy_tree(FIXTURES / "tilus", home / ".cache" / "tilus")
    ghost = str(hidet / "ops/cpu_space_0/relu/0000000000000000")
    for cmd in (("ls", "--all-caches", ghost, "8d1f"), ("clear", "--all-caches", ghost, "8d1f", "--yes")):
        r = kcache(*cmd)
        assert r.exit_code == 2 and f"no entry matches '{ghost}'" in r.stderr, r.stderr
    assert (hidet / "ops/cuda_space_0/add/8d1f7691cdf75e90").is_dir()
    assert kcache("ls", "--all-caches", "8d1f", "--json").json()["entries"][0]["hash"] == "8d1f7691cdf75e90"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_at_the_confirmation_prompt_is_an_interrupt(fixture_copy, sig):
    """Ctrl-C, SIGTERM or SIGHUP at clear's [y/N] prompt said `Error: aborted`, exit 1 (the prompt's Abort):
    it is an interrupt as anywhere else, exit 128 + the signal, and nothing is removed."""
    root = fixture_copy("hidet")
    code, seen = at_a_prompt(["--cache-dir", root, "clear", "--op", "relu"], b"[y/N]",
                             lambda pid, fd: os.kill(pid, sig), again=True)
    assert code == 128 + sig, seen.decode(errors="replace")
    assert b"interrupted" in seen and (root / RELU).exists()


def test_a_debug_traceback_shows_escapes_as_the_error_line_does(kcache, fixture_copy):
    """--debug printed the traceback as it was: a message quoting a name (or a registry's words) with an ESC
    sequence reached the terminal raw, where the Error line below it showed it escaped."""
    r = kcache("--debug", "--cache-dir", fixture_copy("hidet"), "inspect", "zz\x1b]0;pwned\x07")
    assert r.exit_code == 2 and "Traceback" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "zz\\x1b]0;pwned\\x07" in r.stderr
