"""A command line that fits a real terminal and real habits (issue 14): tables at 80, 100 and 120
columns, entries addressed by prefix, relative or absolute path and selectors, both --space forms,
hints for values that match nothing, an explicit --cache-dir that must exist, neighbouring tools'
habits (-q, globs, -n, --yes, --all-caches) and the small things (plurals, sizes, exit codes)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shutil
import stat
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from conftest import CXX, FIXTURES, copy_tree

from kcache_cli.model.terms import STATUSES

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
WIDTHS = (80, 100, 120)
SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
ADD = "ops/cuda_space_0/add/8d1f7691cdf75e90"
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"
RELU = "ops/cpu_space_0/relu/31857fe085635b31"
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")


# ---- caches ------------------------------------------------------------------------------------------
def damaged_hidet(dest: Path) -> Path:
    """The real hidet cache with entries in several statuses, long reasons, and the softmax task also in
    cuda_space_2 (the same hash in two spaces)."""
    root = copy_tree(FIXTURES / "hidet", dest)
    # "last used" is the newest mtime: make it the same whatever the fixture files' own mtimes are (they
    # are the checkout's), so that column widths, and so which columns fit, do not depend on the clock.
    then = time.time() - 20 * 60
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (then, then), follow_symlinks=False)
    (root / ADD / "func_types.pickle").unlink()  # hidet killed before its completion marker
    with open(root / RELU / "lib.so", "r+b") as f:  # truncated after completion
        f.truncate(100)
    os.utime(root / RELU / "lib.so")
    (root / MATMUL / "lib.so").unlink()  # a compile log, no binary
    shutil.copytree(root / SOFTMAX, root / "ops/cuda_space_2/softmax/ad252b064b266eea")
    return root


def mixed(dest: Path) -> Path:
    """One root holding hidet, tilus and tilelang entries (64-hex tilelang hashes)."""
    root = damaged_hidet(dest)
    for name in ("tilus", "tilelang"):
        for child in (FIXTURES / name).iterdir():
            if child.name != "README.md":
                dst = root / child.name
                shutil.copytree(child, dst, symlinks=True) if child.is_dir() else shutil.copy2(child, dst)
    return root


@pytest.fixture(params=["hidet", "tilus", "tilelang", "mixed"])
def any_cache(request, tmp_path):
    if request.param == "hidet":
        return damaged_hidet(tmp_path / "hidet")
    if request.param == "mixed":
        return mixed(tmp_path / "mixed")
    return copy_tree(FIXTURES / request.param, tmp_path / request.param)


def listing(kcache, root: Path) -> list[dict]:
    r = kcache("--cache-dir", root, "ls", "--json")
    assert r.exit_code == 0, r.stderr
    return r.json()["entries"]


def check_fits(text: str, width: int, hashes, statuses) -> None:
    plain = ANSI.sub("", text).replace("\r", "")
    lines = plain.splitlines()
    too_wide = [ln for ln in lines if len(ln) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}: {too_wide[:3]}"
    words = set(plain.split())
    # a hash may be cut to a prefix (every command takes one), never below 8 characters
    missing = [h for h in hashes if not any(h.startswith(w) and len(w) >= min(8, len(h)) for w in words)]
    assert not missing, f"hashes cut below 8 characters or missing at {width}: {missing}\n{plain}"
    cut = [s for s in statuses if s not in words]
    assert not cut, f"status words cut or missing at {width}: {cut}\n{plain}"


# ---- tables at 80, 100, 120 columns -------------------------------------------------------------------
@pytest.mark.parametrize("width", WIDTHS)
def test_ls_and_stats_fit_every_width(kcache, any_cache, width):
    entries = listing(kcache, any_cache)
    hashes = {e["hash"] for e in entries}
    statuses = {e["status"] for e in entries}
    assert statuses <= set(STATUSES)
    env = {"COLUMNS": str(width)}
    ls = kcache("--cache-dir", any_cache, "ls", env=env)
    assert ls.exit_code == 0, ls.stderr
    check_fits(ls.stdout, width, hashes, statuses)
    for e in entries:  # each reason is shown whole (wrapped or on its own line), never cut
        if e["reason"]:
            assert " ".join(e["reason"].split()) in " ".join(ls.stdout.split())
    stats = kcache("--cache-dir", any_cache, "stats", "--top", "100", env=env)
    assert stats.exit_code == 0, stats.stderr
    check_fits(stats.stdout, width, hashes, statuses)


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_fits_every_width(kcache, any_cache, width):
    for e in listing(kcache, any_cache):
        r = kcache("--cache-dir", any_cache, "inspect", e["path"], env={"COLUMNS": str(width)})
        assert r.exit_code == (0 if e["status"] == "complete" else 1), r.stderr
        check_fits(r.stdout, width, [e["hash"]], [json.loads(kcache("--cache-dir", any_cache, "inspect", e["path"],
                                                                    "--json").stdout)["status"]])


def test_wide_terminal_keeps_every_column(kcache, tmp_path):
    root = damaged_hidet(tmp_path / "c")
    header = kcache("--cache-dir", root, "ls", env={"COLUMNS": "250"}).stdout.splitlines()[0].split()
    assert header == ["layout", "kind", "space", "op", "hash", "size", "files", "status", "last", "used", "reason"]
    narrow = kcache("--cache-dir", root, "ls", env={"COLUMNS": "80"}).stdout.splitlines()[0].split()
    # what matters least goes first: layout (one-layout root), kind, files; identity and status stay
    assert "layout" not in narrow and "kind" not in narrow and "files" not in narrow
    assert {"space", "op", "hash", "status"} <= set(narrow)


def test_long_hashes_are_cut_to_a_prefix_that_still_names_the_entry(kcache, tmp_path):
    root = mixed(tmp_path / "c")
    lines = kcache("--cache-dir", root, "ls", env={"COLUMNS": "80"}).stdout.splitlines()
    header = lines[0].split()
    assert {"op", "size", "hash"} <= set(header) and not any(re.search(r"[0-9a-f]{64}", ln) for ln in lines)
    col = header.index("hash")
    rows = [ln.split() for ln in lines[1:] if not ln.startswith(" ")]
    # the same hash in two spaces stays two tellable rows; tilelang's 64 digits are cut to a prefix
    assert {"cuda_space_0", "cuda_space_2"} <= {r[2] for r in rows if "ad252b064b266eea".startswith(r[col])}
    for prefix in {r[col] for r in rows}:  # each prefix shown names its entry (or the one hash in 2 spaces)
        assert len(prefix) >= 8
        named = kcache("--cache-dir", root, "ls", prefix, "--json")
        assert named.exit_code == 0 and len({e["hash"] for e in named.json()["entries"]}) == 1, named.stderr


def test_a_pipe_without_columns_gets_whole_rows(kcache, tmp_path):
    root = damaged_hidet(tmp_path / "c")
    lines = kcache("--cache-dir", root, "ls").stdout.splitlines()
    assert len(lines) == 1 + len(listing(kcache, root))  # one line per entry, reasons inline, for grep/awk
    assert all(len(ln.split()) >= 9 for ln in lines[1:])


def test_a_started_kcache_sees_no_width_nobody_exported():
    """pytest imports readline, which on a terminal exports LINES and COLUMNS behind os.environ's back;
    conftest takes them out, or every kcache the tests start would fold its stderr to 80 columns."""
    seen = subprocess.run(["env"], capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout.splitlines()
    assert not [v for v in seen if v.split("=")[0] in ("COLUMNS", "LINES") and v.split("=")[0] not in os.environ]


def _winsize(fd: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))


def in_a_terminal(args: list[str], cols: int, stderr_too: bool = False) -> str:
    """The real kcache on a pseudo-terminal `cols` wide (no COLUMNS: the terminal's own size counts); with
    `stderr_too`, stderr on it as well."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "KCACHE_DIR", "COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    master, slave = os.openpty()
    _winsize(slave, cols)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kcache_cli", *args], stdin=slave, stdout=slave,
                                stderr=slave if stderr_too else subprocess.DEVNULL, env=env, close_fds=True)
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                proc.kill()
                raise AssertionError("kcache in a terminal printed nothing for 60 s")
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=60)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_real_terminal_of_each_width(kcache, tmp_path, width):
    root = mixed(tmp_path / "c")
    entries = listing(kcache, root)
    hashes = {e["hash"] for e in entries}
    statuses = {e["status"] for e in entries}
    out = in_a_terminal(["--cache-dir", str(root), "ls"], width)
    assert "\x1b[" in out  # a terminal: coloured
    check_fits(out, width, hashes, statuses)
    check_fits(in_a_terminal(["--cache-dir", str(root), "stats", "--top", "100"], width), width, hashes, statuses)
    check_fits(in_a_terminal(["--cache-dir", str(root), "inspect", RELU], width), width, [RELU[-16:]], ["corrupt"])


