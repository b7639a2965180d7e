"""The read-only commands through the real entry point: ls, inspect, log, stats, dir, --version."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from kcache_cli import __version__
from kcache_cli.model.records import JSON_KEYS

SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"


@pytest.mark.parametrize("args", [("--version",), ("-q", "--version"), ("--version", "ls"), ("--json", "--version")])
def test_version(kcache, args):
    r = kcache(*args)
    assert r.exit_code == 0 and r.stdout.strip() == f"kcache {__version__}"


def test_version_runs_with_no_command_registered_and_help_with_all():
    from kcache_cli.cli.app import app, app_for

    assert app_for(["--version"]).registered_commands == [] and app_for(["--version"]).registered_groups == []
    for args in (["--help"], ["--help", "--version"], [], ["--show-completion", "--version"]):
        assert app_for(args) is app


def test_python_m_entry_point(fixture_copy):
    root = fixture_copy("hidet")
    out = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "ls", "--op", "matmul"],
                         capture_output=True, text=True, check=True).stdout
    assert "064b4a6c035246e8" in out and "matmul" in out and "softmax" not in out


@pytest.mark.parametrize("args, code", [(["--version"], 0), (["ls", "--op"], 2)])
def test_the_console_script_ends_without_the_interpreters_teardown(args, code):
    """run() (the console script, `python -m kcache_cli`) is main(), then the exit handlers, the standard
    streams flushed and os._exit with main's status: the interpreter never tears itself down (freeing every
    object the command left alive, one by one), and nothing written is lost. Its teardown is seen by the
    audit event it raises (cpython.PyInterpreterState_Clear)."""
    probe = ("import atexit, os, sys\n"
             "def hook(event, args, write=os.write):\n"
             "    if event == 'cpython.PyInterpreterState_Clear': write(2, b'torn down\\n')\n"
             "sys.addaudithook(hook)\n"
             "atexit.register(lambda: print('handler ran', file=sys.stderr))\n"
             "sys.stdout.write('buffered ')\n"
             "sys.argv[0] = 'kcache'\nfrom kcache_cli.cli.app import run\nrun()")
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert "handler ran" in done.stderr and "torn down" not in done.stderr
    assert done.stdout.startswith("buffered ")
    if code == 0:
        assert done.stdout == f"buffered kcache {__version__}\n"


def test_exit_now_leaves_what_it_cannot_do_to_the_interpreter(monkeypatch):
    """A status that is not a number, or a thread the interpreter would wait for: _exit_now returns (the
    interpreter's own exit runs); else the handlers run, then os._exit with the status."""
    import threading

    from kcache_cli.cli import app

    calls: list = []
    monkeypatch.setattr(app.atexit, "_run_exitfuncs", lambda: calls.append("handlers"))
    monkeypatch.setattr(app.os, "_exit", lambda code: calls.append(("exit", code)))
    app._exit_now("a message")
    app._exit_now(256)
    assert calls == []
    release = threading.Event()
    waiting = threading.Thread(target=release.wait)
    waiting.start()
    try:
        app._exit_now(0)
        assert calls == []
    finally:
        release.set()
        waiting.join()
    app._exit_now(None)
    app._exit_now(3)
    assert calls == ["handlers", ("exit", 0), "handlers", ("exit", 3)]


def test_a_commands_entries_live_to_the_exit_and_go_with_the_next_command(kcache, fixture_copy):
    """What a listing made (its scan, its JSON document) is kept to the exit (never freed one object at a
    time as the command returns: app._exit_now gives the memory back at once); the next command run in the
    same process lets go of it."""
    from kcache_cli.cli import options

    root = fixture_copy("hidet")
    assert kcache("--cache-dir", root, "ls", "--json").json()["entry_count"] == 5
    first = list(options.kept_to_exit)
    assert [len(k.entries) for k in first if hasattr(k, "entries")] == [5]
    assert [len(k["entries"]) for k in first if isinstance(k, dict)] == [5]
    assert kcache("--cache-dir", root, "stats", "--json").exit_code == 0
    assert options.kept_to_exit and not any(k is f for k in options.kept_to_exit for f in first)


def test_ls_hidet_lists_the_five_entries(kcache, fixture_copy):
    root = fixture_copy("hidet")
    rows = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert len(rows) == 5
    assert all(list(r) == list(JSON_KEYS) for r in rows)
    assert {(r["space"], r["op"], r["hash"]) for r in rows} == {
        ("cpu_space_0", "fused", "af3046266c6abdd1"), ("cpu_space_0", "matmul", "064b4a6c035246e8"),
        ("cpu_space_0", "relu", "31857fe085635b31"), ("cuda_space_0", "add", "8d1f7691cdf75e90"),
        ("cuda_space_0", "softmax", "ad252b064b266eea")}
    assert all(isinstance(r["size"], int) and r["modified"].endswith("+00:00") for r in rows)


def test_ls_table_for_people(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("ls", "--cache-dir", root)  # global option after the command
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0].split()[:5] == ["layout", "kind", "space", "op", "hash"]
    assert len(lines) == 6 and "\x1b[" not in r.stdout
    assert "5 entries" in r.stderr  # the summary is for people: stderr


def test_ls_op_filter_and_json_flag_before_command(kcache, fixture_copy):
    root = fixture_copy("hidet")
    rows = kcache("--cache-dir", root, "--json", "ls", "--op", "matmul").json()["entries"]
    assert [(r["op"], r["hash"]) for r in rows] == [("matmul", "064b4a6c035246e8")]


def test_ls_sort_limit_status_hash(kcache, fixture_copy):
    root = fixture_copy("hidet")
    rows = kcache("--cache-dir", root, "ls", "--sort", "size", "--json").json()["entries"]
    sizes = [r["size"] for r in rows]
    assert sizes == sorted(sizes, reverse=True)
    assert len(kcache("--cache-dir", root, "ls", "--limit", "2", "--json").json()["entries"]) == 2
    assert kcache("--cache-dir", root, "ls", "--status", "partial", "--json").json()["entries"] == []
    assert [r["hash"] for r in kcache("--cache-dir", root, "ls", "ad25", "31857", "--json").json()["entries"]] == \
        ["31857fe085635b31", "ad252b064b266eea"]
    (root / SOFTMAX / "func_types.pickle").unlink()
    rows = kcache("--cache-dir", root, "ls", "--status", "partial", "--json").json()["entries"]
    assert [(r["hash"], r["status"]) for r in rows] == [("ad252b064b266eea", "partial")]


@pytest.mark.parametrize("args, message", [
    (["ls", "--status", "compleet"], "unknown status 'compleet'"),
    (["ls", "--sort", "color"], "unknown sort key 'color'"),
    (["ls", "--space", "cuda space"], "bad space"),
    (["ls", "--space", "../etc"], "bad space"),
    (["ls", "--layout", "ccache"], "unknown layout 'ccache'"),
    (["ls", "--limit", "-1"], "--limit"),
    (["inspect"], "Missing argument"),
    (["frobnicate"], "No such command"),
])
def test_usage_errors_are_one_line(kcache, fixture_copy, args, message):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, *args)
    assert r.exit_code == 2
    assert r.stderr.startswith("Error: ") and message in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_ls_damaged_cache_exits_zero(kcache, fixture_copy):
    hidet = fixture_copy("hidet")
    lib = hidet / SOFTMAX / "lib.so"
    lib.write_bytes(lib.read_bytes()[:1000])
    (hidet / "ops/cpu_space_0/matmul/064b4a6c035246e8/func_types.pickle").unlink()
    r = kcache("--cache-dir", hidet, "ls", "--json")
    assert r.exit_code == 0 and "Traceback" not in r.stderr
    status = {x["hash"]: (x["status"], x["reason"]) for x in r.json()["entries"]}
    assert status["ad252b064b266eea"][0] == "corrupt" and "truncated" in status["ad252b064b266eea"][1]
    assert status["064b4a6c035246e8"][0] == "partial"
    tilus = fixture_copy("tilus")
    shutil.rmtree(tilus / "programs/f006237ca7a5")
    r = kcache("--cache-dir", tilus, "ls")  # the script's program is gone: tilus compiles it again
    assert r.exit_code == 0 and "partial" in r.stdout and "is gone" in r.stdout


