"""`kcache diff A B` on real entries: Triton kernels compiled by Triton for two archs, hidet operators of two
tasks, and what diff refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

SM80 = "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"
SM90 = "VHF5NYJI46Z5SH764YNBNADKGBWRZQ7ZZXWIAKML3FZVBJSTRSDQ"


@pytest.fixture
def triton(fixture_copy) -> Path:
    return fixture_copy("triton/cache")


def test_triton_kernels_for_two_archs(kcache, triton):
    r = kcache("--cache-dir", triton, "diff", SM80[:8], SM90[:8], "--json")
    assert r.exit_code == 0, r.stderr
    got = {d["property"]: (d["a"], d["b"]) for d in r.json()["differences"]}
    assert got["<kernel>.json: target.arch"] == ("80", "90")
    assert got["fact: target"] == ("cuda sm_80", "cuda sm_90a")
    assert "<kernel>.json: num_warps" not in got  # the same in both: counted, not listed
    assert r.json()["same"] > 10
    assert {r.json()["a"]["hash"], r.json()["b"]["hash"]} == {SM80, SM90}
    text = kcache("--cache-dir", triton, "diff", SM80[:8], SM90[:8])
    assert "target.arch" in text.stdout and "differ" in text.stdout


def test_a_kernel_against_itself_and_other_layouts(kcache, triton, fixture_copy):
    same = kcache("--cache-dir", triton, "diff", SM80[:8], SM80)
    assert same.exit_code == 2 and "same entry" in same.stderr
    missing = kcache("--cache-dir", triton, "diff", SM80[:8], "ZZZZZZZZ")
    assert missing.exit_code == 2 and missing.stderr.startswith("Error:")


def test_hidet_operators_show_their_task_lines(kcache, fixture_copy):
    root = fixture_copy("hidet")
    rows = kcache("--cache-dir", root, "ls", "--json", "--kind", "op").json()["entries"]
    by_op: dict[str, list[dict]] = {}
    for row in rows:
        by_op.setdefault(row["op"], []).append(row)
    pair = next((v for v in by_op.values() if len(v) >= 2), None)
    if pair is None:
        pair = rows[:2]
    r = kcache("--cache-dir", root, "diff", pair[0]["path"], pair[1]["path"], "--json")
    assert r.exit_code == 0, r.stderr
    diffs = {d["property"]: d for d in r.json()["differences"]}
    assert "task.txt" in diffs and diffs["task.txt"]["lines"]
    assert all(ln[:1] in "+-" for ln in diffs["task.txt"]["lines"])
    assert json.dumps(r.json())  # plain data


def test_diff_into_a_pipe_fits_80_columns(kcache, fixture_copy):
    """Into a pipe (no COLUMNS) the A column was as wide as its longest value, hidet's compile command:
    every row ran to about 600 characters, mostly padding. It keeps 80 columns, values cut around where they
    differ (--json has them whole), and no line ends in spaces."""
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "diff", "8d1f", "ad25")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and not [ln for ln in lines if ln != ln.rstrip()], r.stdout
    command = next(ln for ln in lines if ln.startswith("compile command"))
    assert "add/8d1f7691cdf75e90" in command and "softmax/ad252b064b266eea" in command, command
    assert len(next(ln for ln in lines if ln.startswith("size")).split()) == 5  # size, A's and B's (with units)


def test_diff_has_help(kcache):
    r = kcache("diff", "--help")
    assert r.exit_code == 0 and "Why are there two of these" in r.stdout


def test_names_with_terminal_escapes_are_inert_in_diff_text(kcache, fixture_copy):
    """An op directory named with escape sequences (a window title, a clear screen) and a task line that
    holds one reach stdout escaped, in a pipe as on a terminal: diff's text is for people (--json is the
    data)."""
    root = fixture_copy("hidet")
    space = root / "ops" / "cuda_space_0"
    source = next(p for p in sorted(space.glob("*/*")) if (p / "task.txt").is_file())
    for op, key in (("x\x1b]0;pwn\x07", "a" * 16), ("y\x1b[2Jz", "b" * 16)):
        (space / op).mkdir()
        shutil.copytree(source, space / op / key)
    task = space / "y\x1b[2Jz" / ("b" * 16) / "task.txt"
    task.write_bytes(task.read_bytes() + b"\n  note: \x1b[31mred\x1b[0m\n")
    r = kcache("--cache-dir", root, "diff", "a" * 16, "b" * 16)
    assert r.exit_code == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "\\x1b]0;pwn" in r.stdout and "\\x1b[2J" in r.stdout  # shown, escaped
    assert "pwn" in json.dumps(kcache("--cache-dir", root, "diff", "a" * 16, "b" * 16, "--json").json())