@pytest.mark.parametrize("cols", [0, 5])
def test_a_terminal_that_reports_no_width_gets_80_columns(kcache, tmp_path, cols):
    """`docker run -t`, `script` and some CI runners report a 0x0 terminal: a warning read that as 0 columns
    and came out a word or two a line. A width under TERMINAL_MIN is taken as shutil takes 0: 80."""
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    out = ANSI.sub("", in_a_terminal(["--cache-dir", str(root), "ls", "--op", "nosuch"], cols, stderr_too=True))
    lines = out.replace("\r", "").splitlines()
    assert lines[0].startswith("warning: no op 'nosuch' in") and "softmax)" in "".join(lines), lines
    assert len(lines) <= 6 and all(len(ln) <= 80 for ln in lines) and max(map(len, lines)) > 40, lines
    table = ANSI.sub("", in_a_terminal(["--cache-dir", str(root), "ls"], cols)).replace("\r", "").splitlines()
    assert max(len(ln) for ln in table) <= 80 and len(table[0].split()) >= 6, table


def test_log_in_a_terminal_prints_no_header_for_a_file_it_refuses(tmp_path):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    script = root / "ops/cuda_space_0/softmax/ad252b064b266eea/compile.sh"
    script.unlink()
    script.symlink_to("/etc/hostname")
    for args in ([], ["--raw"]):
        out = in_a_terminal(["--cache-dir", str(root), "log", "ad25", *args], 100)
        assert "compile.sh" not in out and "ptxas info" in out, out
    assert "==> nvcc_output.txt <==" in in_a_terminal(["--cache-dir", str(root), "log", "ad25"], 100)


