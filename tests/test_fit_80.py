"""Every table the issue-36 tour met fits the terminal (COLUMNS 80 and 120), keeping its key columns:
`dir --all` (cache, entries, size), `ls --sort size --limit 10` over every cache (status, op, size),
`diff` of two hidet and of two Triton entries (the differing facts first, hashes shortened), `push`,
`remote ls` and `remote prune` (op, hash prefix, size), and the warnings (an op typo: one, folded)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree

from kcache_cli.util.units import format_size

WIDTHS = (80, 120)
SM80 = "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"
SM90 = "VHF5NYJI46Z5SH764YNBNADKGBWRZQ7ZZXWIAKML3FZVBJSTRSDQ"
HOMES = {"hidet": ".cache/hidet", "tilus": ".cache/tilus", "tilelang": ".tilelang/cache",
         "triton/cache": ".triton/cache"}


@pytest.fixture
def machine(tmp_path) -> dict:
    """A HOME holding the four shipped caches where their compilers keep them, the other caches absent."""
    home = tmp_path / "home"
    for src, dst in HOMES.items():
        copy_tree(FIXTURES / src, home / dst)
    return {"HOME": str(home), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
            "CUDA_CACHE_PATH": str(tmp_path / "nv" / "ComputeCache"), "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
            "TRITON_CACHE_DIR": None, "TILELANG_CACHE_DIR": None, "KCACHE_DIR": None, "XDG_CACHE_HOME": None,
            "XDG_CONFIG_HOME": None, "KCACHE_CONFIG": None}


def fits(text: str, width: int) -> list[str]:
    lines = text.splitlines()
    wide = [ln for ln in lines if len(ln) > width]
    assert not wide, f"{len(wide)} lines over {width}:\n" + "\n".join(wide)
    return lines


@pytest.mark.parametrize("width", WIDTHS)
def test_dir_all_keeps_cache_entries_and_size(kcache, machine, width):
    r = kcache("dir", "--all", env={**machine, "COLUMNS": str(width)})
    assert r.exit_code == 0, r.stderr
    lines = fits(r.stdout, width)
    assert lines[0].split()[:4] == ["cache", "layout", "entries", "size"]
    rows = {ln.split()[0]: ln for ln in lines[1:] if ln and not ln.startswith(" ")}
    listed = {c["cache"] for c in kcache("dir", "--all", "--json", env=machine).json()["caches"]}
    assert set(rows) == listed >= {"hidet", "tilus", "tilelang", "triton", "inductor", "cudajit", "vllm"}
    triton = kcache("ls", "--cache", "triton", "--json", env=machine).json()["entries"]
    cells = rows["triton"].split()
    assert cells[2] == "6" and " ".join(cells[3:5]) == format_size(sum(e["size"] for e in triton)), rows["triton"]
    assert "~/.triton/cache" in r.stdout  # the home directory written as ~ for people


@pytest.mark.parametrize("width", WIDTHS)
def test_ls_over_every_cache_keeps_status_op_and_size(kcache, machine, width):
    env = {**machine, "COLUMNS": str(width)}
    entries = kcache("ls", "--json", env=env).json()["entries"]
    biggest = sorted(entries, key=lambda e: -e["size"])[:10]
    r = kcache("ls", "--sort", "size", "--limit", "10", env=env)
    assert r.exit_code == 0, r.stderr
    lines = fits(r.stdout, width)
    assert {"cache", "op", "hash", "size", "status"} <= set(lines[0].split()), lines[0]
    rows = [ln for ln in lines[1:] if not ln.startswith(" ")]
    assert len(rows) == 10
    shown = []
    for row in rows:  # each row is one of the entries, with its size, status and op; sizes tie, so any order
        cells = row.split()
        e = next(e for e in entries if any(len(w) >= 8 and e["hash"].startswith(w) for w in cells))
        assert format_size(e["size"]) in row and e["status"] in cells and (e["op"] or "-") in cells, row
        shown.append(e["size"])
    assert shown == sorted((e["size"] for e in biggest), reverse=True)
    fits(r.stderr, width)


def test_ls_over_every_cache_on_60_columns_still_says_each_rows_cache(kcache, machine):
    """A narrow terminal drops the space before the cache: without the cache a row of several caches
    (a hash, a size) no longer says what it is, while its space is one `--cache NAME` away."""
    r = kcache("ls", env={**machine, "COLUMNS": "60"})
    assert r.exit_code == 0, r.stderr
    lines = fits(r.stdout, 60)
    assert lines[0].split()[0] == "cache", lines[0]
    rows = [ln.split()[0] for ln in lines[1:] if not ln.startswith(" ")]
    assert {"hidet", "tilus", "tilelang", "triton"} <= set(rows), r.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_diff_of_two_triton_kernels_fits_with_hashes_shortened(kcache, fixture_copy, width):
    root = fixture_copy("triton/cache")
    r = kcache("--cache-dir", root, "diff", SM80[:8], SM90[:8], env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.stderr
    lines = fits(r.stdout, width)
    assert SM80 not in r.stdout and SM80[:12] in lines[0]
    facts = lines.index(next(ln for ln in lines if ln.startswith("property")))
    assert lines[facts + 1].split()[:2] == ["fact:", "target"]  # the differing facts first
    assert any(ln.startswith("size") for ln in lines) and "target.arch" in r.stdout
    assert "42d302cfb136" in r.stdout and "42d302cfb136a36b21dd5f19204eace66710cefc" not in r.stdout
    assert re.match(r"8 differ, \d+ the same", lines[-1])


@pytest.mark.parametrize("width", WIDTHS)
def test_diff_of_two_hidet_operators_answers_in_one_screen(kcache, fixture_copy, width):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "diff", "8d1f7691", "ad252b06", env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.stderr
    lines = fits(r.stdout, width)
    assert len(lines) <= 40, r.stdout
    first_text = next(i for i, ln in enumerate(lines) if ln.endswith("changed lines") or ln.endswith("changed line"))
    table = lines[:first_text]
    assert any(ln.split()[:2] == ["input", "x"] and "float32[4, 1024]" in ln for ln in table)
    assert lines[first_text].startswith("compile.sh: 2 changed lines")
    assert lines[first_text + 1].startswith("  -") and "8d1f7691" in lines[first_text + 1]
    assert lines[first_text + 2].startswith("  +") and "ad252b06" in lines[first_text + 2]
    assert "more: kcache diff --json has every line" in r.stdout  # task.txt's 18 lines, cut short


def _remote(kcache, machine, tmp_path, width):
    remote = tmp_path / "remote"
    remote.mkdir()
    env = {**machine, "COLUMNS": str(width), "KCACHE_REMOTE": f"file://{remote}"}
    home = Path(machine["HOME"])
    pushes = [kcache("--cache-dir", home / HOMES[c], "push", env=env) for c in ("hidet", "triton/cache")]
    return env, pushes


@pytest.mark.parametrize("width", WIDTHS)
def test_push_remote_ls_and_remote_prune_fit(kcache, machine, tmp_path, width):
    env, pushes = _remote(kcache, machine, tmp_path, width)
    for r in pushes:
        assert r.exit_code == 0, r.stderr
        lines = fits(r.stdout, width)
        assert {"action", "op", "hash", "size"} <= set(lines[0].split()), lines[0]
        fits(r.stderr, width)
    assert SM80[:8] in pushes[1].stdout
    if width == 80:
        assert SM80 not in pushes[1].stdout  # a unique prefix, not the 52-character key
    ls = kcache("remote", "ls", env=env)
    assert ls.exit_code == 0, ls.stderr
    lines = fits(ls.stdout, width)
    assert {"op", "hash", "size"} <= set(lines[0].split())
    assert len([ln for ln in lines[1:] if ln.strip()]) == 11
    prune = kcache("remote", "prune", "--max-size", "100k", "--dry-run", env=env)
    assert prune.exit_code == 0, prune.stderr
    lines = fits(prune.stdout, width)
    assert {"op", "hash", "size", "why"} <= set(lines[0].split())
    assert any(ln.split()[:2] == ["triton", "matmul_kernel"] and "WSRDZ7AW" in ln for ln in lines)


@pytest.mark.parametrize("width", WIDTHS)
def test_an_op_typo_warns_once_folded(kcache, machine, width):
    r = kcache("ls", "--op", "matmull", env={**machine, "COLUMNS": str(width)})
    assert r.exit_code == 0
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "in 4 caches; did you mean matmul or matmul_kernel?" in r.stderr.replace("\n  ", " ")
    fits(r.stderr, width)


def test_a_space_only_metadata_knows_is_no_typo(kcache, machine):
    """Triton's arch is its space, read from the kernel's metadata: `--space sm_80` finds kernels, no warning."""
    r = kcache("ls", "--space", "sm_80", env={**machine, "COLUMNS": "80"})
    assert r.exit_code == 0 and "sm_80" in r.stdout and "warning" not in r.stderr, r.stderr


def test_counts_have_thousands_separators():
    from kcache_cli.cli.common import plural

    assert plural(20022, "entry") == "20,022 entries" and plural(1, "entry") == "1 entry"


@pytest.mark.parametrize("width", [40, 60])
def test_inspect_and_diff_fit_a_narrow_terminal(kcache, fixture_copy, width):
    """A key wider than inspect's column (a kernel's file name, a tilus link) goes on its own line; diff's
    values narrow to fit, and its long property names and notes fold."""
    hidet, triton, tilus = fixture_copy("hidet"), fixture_copy("triton/cache"), fixture_copy("tilus")
    env = {"COLUMNS": str(width)}
    for root, args in ((triton, ("inspect", "22DX")), (tilus, ("inspect", "1-84")), (hidet, ("inspect", "8d1f")),
                       (hidet, ("diff", "064b", "3185")), (triton, ("diff", SM80[:8], SM90[:8]))):
        r = kcache("--cache-dir", root, *args, env=env)
        assert r.exit_code in (0, 1), r.stderr
        fits(r.stdout, width)


@pytest.mark.parametrize("width", [40, 80])
def test_build_s_rows_and_failure_line_fit(kcache, tmp_path, width):
    """build's table ran 49 columns at 40 (entry paths), its `failed:` line 119 at 80 (never folded); the
    compiler's own lines below it are kept as they are."""
    from conftest import CXX

    if CXX is None:
        pytest.skip("g++ not found")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "task.txt").write_text("Task(\n  name: broken_on_purpose_with_a_long_name\n)")
    (bad / "source.cc").write_text("#error x\n")
    good = tmp_path / "good"
    good.mkdir()
    (good / "task.txt").write_text("Task(\n  name: fine\n)")
    (good / "source.cc").write_text('extern "C" int f() { return 1; }\n')
    r = kcache("--cache-dir", tmp_path / "cache", "build", bad, good, "--cxx", CXX, env={"COLUMNS": str(width)})
    assert r.exit_code == 1, r.stderr
    fits(r.stdout, width)
    header = r.stderr.split("\n$ ", 1)[0]  # the failure's words, before the command and the compiler's lines
    assert "failed:" in header and "compile failed" in header.replace("\n  ", " ")
    fits(header, width)


