"""A program kcache asks a question (explain's interpreter) answers within bounds: time, bytes, and nothing
left running (kcache_cli/util/capped.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kcache_cli.util import capped


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _alive(pid_file) -> bool:
    """Whether the process is running (a zombie no one has reaped yet is not: it was killed)."""
    try:
        stat = Path(f"/proc/{int(pid_file.read_text())}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_an_answer_is_read_whole(tmp_path):
    got = capped.ask([_script(tmp_path, "ok", "echo out; echo err >&2; exit 3")], 10)
    assert got == capped.Answer(3, b"out\n", b"err\n", False, False)


def test_an_answer_whose_output_closes_before_its_exit_is_whole(tmp_path):
    """The output's end comes a moment before the exit status: an answer read then had no status (None:
    "no answer") a few times in a hundred on a loaded machine."""
    python = _script(tmp_path, "ok", "echo '{}'")
    assert all(capped.ask([python], 30).returncode == 0 for _ in range(100))


def test_output_without_end_is_cut_at_the_limit(tmp_path):
    started = time.monotonic()
    got = capped.ask([_script(tmp_path, "yes", "yes")], 30, limit=1 << 16)
    assert got.too_much and got.returncode is None and len(got.out) == 1 << 16
    assert time.monotonic() - started < 10


def test_no_answer_in_time_is_ended_with_everything_it_started(tmp_path):
    pid = tmp_path / "pid"
    started = time.monotonic()
    got = capped.ask([_script(tmp_path, "hang", f"sleep 300 & echo $! > {pid}; wait")], 1)
    assert got.timed_out and got.returncode is None and time.monotonic() - started < 10
    time.sleep(0.2)
    assert not _alive(pid)


def test_a_child_left_holding_the_output_neither_holds_kcache_nor_outlives_it(tmp_path):
    pid = tmp_path / "pid"
    started = time.monotonic()
    got = capped.ask([_script(tmp_path, "bg", f"sleep 300 & echo $! > {pid}; echo hi")], 60)
    assert got.out == b"hi\n" and got.returncode == 0 and not got.timed_out
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    assert not _alive(pid)


@pytest.mark.parametrize("body, why", [("head -c 4000 /dev/urandom", "no answer"),
                                       ("yes", "printed more than 1 MiB, not an answer")])
def test_explain_says_unknown_for_an_interpreter_that_answers_nonsense(kcache, fixture_copy, tmp_path, body, why):
    python = _script(tmp_path, "python", body)
    r = kcache("--cache-dir", fixture_copy("hidet"), "--json", "explain", "--python", python, "--gpu", "sm_90")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    assert doc["here"]["problem"] == f"{python}: {why}" and doc["hit"] == doc["miss"] == 0 and doc["unknown"] > 0