def test_layout_planner_puts_a_long_reason_on_its_own_line():
    from kcache_cli.cli.table import Column, render

    cols = [Column("layout", drop=1), Column("kind", drop=2), Column("hash"), Column("status"),
            Column("reason", wrap=True)]
    rows = [["hidet", "op", "a" * 16, "partial", "word " * 40], ["hidet", "op", "b" * 16, "complete", ""]]
    for width in (40, 60, 80, 120):
        lines = render(cols, rows, width)
        assert all(len(ln) <= width for ln in lines), (width, lines)
        text = " ".join(" ".join(lines).split())
        assert "a" * 16 in text and "b" * 16 in text and "partial" in text and "complete" in text
        assert text.count("word") == 40
    assert render(cols, rows, None)[1].endswith("word")  # no width: one line per row


# ---- addressing ------------------------------------------------------------------------------------------
def test_every_command_takes_a_prefix_a_relative_and_an_absolute_path(kcache, tmp_path):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    absolute = next(e["path"] for e in listing(kcache, root) if e["op"] == "softmax")
    for ref in ("ad252b06", SOFTMAX, SOFTMAX + "/", absolute, absolute + "/"):
        for cmd in (["inspect", ref, "--json"], ["log", ref, "--raw"], ["ls", ref, "--json"],
                    ["verify", ref, "--json"]):
            r = kcache("--cache-dir", root, *cmd)
            assert r.exit_code == 0, (cmd, r.stderr)
            said = "ad252b064b266eea" in r.stdout or "nvcc" in r.stdout
            assert said or (cmd[0] == "verify" and r.json()["checked"] == 1), cmd
        ls = kcache("--cache-dir", root, "ls", ref, "--json").json()["entries"]
        assert [e["hash"] for e in ls] == ["ad252b064b266eea"]
        plan = kcache("--cache-dir", root, "clear", ref, "--dry-run", "--json").json()
        assert [r["hash"] for r in plan["removed"]] == ["ad252b064b266eea"]
    # a path and a prefix together: both entries
    both = kcache("--cache-dir", root, "ls", "8d1f", absolute, "--json").json()["entries"]
    assert sorted(e["op"] for e in both) == ["add", "softmax"]
    os.chdir(root / "ops")  # a path relative to the current directory, inside the cache
    assert kcache("--cache-dir", root, "inspect", "cuda_space_0/softmax/ad252b064b266eea").exit_code == 0
    assert kcache("--cache-dir", root, "clear", absolute, "--yes").exit_code == 0
    assert not (root / SOFTMAX).exists() and (root / ADD).is_dir()