def test_missing_cache_is_empty_not_error(kcache, tmp_path):
    env = {"KCACHE_DIR": str(tmp_path / "none")}  # not an explicit --cache-dir: that one must exist
    assert kcache("ls", "--json", env=env).json()["entries"] == []
    r = kcache("ls", env=env)
    assert r.exit_code == 0 and "no cache at" in r.stderr
    data = kcache("stats", "--json", env=env).json()
    assert data["entry_count"] == 0 and data["exists"] is False


def test_inspect_cuda_softmax_reports_sm90a(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "inspect", "ad25")
    assert r.exit_code == 0, r.stderr
    assert "sm_90a" in r.stdout and "softmax" in r.stdout and "x: float32[8, 128]" in r.stdout
    assert "hidet_launch_0" in r.stdout and "nvcc" in r.stdout
    data = kcache("--cache-dir", root, "inspect", "ad25", "--json").json()
    assert data["archs"] == ["sm_90a"] and data["status"] == "complete" and data["problems"] == []
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": [8, 128]}]
    assert {f["name"] for f in data["files"]} >= {"lib.so", "task.txt", "func_types.pickle"}
    assert "hidet_launch_0" in data["binaries"][0]["symbols"]


# What a command's run executed: a lazy module not yet run is in sys.modules, but not as a plain module.
_RAN = ("import sys, types\nfrom kcache_cli.cli.app import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(' '.join(m for m, mod in sys.modules.items() if m.startswith('kcache_cli.')\n"
        "               and type(mod) is types.ModuleType), file=sys.stderr)")