@pytest.mark.parametrize("width", [40, 80])
@pytest.mark.parametrize("command", [("prune", "--dry-run", "--max-size", "1B"), ("clear", "--all", "--dry-run"),
                                     ("prune", "--max-size", "1B", "--yes")])
def test_prune_and_clear_summaries_fold_keeping_paths_whole(kcache, tmp_path, width, command):
    """The summary line ran 115-163 columns at COLUMNS=80 and 40: it folds between words now; the root's
    path (spaces and all) stays on one line, a number with its unit (for copy and paste)."""
    root = copy_tree(FIXTURES / "hidet", tmp_path / "my cache")
    r = kcache("--cache-dir", root, *command, env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.stderr
    wide = [ln for ln in r.stdout.splitlines() if len(ln) > width and str(root) not in ln]
    assert not wide, wide
    assert any(str(root) in ln for ln in r.stdout.splitlines()), r.stdout
    assert not re.search(r"\d\n\s+(B|kB|MB|bytes)\b", r.stdout), r.stdout


@pytest.mark.parametrize("width", [40, 80])
def test_archive_summaries_keep_a_number_with_its_unit(kcache, tmp_path, width):
    """import's summary folded as "57 files (165.2" / "  kB) verified" at COLUMNS=80: the summaries of export,
    import and push (stderr) keep each number with its unit on one line, as prune's and clear's do."""
    root = copy_tree(FIXTURES / "hidet", tmp_path / "cache")
    arc, env = tmp_path / "h.tar.zst", {"COLUMNS": str(width)}
    (tmp_path / "remote").mkdir()
    runs = [kcache("--cache-dir", root, "export", arc, env=env),
            kcache("--cache-dir", tmp_path / "new", "import", arc, "--dry-run", env=env),
            kcache("--cache-dir", tmp_path / "new", "import", arc, env=env),
            kcache("--cache-dir", root, "push", "--remote", (tmp_path / "remote").as_uri(), env=env)]
    for r in runs:
        assert r.exit_code == 0, r.stderr
        assert not re.search(r"\d\n\s+(B|kB|MB|bytes|files|entries|entry)\b", r.stderr), r.stderr


def test_the_budget_bar_in_a_pipe_is_plain(kcache, fixture_copy):
    """stats' budget line drew block characters into a pipe; the share bars draw # and . there."""
    root = fixture_copy("hidet")
    assert kcache("config", "set", "--cache", "hidet", "max-size", "20G").exit_code == 0  # a personal budget
    out = kcache("--cache-dir", root, "stats").stdout
    line = next(ln for ln in out.splitlines() if " of 20.0 GB" in ln)
    assert "\u2591" not in out and "\u2588" not in out and "...." in line, line


# ---- help: wrapped to the terminal, down to 40 columns --------------------------------------------------
def _help_commands() -> list[list[str]]:
    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    out: list[list[str]] = [[]]
    for name, cmd in get_command(full_app()).commands.items():
        out.append([name])
        out += [[name, sub] for sub in getattr(cmd, "commands", {})]
    return out


_HELP_DRIVER = """import contextlib, io, json, sys
from kcache_cli.cli.app import main
out = {}
for words in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main([*words, "--help"])
        except SystemExit:
            pass
    out[" ".join(words)] = buf.getvalue()
print(json.dumps(out))
"""


def _plain_help(width: int, commands: list[list[str]]) -> dict[str, str]:
    """Each command's --help as kcache prints it into a pipe with COLUMNS=width (a process of its own: the
    in-process runner forces Click's width to 80)."""
    env = {**os.environ, "COLUMNS": str(width), "NO_COLOR": "1"}
    run = subprocess.run([sys.executable, "-c", _HELP_DRIVER, json.dumps(commands)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_plain_help_fits_down_to_40_columns_and_says_the_same():
    """`COLUMNS=40 kcache ls --help` printed lines up to 50 columns (Click's help never wraps under 50, and
    puts at least 10 columns of text beside a 30-column option). Every command's plain help (a pipe) now
    fits 40, 50 and 60 columns, and says word for word what it says at 80; at 80 and wider it is Click's
    78-column layout, the same at 120."""
    commands = _help_commands()
    at = {w: _plain_help(w, commands) for w in (40, 50, 60, 80, 120)}
    for name, wide in at[80].items():
        assert wide.startswith("Usage: kcache"), name
        assert 60 < max(map(len, wide.splitlines())) <= 78, name  # the wide layout still uses the room
        assert at[120][name] == wide, name
        for width in (40, 50, 60):
            lines = at[width][name].splitlines()
            assert max(map(len, lines)) <= width, (name, width, [ln for ln in lines if len(ln) > width])
            assert "".join(at[width][name].split()) == "".join(wide.split()), (name, width)


def test_a_usage_that_fits_40_columns_stays_on_its_line():
    """`COLUMNS=40 kcache prune --help` printed `Usage: kcache prune ` (a trailing blank) and `[OPTIONS]`
    on the next line: Click wants 20 columns for the arguments beside the command, else moves them all
    down. A usage that fits is its one line at 80 now; a longer one wraps beside the command, or below it
    when a word is too long for that, and no word is cut (explain's `[ENTRY|ARCHIVE|IM` `AGE|BLOB]...`)."""
    commands = [words for words in _help_commands() if words]
    wide, narrow = _plain_help(80, commands), _plain_help(40, commands)
    for name, text in narrow.items():
        usage = wide[name].splitlines()[0]
        block = text.split("\n\n")[0].splitlines()
        assert all(ln == ln.rstrip() for ln in block), (name, block)
        assert [w for ln in block for w in ln.split()] == usage.split(), (name, block)
        if len(usage) <= 38:  # the 40 columns less Click's 2
            assert block == [usage], (name, block)
    assert narrow["prune"].splitlines()[0] == "Usage: kcache prune [OPTIONS]"


def test_help_in_a_40_column_terminal_fits(tmp_path):
    """In a terminal (Rich's help) too, and nothing is cut to fit: Rich ended option names and words with
    `…` (`--cache-d…`, `Repeata…`); they fold onto the next line now."""
    from test_cli_terminal import in_a_terminal

    for words in ([], ["ls"], ["remote", "ls"], ["explain"], ["push"], ["prune"]):
        text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", in_a_terminal([*words, "--help"], 40)).replace("\r", "")
        assert text.strip() and max(map(len, text.splitlines())) <= 40, words
        cut = [ln for ln in text.splitlines() if re.search(r"\w\u2026", ln)]  # a word ending in the mark
        assert not cut, (words, cut)