def test_a_path_outside_the_cache_is_refused(kcache, tmp_path):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    for cmd in ("inspect", "ls", "clear"):
        r = kcache("--cache-dir", root, cmd, str(tmp_path), "--dry-run" if cmd == "clear" else "--json")
        assert r.exit_code == 2 and "not an entry of the cache" in r.stderr, r.stderr
    r = kcache("--cache-dir", root, "inspect", "ops/../../etc")
    assert r.exit_code == 2 and "'..'" in r.stderr


def test_the_same_hash_in_two_spaces(kcache, tmp_path):
    root = damaged_hidet(tmp_path / "c")
    for cmd in ("inspect", "log"):
        r = kcache("--cache-dir", root, cmd, "ad252b064b266eea")
        assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1
        assert "ambiguous" in r.stderr and SOFTMAX in r.stderr and "cuda_space_2" in r.stderr
        assert "--space cuda_space_0 or --space cuda_space_2" in r.stderr
    for space in ("cuda_space_2", "2"):
        data = kcache("--cache-dir", root, "inspect", "ad25", "--space", space, "--json").json()
        assert data["space"] == "cuda_space_2"
    assert kcache("--cache-dir", root, "log", "ad25", "--space", "0", "--raw").exit_code == 0
    assert kcache("--cache-dir", root, "inspect", "ad25", "--op", "softmax").exit_code == 2  # still two
    r = kcache("--cache-dir", root, "inspect", "ad25", "--space", "1")
    assert r.exit_code == 2 and "no entry matches" in r.stderr and "no space '1'" in r.stderr


# ---- --space forms ---------------------------------------------------------------------------------------
def test_space_by_level_name_glob_and_comma_list(kcache, tmp_path):
    root = damaged_hidet(tmp_path / "c")

    def spaces(*args):
        r = kcache("--cache-dir", root, *args, "--json")
        assert r.exit_code == 0, r.stderr
        data = r.json()
        rows = data["removed"] if "removed" in data else data["entries"]
        return sorted({e["space"] for e in rows})

    assert spaces("ls", "--space", "0") == ["cpu_space_0", "cuda_space_0"]
    assert spaces("ls", "--space", "2") == spaces("ls", "--space", "cuda_space_2") == ["cuda_space_2"]
    assert spaces("ls", "--space", "cuda_*") == ["cuda_space_0", "cuda_space_2"]
    assert spaces("ls", "--space", "2,cpu_space_0") == ["cpu_space_0", "cuda_space_2"]
    assert spaces("ls", "--space", "0", "--target", "cpu") == ["cpu_space_0"]
    assert spaces("clear", "--space", "2", "--dry-run") == ["cuda_space_2"]
    assert kcache("--cache-dir", root, "verify", "--space", "2", "--json").json()["checked"] == 1
    out = tmp_path / "two.tar"
    assert kcache("--cache-dir", root, "export", out, "--space", "2", "--json").json()["entry_count"] == 1