@pytest.mark.parametrize("command", ["inspect", "log"])
def test_a_lookup_by_prefix_runs_no_scan_engine_code(fixture_copy, command):
    """`inspect` and `log` judge one entry: the index, the worker pool and the Mega-Cache command stay
    unloaded (each costs start-up time that `kcache --version` does not pay)."""
    root = fixture_copy("hidet")
    done = subprocess.run([sys.executable, "-c", _RAN, "--cache-dir", str(root), command, "ad25"],
                          capture_output=True, text=True, timeout=60)
    assert "softmax" in done.stdout or "nvcc" in done.stdout, done.stderr
    ran = set(done.stderr.split())
    assert "kcache_cli.layouts.hidet" in ran and "kcache_cli.catalog.scan" in ran
    assert not ran & {"kcache_cli.catalog.index", "kcache_cli.util.parallel", "kcache_cli.cli.cmd_mega"}


def test_inspect_cpu_entry_has_no_cuda_arch(kcache, fixture_copy):
    root = fixture_copy("hidet")
    data = kcache("--cache-dir", root, "inspect", "064b", "--json").json()
    assert data["archs"] == [] and data["binaries"][0]["machine"] == "x86-64"
    assert data["compile_command"].startswith("/usr/bin/g++")


@pytest.mark.parametrize("layout, prefix", [("tilus", "f006"), ("tilelang", "cb68"), ("tilelang", "4bc9")])
def test_inspect_tilus_and_tilelang_arch(kcache, fixture_copy, layout, prefix):
    root = fixture_copy(layout)
    data = kcache("--cache-dir", root, "inspect", prefix, "--json").json()
    assert data["status"] == "complete" and data["archs"] == ["sm_90a"]


def test_inspect_edited_task_is_still_complete(kcache, fixture_copy):
    """hidet never reads task.txt on load (issue 22): an edit changes nothing it does."""
    root = fixture_copy("hidet")
    task = root / SOFTMAX / "task.txt"
    task.write_bytes(task.read_bytes() + b" ")
    r = kcache("--cache-dir", root, "inspect", "ad25")
    assert r.exit_code == 0 and re.search(r"^status\s+complete", r.stdout, re.M)