@needs_cxx
@pytest.mark.parametrize("space", ["2", "cpu_space_2"])
def test_build_takes_both_space_forms(kcache, tmp_path, space):
    from test_build import write_task

    task = write_task(tmp_path / "tasks", "adder", kind="cc")
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--space", space, "--cxx", CXX)
    assert r.exit_code == 0, r.stderr
    assert "/ops/cpu_space_2/adder/" in r.stdout
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--space", "cuda_space_2", "--target", "cpu")
    assert r.exit_code == 2 and "cuda space" in r.stderr
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--space", "7")
    assert r.exit_code == 2 and "bad space" in r.stderr


# ---- values that match nothing, a --cache-dir that is not there ---------------------------------------------
@pytest.mark.parametrize("args, hint", [
    (["--op", "matmull"], "no op 'matmull'"),
    (["--space", "bogus"], "no space 'bogus'"),
    (["--target", "gpu"], "no target 'gpu'"),
])
def test_a_value_matching_nothing_says_what_exists(kcache, tmp_path, args, hint):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    for cmd in (["ls"], ["clear", "--dry-run"], ["verify"], ["export", str(tmp_path / "x.tar")]):
        r = kcache("--cache-dir", root, *cmd, *args)
        assert hint in r.stderr, (cmd, r.stderr)
    r = kcache("--cache-dir", root, "ls", *args)
    assert r.exit_code == 0 and r.stdout == ""
    if args[0] == "--op":
        assert "did you mean matmul?" in r.stderr and "ops present: add, fused, matmul, relu, softmax" in r.stderr
    if args[0] == "--target":
        assert "targets present: cpu, cuda" in r.stderr
    assert hint in kcache("--cache-dir", root, "-q", "clear", "--yes", *args).stderr  # -q keeps warnings
    assert kcache("--cache-dir", root, "ls", "-q", *args).stderr == ""  # ls -q, paths only: nothing on stderr


def test_a_target_the_entries_keep_in_their_files_is_no_unknown_one(kcache, tmp_path):
    """Triton keeps an entry's target in its metadata, not in a directory name: `ls --target cuda` listed
    the kernels and warned "no target 'cuda' ... (no targets present)" above them. A value an entry
    selected has is never hinted at; one that selects nothing still is."""
    root = copy_tree(FIXTURES / "triton" / "cache", tmp_path / "t")
    for args in (("ls",), ("ls", "--json"), ("clear", "--dry-run"), ("verify",), ("export", tmp_path / "x.tar")):
        r = kcache("--cache-dir", root, *args, "--target", "cuda")
        assert "no target" not in r.stderr, (args, r.stderr)
    assert "matmul_kernel" in kcache("--cache-dir", root, "ls", "--target", "cuda").stdout  # selected, listed
    r = kcache("--cache-dir", root, "ls", "--target", "rocm")
    assert "no target 'rocm'" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("cmd", [["ls"], ["stats"], ["prune"], ["clear", "--all", "--yes"], ["verify"],
                                 ["inspect", "ad25"], ["log", "ad25"], ["export", "a.tar"]])
def test_an_explicit_cache_dir_must_exist(kcache, tmp_path, cmd):
    a_file = tmp_path / "file"
    a_file.write_text("not a cache")
    for where, what in ((tmp_path / "typo", "does not exist"), (a_file, "is not a directory")):
        for args in (["--cache-dir", where, *cmd], [*cmd, "--cache-dir", where]):
            r = kcache(*args)
            assert r.exit_code == 2 and r.stdout == "", (args, r)
            assert r.stderr.splitlines() == [f"Error: --cache-dir {where} {what}"]
            assert kcache("--debug", *args).exit_code == 2  # --debug adds a traceback, never another status
    assert a_file.read_text() == "not a cache"


def test_the_default_cache_missing_is_nothing_there(kcache, tmp_path):
    # HOME is empty (conftest): ~/.cache/hidet does not exist
    for cmd in (["ls"], ["stats"], ["prune"], ["verify"]):
        r = kcache(*cmd)
        assert r.exit_code == 0, (cmd, r.stderr)


# ---- habits ------------------------------------------------------------------------------------------------
def test_ls_q_prints_paths_only(kcache, tmp_path):
    root = damaged_hidet(tmp_path / "c")
    r = kcache("--cache-dir", root, "ls", "-q", "--op", "softmax")
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout.splitlines() == [str(root / SOFTMAX), str(root / "ops/cuda_space_2/softmax/ad252b064b266eea")]
    assert all(Path(p).is_dir() for p in r.stdout.split())
    everything = kcache("--cache-dir", root, "ls", "--quiet").stdout.splitlines()
    assert sorted(everything) == sorted(e["path"] for e in listing(kcache, root))


def test_op_globs_and_what_ls_reads(kcache, tmp_path, monkeypatch):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    ops = lambda *a: sorted({e["op"] for e in kcache("--cache-dir", root, "ls", *a, "--json").json()["entries"]})  # noqa: E731
    assert ops("--op", "mat*") == ["matmul"]
    assert ops("--op", "*a*") == ["add", "matmul", "softmax"]
    assert ops("--op", "re?u,soft*") == ["relu", "softmax"]
    listed: list[str] = []
    real_scandir = os.scandir

    def spy(path=".", *args, **kwargs):
        listed.append(os.fspath(path) if not isinstance(path, int) else os.readlink(f"/proc/self/fd/{path}"))
        return real_scandir(path, *args, **kwargs)

    from kcache_cli.layouts import hidet

    # With hidet installed: without it, the search for the newest version.txt lists every op (once per
    # change: tests/test_scan.py::test_op_filter_reads_only_that_op).
    monkeypatch.setattr(hidet, "installed_version", lambda: "0.6.1")
    monkeypatch.setattr(os, "scandir", spy)
    for op in ("matmul", "mat*"):
        listed.clear()
        assert ops("--op", op) == ["matmul"]
        entered = {p for p in listed if "/ops/" in p and p.count("/") > str(root).count("/") + 2}
        assert entered and all("/matmul" in p for p in entered), (op, entered)


def test_prune_accepts_yes_and_says_what_it_checked(kcache, tmp_path):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    r = kcache("--cache-dir", root, "prune")
    assert r.exit_code == 0
    assert "checked" in r.stderr and "temp" in r.stderr and "--max-size" in r.stderr
    for flag in ("--yes", "-y"):
        r = kcache("--cache-dir", root, "prune", flag, "--broken")
        assert r.exit_code == 0, r.stderr
    assert len(listing(kcache, root)) == 5


def test_import_n_is_a_dry_run(kcache, tmp_path):
    src = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    archive = tmp_path / "a.tar"
    assert kcache("--cache-dir", src, "export", archive).exit_code == 0
    dest = tmp_path / "dest"
    r = kcache("--cache-dir", dest, "import", archive, "-n", "--json")
    assert r.exit_code == 0 and r.json()["dry_run"] is True and not (dest / "ops").exists()


def home_caches(tmp_path: Path) -> dict[str, Path]:
    home = Path(os.environ["HOME"])
    roots = {"hidet": home / ".cache" / "hidet", "tilus": home / ".cache" / "tilus",
             "tilelang": home / ".tilelang" / "cache"}
    for name, path in roots.items():
        copy_tree(FIXTURES / name, path)
    return roots