def test_inspect_garbage_meta_json_is_corrupt(kcache, fixture_copy):
    root = fixture_copy("hidet")
    (root / SOFTMAX / "meta.json").write_bytes(b"{not json")
    r = kcache("--cache-dir", root, "inspect", "ad25")
    assert r.exit_code == 1  # the entry is not complete (issue 14: inspect's status says so)
    assert "corrupt" in r.stdout and "meta.json is not valid JSON" in r.stdout


def test_inspect_unknown_and_ambiguous(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "inspect", "ffff")
    assert r.exit_code == 2 and r.stderr.startswith("Error: no entry matches 'ffff'")
    shutil.copytree(root / SOFTMAX, root / "ops/cuda_space_1/softmax/ad252b064b266eea")
    r = kcache("--cache-dir", root, "inspect", "ad2")
    assert r.exit_code == 2 and "ambiguous" in r.stderr and "cuda_space_1" in r.stderr
    assert r.stderr.count("\n") == 1
    assert kcache("--cache-dir", root, "inspect", "ops/cuda_space_1/softmax/ad252b064b266eea").exit_code == 0


def test_log_shows_compile_sh_command_and_ptxas(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "log", "ad25")
    assert r.exit_code == 0
    assert "==> compile.sh <==" in r.stdout and "==> nvcc_output.txt <==" in r.stdout
    assert "/usr/local/bin/nvcc" in r.stdout and "-gencode arch=compute_90a,code=sm_90a" in r.stdout
    assert "ptxas info    : Used 18 registers" in r.stdout
    raw = kcache("--cache-dir", root, "log", "ad25", "--raw").stdout
    assert "==>" not in raw and raw.startswith("#!/bin/bash")
    assert raw.rstrip().endswith("elapsed time: 1.849 seconds")


def test_log_prints_no_header_for_a_file_it_then_refuses(kcache, fixture_copy, tmp_path):
    """A compile.sh that is a symlink is never read: it gets no `==> compile.sh <==` header, the logs
    that can be read are shown, and the refusal is one error line after them (exit 1)."""
    root = fixture_copy("hidet")
    entry = root / "ops/cuda_space_0/softmax/ad252b064b266eea"
    (tmp_path / "c.sh").write_bytes((entry / "compile.sh").read_bytes())
    (entry / "compile.sh").unlink()
    (entry / "compile.sh").symlink_to(tmp_path / "c.sh")
    r = kcache("--cache-dir", root, "log", "ad25")
    assert r.exit_code == 1
    assert "compile.sh" not in r.stdout and r.stdout.startswith("==> nvcc_output.txt <==\nptxas info")
    assert r.stderr == "Error: cannot read compile.sh: a symlink, not a regular file (kcache never reads it)\n"
    raw = kcache("--cache-dir", root, "log", "ad25", "--raw")
    assert raw.exit_code == 1 and raw.stdout.startswith("ptxas info") and "nvcc" not in raw.stdout.split("\n")[0]
    assert raw.stderr == r.stderr
    out = entry / "nvcc_output.txt"
    (tmp_path / "out.txt").write_bytes(out.read_bytes())
    out.unlink()
    out.symlink_to(tmp_path / "out.txt")
    r = kcache("--cache-dir", root, "log", "ad25")
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == "Error: cannot read compile.sh: a symlink, not a regular file (kcache never reads it) (and 1 " \
                       "more log)\n"


def test_log_cpu_entry_and_tilus(kcache, fixture_copy):
    hidet = fixture_copy("hidet")
    assert "==> gcc_output.txt <==" in kcache("--cache-dir", hidet, "log", "064b").stdout
    tilus = fixture_copy("tilus")
    out = kcache("--cache-dir", tilus, "log", "f006").stdout
    assert "module/compile.sh" in out and "tilus_add_one_kernel" in out
    out = kcache("--cache-dir", tilus, "log", "1-845").stdout  # a script shows its programs' logs
    assert "f006237ca7a5/module/nvcc_output.txt" in out