def test_all_caches(kcache, tmp_path):
    roots = home_caches(tmp_path)
    rows = kcache("ls", "--all-caches", "--json").json()["entries"]
    assert {r["root"] for r in rows} == {str(p) for p in roots.values()}
    assert {r["layout"] for r in rows} == {"hidet", "tilus", "tilelang"}
    table = kcache("ls", "--all-caches", env={"COLUMNS": "100"})  # one table, a cache column (issue 25)
    assert table.stdout.split()[0] == "cache"
    assert {ln.split()[0] for ln in table.stdout.splitlines()[1:] if ln[:1].strip()} == set(roots)
    assert "in 3 caches (hidet, tilus, tilelang)" in table.stderr
    stats = kcache("stats", "--all-caches", "--json").json()["caches"]
    assert [s["root"] for s in stats] == [str(roots[n]) for n in ("hidet", "tilus", "tilelang")]
    assert sum(s["entry_count"] for s in stats) == len(rows)
    assert all(f"{p}:" in kcache("stats", "--all-caches").stdout for p in roots.values())
    plans = kcache("prune", "--all-caches", "--dry-run", "--json").json()["caches"]
    assert [p["root"] for p in plans] == [s["root"] for s in stats] and all(p["dry_run"] for p in plans)
    cleared = kcache("clear", "--all-caches", "--op", "softmax", "--yes", "--json").json()["caches"]
    assert [len(p["removed"]) for p in cleared] == [1, 0, 0]
    assert not (roots["hidet"] / SOFTMAX).exists() and (roots["hidet"] / ADD).is_dir()
    # an absolute path names an entry of one cache: the others are left alone, never "everything"
    add_one = next(r["path"] for r in rows if r["layout"] == "tilus" and r["kind"] == "script")
    assert [r["path"] for r in kcache("ls", "--all-caches", add_one, "--json").json()["entries"]] == [add_one]
    plans = kcache("clear", "--all-caches", add_one, "--dry-run", "--json").json()["caches"]
    assert [p["root"] for p in plans] == [str(roots["tilus"])]
    assert plans[0]["removed"] and all(r["layout"] == "tilus" for r in plans[0]["removed"])
    r = kcache("ls", "--all-caches", "--cache-dir", roots["tilus"])
    assert r.exit_code == 2 and "do not go together" in r.stderr


# ---- small things ------------------------------------------------------------------------------------------
@needs_cxx
def test_build_warns_about_a_final_newline_with_both_hashes(kcache, tmp_path):
    import hashlib

    from test_build import write_task

    task = write_task(tmp_path / "tasks", "nl", kind="cc")
    bare = (task / "task.txt").read_bytes()
    (task / "task.txt").write_bytes(bare + b"\n")
    theirs = hashlib.sha256(bare).hexdigest()[:16]
    ours = hashlib.sha256(bare + b"\n").hexdigest()[:16]
    r = kcache("--cache-dir", tmp_path / "cache", "build", task, "--cxx", CXX)
    assert r.exit_code == 0, r.stderr
    assert "ends with a newline" in r.stderr and theirs in r.stderr and ours in r.stderr
    assert r.stdout.strip().endswith(ours)
    (task / "task.txt").write_bytes(bare)
    assert "newline" not in kcache("--cache-dir", tmp_path / "cache", "build", task, "--cxx", CXX).stderr


@needs_cxx
def test_a_failed_build_leaves_no_empty_op_directory(kcache, tmp_path):
    from test_build import write_task

    root = tmp_path / "cache"
    ok = write_task(tmp_path / "tasks", "fine", kind="cc")
    assert kcache("--cache-dir", root, "build", ok, "--cxx", CXX).exit_code == 0
    bad = write_task(tmp_path / "tasks", "broken", kind="cc", source="this is not C++\n")
    assert kcache("--cache-dir", root, "build", bad, "--cxx", CXX).exit_code == 1
    assert sorted(p.name for p in (root / "ops" / "cpu_space_0").iterdir()) == ["fine"]
    bad2 = write_task(tmp_path / "tasks", "broken2", kind="cc", source="this is not C++\n")
    assert kcache("--cache-dir", root, "build", bad2, "--cxx", CXX, "--space", "1").exit_code == 1
    assert not (root / "ops" / "cpu_space_1").exists()  # the space it made is gone too
    from kcache_cli.catalog import names

    assert list(names.op_places(root)) == ["fine"]


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_exported_archives_follow_the_umask(kcache, tmp_path, mask, mode):
    src = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    old = os.umask(mask)
    try:
        r = kcache("--cache-dir", src, "export", tmp_path / "a.tar.gz")
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "a.tar.gz").st_mode) == mode