def test_log_seed_layout_and_highlighting(kcache, tmp_path, monkeypatch):
    d = tmp_path / "c/ops/cuda_space_0/bad/0123456789abcdef"
    d.mkdir(parents=True)
    (d / "nvcc_log.txt").write_text("nvcc -shared -arch=sm_90 source.cu -o lib.so\n"
                                    "source.cu(3): error: identifier \"x\" is undefined\n"
                                    "source.cu(1): warning #177-D: unused\nelapsed time: 0.5 seconds\n")
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "c"))
    raw = kcache("log", "0123", "--raw").stdout
    assert raw.splitlines()[0] == "nvcc -shared -arch=sm_90 source.cu -o lib.so"
    rows = kcache("ls", "--json").json()["entries"]
    assert rows[0]["status"] == "failed"
    from rich.markup import escape

    from kcache_cli.cli.cmd_read import _log_line

    assert _log_line('source.cu(3): error: identifier "x" is undefined', escape).startswith("[bold red]")
    assert _log_line("source.cu(1): warning #177-D: unused", escape).startswith("[yellow]")
    assert _log_line("elapsed time: 0.5 seconds", escape) == "elapsed time: 0.5 seconds"


def test_log_of_tilelang_kernel_is_a_clear_error(kcache, fixture_copy):
    root = fixture_copy("tilelang")
    r = kcache("--cache-dir", root, "log", "cb68")
    assert r.exit_code == 1 and r.stderr.startswith("Error: no compile log recorded")


def test_stats_totals(kcache, fixture_copy):
    root = fixture_copy("hidet")
    rows = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    pickle_disk = os.stat(root / SOFTMAX / "func_types.pickle").st_blocks * 512
    (root / SOFTMAX / "func_types.pickle").unlink()
    data = kcache("--cache-dir", root, "stats", "--json").json()
    assert data["root"] == str(root) and data["layout"] == "hidet" and data["entry_count"] == 5
    # sizes are disk usage (issue 32): the 1111 bytes of func_types.pickle took a block or more
    assert data["size"] == sum(r["size"] for r in rows) - pickle_disk and pickle_disk >= 1111
    assert data["apparent_size"] == sum(r["apparent_size"] for r in rows) - 1111
    assert data["by_space"]["cuda_space_0"]["entry_count"] == 2 and data["by_space"]["cpu_space_0"]["entry_count"] == 3
    assert data["by_status"] == {"complete": {"entry_count": 4,
                                              "size": data["size"] - data["by_op"]["softmax"]["size"]},
                                 "partial": {"entry_count": 1, "size": data["by_op"]["softmax"]["size"]}}
    biggest = [b["size"] for b in data["biggest"]]
    assert len(biggest) == 5 and biggest == sorted(biggest, reverse=True)
    assert biggest[0] == max(b["size"] for b in data["biggest"])
    text = kcache("--cache-dir", root, "stats").stdout
    assert "5 entries" in text and "cuda_space_0" in text and "partial" in text


def test_stats_over_every_cache_ends_with_their_total(kcache, tmp_path, monkeypatch):
    """The default scope printed one report per cache, each 100% of itself, and no total: one TOTAL line
    now follows them (80 columns), and --json has `total`, the caches' reports added up."""
    from conftest import FIXTURES, copy_tree

    home = tmp_path / "home"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    copy_tree(FIXTURES / "triton" / "cache", home / ".triton" / "cache")
    env = {"HOME": str(home), "XDG_CACHE_HOME": None, "XDG_CONFIG_HOME": None, "KCACHE_CONFIG": None,
           "KCACHE_DIR": None, "TRITON_CACHE_DIR": None, "TRITON_HOME": None}
    doc = kcache("stats", "--json", env=env).json()
    there = [r for r in doc["caches"] if r["exists"]]
    assert len(there) >= 2 and sum(r["entry_count"] for r in there) == 11  # hidet's 5, Triton's 6
    assert doc["total"] == {"cache_count": len(there), "entry_count": 11, "size": sum(r["size"] for r in there),
                            "apparent_size": sum(r["apparent_size"] for r in there)}
    monkeypatch.setenv("COLUMNS", "80")
    text = kcache("stats", env=env).stdout
    last = text.rstrip("\n").splitlines()[-1]
    from kcache_cli.util.units import format_size

    assert last.split() == ["TOTAL", "11", "entries,", *format_size(doc["total"]["size"]).split(), "in",
                            str(len(there)), "caches"]
    assert max(len(line) for line in text.splitlines()) <= 80
    one = kcache("--cache-dir", home / ".cache" / "hidet", "stats", "--json", env=env).json()
    assert "total" not in one and "TOTAL" not in kcache("--cache-dir", home / ".cache" / "hidet", "stats").stdout


def test_stats_all_layouts(kcache, fixture_copy):
    for name, count in (("tilus", 2), ("tilelang", 2)):
        data = kcache("--cache-dir", fixture_copy(name), "stats", "--json").json()
        assert data["layout"] == name and data["entry_count"] == count
        assert data["by_status"]["complete"]["entry_count"] == count


def test_no_rich_or_humanize_at_startup():
    code = ("import sys; from kcache_cli.cli import app; "
            "bad = [m for m in ('rich', 'humanize', 'tarfile', 'zstandard', 'filelock') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"imported at start-up: {out}"


@pytest.mark.parametrize("args, loaded", [(["--version"], []), (["ls", "--help"], ["cmd_read"]),
                                          (["remote", "--help"], ["cmd_remote"]), (["--help"], "all")])
def test_a_run_loads_only_its_commands_module(args, loaded):
    """Start-up: the engines load with the command that uses them (cli/app.py COMMANDS)."""
    code = ("import sys; from kcache_cli.cli.app import COMMANDS, main\ntry: main(sys.argv[1:])\n"
            "except SystemExit: pass\nprint(' '.join(sorted(m.rpartition('.')[2] for m in sys.modules "
            "if m.startswith('kcache_cli.cli.cmd_'))), file=sys.stderr)\n"
            "print(any(m.startswith(('kcache_cli.catalog', 'kcache_cli.ops')) for m in sys.modules), file=sys.stderr)")
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    modules, engines = run.stderr.splitlines()[-2:]
    from kcache_cli.cli.app import COMMANDS

    got = set(modules.split()) - {"cmd_mega", "cmd_oci"}  # helpers of cmd_archive and cmd_remote
    assert got == (set(COMMANDS.values()) if loaded == "all" else set(loaded))
    assert engines == str(loaded != [])


def test_a_line_naming_one_command_builds_only_that_command():
    """Start-up: Typer inspects every registered command; a line naming one gets an app of one."""
    from kcache_cli.cli.app import app, app_for

    one = app_for(["--cache-dir", "/x", "-q", "build", "t.txt", "--", "--debug"])
    assert [c.callback.__name__ for c in one.registered_commands] == ["build_command"]
    assert one.registered_callback is app.registered_callback and one.info is app.info
    for args in (["--help"], [], ["frobnicate"], ["--cache-dir", "ls"], ["--show-completion"]):
        assert app_for(args) is app, args
    assert app_for(["--cache-dir", "ls", "stats"]).registered_commands[0].name == "stats"


def test_one_command_app_behaves_like_the_full_one(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("ls", "--op", "matmul", "--cache-dir", root, "-q", "--json")
    assert r.exit_code == 0 and [x["hash"] for x in r.json()["entries"]] == ["064b4a6c035246e8"] and r.stderr == ""
    r = kcache("ls", "--bogus")
    assert r.exit_code == 2 and r.stderr.startswith("Error: No such option: --bogus")
    assert "Example:" in kcache("inspect", "--help").stdout


def test_log_refuses_the_global_json_in_one_line(kcache, fixture_copy):
    """log has no --json of its own: the global one is a usage error (a JSON error document), not text
    on stdout where a script expects JSON."""
    root = fixture_copy("hidet")
    r = kcache("--json", "--cache-dir", root, "log", "8d1f7691")
    assert r.exit_code == 2 and json.loads(r.stdout)["schema"] == "kcache/error/1"
    assert kcache("--cache-dir", root, "log", "8d1f7691").exit_code == 0


def test_ls_limit_0_says_how_many_it_left_out(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "ls", "--limit", "0")
    assert r.exit_code == 0 and r.stdout == "" and "0 of 5 entries shown" in r.stderr