def test_inspect_says_each_problem_once_and_its_status_is_its_exit_code(kcache, tmp_path):
    root = damaged_hidet(tmp_path / "c")
    (root / SOFTMAX / "meta.json").write_bytes(b"{not json")
    r = kcache("--cache-dir", root, "inspect", SOFTMAX)
    assert r.exit_code == 1
    problem = "meta.json is not valid JSON"
    assert sum(problem in ln for ln in r.stdout.splitlines()) == 1
    for e in listing(kcache, root):
        r = kcache("--cache-dir", root, "inspect", e["path"])
        status = re.search(r"^status\s+(\w+)", r.stdout, re.M).group(1)
        assert r.exit_code == (0 if status == "complete" else 1), (e["path"], status)
        if e["reason"]:
            assert r.stdout.count(e["reason"].split(":")[0]) >= 1
            reasons = [ln for ln in r.stdout.splitlines() if ln.startswith("reason")]
            assert len(reasons) == 1


def test_debug_never_changes_an_exit_code(kcache, tmp_path):
    root = damaged_hidet(tmp_path / "c")
    for args in (["inspect", "ffff"], ["inspect", RELU], ["ls", "--limit", "x"], ["verify"],
                 ["clear", "--all"], ["inspect", "ad25"]):
        plain = kcache("--cache-dir", root, *args)
        debug = kcache("--cache-dir", root, "--debug", *args)
        assert plain.exit_code == debug.exit_code != 0, (args, plain.exit_code, debug.exit_code)


def test_help_metavars_and_comma_lists(kcache):
    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    app = full_app()

    for name in sorted(get_command(app).commands):
        text = kcache(name, "--help", env={"COLUMNS": "200"}).stdout
        assert "range>" not in text.lower() and "INTEGER RANGE" not in text, name
        assert not re.search(r"\{[A-Z.]+\}", text), (name, text.splitlines()[0])
    for name in ("ls", "clear", "export", "verify"):
        text = " ".join(kcache(name, "--help", env={"COLUMNS": "200"}).stdout.split())
        assert "comma-separated" in text and "--space" in text and "2 for every target" in text, name


def test_counts_and_sizes_read_as_english(kcache, tmp_path):
    from kcache_cli.cli.common import human_size, plural

    assert [human_size(n) for n in (0, 1, 999, 1000, 41_300_000)] == ["0 B", "1 B", "999 B", "1.0 kB", "41.3 MB"]
    assert [plural(n, "entry") for n in (0, 1, 2)] == ["0 entries", "1 entry", "2 entries"]
    root = copy_tree(FIXTURES / "hidet", tmp_path / "c")
    r = kcache("--cache-dir", root, "ls", "--op", "matmul")
    assert "1 entry," in r.stderr and "entries" not in r.stderr
    r = kcache("--cache-dir", root, "stats")
    assert "5 entries" in r.stdout and "Bytes" not in r.stdout
    r = kcache("--cache-dir", root, "clear", "--op", "matmul", "--yes")
    assert "Removed 1 entry," in r.stdout


def test_core_filter_understands_levels_globs_and_paths(tmp_path):
    from kcache_cli.catalog.scan import scan_cache, split_refs
    from kcache_cli.model.records import ScanFilter

    root = damaged_hidet(tmp_path / "c")
    got = lambda flt: sorted(e.relpath for e in scan_cache(root, flt).entries)  # noqa: E731
    assert got(ScanFilter(spaces=("2",))) == ["ops/cuda_space_2/softmax/ad252b064b266eea"]
    assert got(ScanFilter(ops=("soft*",), spaces=("0",))) == [SOFTMAX]
    assert got(ScanFilter(paths=(ADD,))) == [ADD]
    assert split_refs(root, ["8d1f", str(root / ADD), ADD + "/"]) == (("8d1f",), (ADD,))
