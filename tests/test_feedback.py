"""What a person sees while kcache works and what it tells them after (issue 25, "Pictures" and
"Feedback"): stats' bars by layout, op and age and its RECLAIMABLE line, `prune --dry-run --summary`,
the scan's counting bar, `prune --broken` judging as ls does (`--deep` as verify does), and Ctrl-C
during a prune saying what was done. Through the real CLI, at 80 columns where width matters."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import CXX, REPO, patch_everywhere
from test_delete import gen
from test_fidelity import SOFTMAX, age, truncate_old

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import state

RELU = "ops/cpu_space_0/relu/31857fe085635b31"
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"
DAY = 86400


def age_tree(path: Path, seconds: float) -> None:
    for dirpath, dirs, files in os.walk(path):
        for n in files + dirs:
            age(Path(dirpath) / n, seconds)
    age(path, seconds)


def damaged_hidet(fixture_copy) -> Path:
    """The real hidet cache with relu partial (lib.so emptied), matmul unused for 40 days, a stale temp
    directory of a killed build and softmax truncated where only reading every byte tells."""
    root = fixture_copy("hidet")
    (root / RELU / "lib.so").write_bytes(b"")
    age_tree(root / MATMUL, 40 * DAY)
    temp = root / "ops/cpu_space_0/add/.kcache-tmp-deadbeefdeadbeef-1234"
    temp.mkdir(parents=True)
    (temp / "lib.so").write_bytes(b"x" * 5000)
    age_tree(temp, 2 * 3600)
    truncate_old(root, SOFTMAX)
    return root


# ---- stats: pictures and RECLAIMABLE -------------------------------------------------------------
def test_stats_draws_space_by_layout_op_and_age_within_80_columns(kcache, fixture_copy, monkeypatch):
    root = damaged_hidet(fixture_copy)
    monkeypatch.setenv("COLUMNS", "80")
    r = kcache("--cache-dir", root, "stats")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, r.stdout
    assert not any("\x1b" in line for line in lines)  # not a terminal: plain text, no colour
    heads = [line.split()[0] for line in lines if line.endswith("share")]
    assert heads == ["layout", "op", "last"]  # layout, op and age each with bars
    ages = {line.split()[0]: line for line in lines if line.split()[:1] in (["<1d"], ["<7d"], ["<30d"], ["older"])}
    assert list(ages) == ["<1d", "<7d", "<30d", "older"]
    assert ages["older"].split()[1] == "1" and "#" in ages["older"] and ages["<7d"].split()[1] == "0"
    assert ages["<30d"].rstrip().endswith("0%") and "#" not in ages["<30d"]


def _tables(text: str) -> dict[str, list[str]]:
    """stats' text as its tables, each header's first word -> the rows below it."""
    blocks = [b.splitlines() for b in text.split("\n\n") if b.strip()]
    return {b[0].split()[0]: b[1:] for b in blocks[1:] if not b[0].startswith("RECLAIMABLE")}  # (first: the root)


@pytest.mark.parametrize("name", ["tilelang", "numba", "torch_ext"])
def test_stats_prints_no_breakdown_that_no_entry_has(kcache, fixture_copy, name):
    """tilelang, Numba and torch extension entries have no op (Numba's and torch's no space): stats printed
    `op  entries  size  share` with no row under it, and a space table of `-` alone."""
    root = fixture_copy(name)
    r = kcache("--cache-dir", root, "stats", env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.stderr
    tables = _tables(r.stdout)
    assert "op" not in tables and all(rows for rows in tables.values()), r.stdout
    assert {"layout", "last", "status", "biggest"} <= set(tables), r.stdout
    if "space" in tables:
        assert {row.split()[0] for row in tables["space"]} != {"-"}, r.stdout


def test_stats_counts_entries_without_an_op_in_the_op_bars(kcache, fixture_copy):
    """A hidet graph has no op: its row `-` is in the op bars as it is in the space table, and the shares
    add up to the whole cache."""
    root = fixture_copy("hidet")
    graph = root / "graphs" / "0123456789abcdef"
    graph.mkdir(parents=True)
    (graph / "graph.hidet").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: hidet's format
    if all(e["op"] for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]):
        pytest.skip("this build's hidet layout lists no graph entries")
    tables = _tables(kcache("--cache-dir", root, "stats", env={"COLUMNS": "100"}).stdout)
    assert "-" in [row.split()[0] for row in tables["op"]], tables
    assert "-" in [row.split()[0] for row in tables["space"]], tables


def test_reclaimable_is_what_prune_broken_frees(kcache, fixture_copy):
    root = damaged_hidet(fixture_copy)
    stats = kcache("--cache-dir", root, "stats", "--json").json()
    plan = kcache("--cache-dir", root, "prune", "--broken", "--dry-run", "--json").json()
    assert stats["reclaimable"] == {"bytes": plan["freed"] + plan["trash"], "entry_count": plan["entry_count"],
                                    "command": "kcache prune --broken", "trash": plan["trash"]}
    # the partial relu and the stale temp directory; not softmax, broken only to a deep read
    assert {os.path.basename(r["removed_path"]) for r in plan["removed"]} == {"31857fe085635b31",
                                                                              ".kcache-tmp-deadbeefdeadbeef-1234"}
    temp = root / "ops/cpu_space_0/add/.kcache-tmp-deadbeefdeadbeef-1234"
    du = subprocess.run(["du", "-sB1", "-c", str(temp), str(root / RELU)], capture_output=True, text=True, check=True)
    assert stats["reclaimable"]["bytes"] == int(du.stdout.splitlines()[-1].split()[0])  # on disk (issue 32)
    assert set(stats) >= {"root", "entry_count", "size", "by_layout", "by_op", "by_space", "by_status", "biggest"}
    assert sum(v["size"] for v in stats["by_age"].values()) == stats["size"]
    assert stats["by_age"]["older"]["entry_count"] == 1
    text = kcache("--cache-dir", root, "stats").stdout
    assert [line for line in text.splitlines() if line.startswith("RECLAIMABLE")] == [
        "RECLAIMABLE  %s in 2 items (broken entries, stale temp files): kcache prune --broken"
        % human(stats["reclaimable"]["bytes"])]
    assert kcache("--cache-dir", root, "prune", "--broken", "--yes").exit_code == 0
    after = kcache("--cache-dir", root, "stats", "--json").json()
    assert after["reclaimable"]["bytes"] == 0 and after["reclaimable"]["entry_count"] == 0
    assert "RECLAIMABLE  nothing" in kcache("--cache-dir", root, "stats").stdout


def human(n: int) -> str:
    from kcache_cli.util.units import format_size

    return format_size(n)


# ---- prune --broken: cheap by default, --deep reads every byte ------------------------------------
def test_prune_broken_judges_as_ls_and_deep_as_verify(kcache, fixture_copy):
    root = damaged_hidet(fixture_copy)
    ls = {r["path"]: r["status"] for r in kcache("--cache-dir", root, "ls", "--json").json()["entries"]
          if not os.path.basename(r["path"]).startswith(".")}  # the temp directory is no entry
    cheap = kcache("--cache-dir", root, "prune", "--broken", "--dry-run", "--json").json()
    deep = kcache("--cache-dir", root, "prune", "--broken", "--deep", "--dry-run", "--json").json()
    cheap_paths = {r["path"] for r in cheap["removed"] if r["what"] == "entry"}
    assert cheap_paths == {p for p, s in ls.items() if s in ("partial", "failed", "corrupt")} == {str(root / RELU)}
    assert {r["path"] for r in deep["removed"] if r["what"] == "entry"} == {str(root / RELU), str(root / SOFTMAX)}
    r = kcache("--cache-dir", root, "prune", "--broken", "--deep", "--yes", "--json")
    assert r.exit_code == 0 and not (root / SOFTMAX).exists() and not (root / RELU).exists()


def test_deep_without_broken_is_a_usage_error(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "prune", "--deep")
    assert r.exit_code == 2 and "--deep goes with --broken" in r.stderr


def test_cheap_recheck_keeps_an_entry_finished_after_the_scan(fixture_copy):
    """Chosen as broken by the cheap judgement, judged again (cheaply) when removed: rebuilt whole by
    then, it stays."""
    from kcache_cli.ops.delete import plan_prune

    root = fixture_copy("hidet")
    lib = root / RELU / "lib.so"
    whole = lib.read_bytes()
    lib.write_bytes(b"")
    plan = plan_prune(root, broken=True, deep=False)
    assert [r.relpath for r in plan.removals] == [RELU] and not plan.deep
    lib.write_bytes(whole)
    os.utime(root / RELU, (0, 0))  # the directory's mtime as at the scan's: only the judgement tells
    result = plan.execute()
    assert not result.removed and (root / RELU).is_dir()
    assert "complete by now" in result.skipped[0].why


# ---- prune --dry-run --summary -----------------------------------------------------------------------
def test_prune_summary_groups_the_plan_by_space_and_op(kcache, tmp_path, monkeypatch):
    root = gen(tmp_path, 120)
    monkeypatch.setenv("COLUMNS", "80")
    full = kcache("--cache-dir", root, "prune", "--max-size", "0", "--dry-run", "--json").json()
    groups: dict[tuple, list[int]] = {}
    for r in full["removed"]:
        g = groups.setdefault((r["space"], r["op"]), [0, 0])
        g[0] += 1
        g[1] += r["size"]
    summary = kcache("--cache-dir", root, "prune", "--max-size", "0", "--dry-run", "--summary", "--json").json()
    assert {(g["space"], g["op"]): [g["entry_count"], g["size"]] for g in summary["summary"]} == groups
    assert [g["size"] for g in summary["summary"]] == sorted((g["size"] for g in summary["summary"]), reverse=True)
    text = kcache("--cache-dir", root, "prune", "--max-size", "0", "--dry-run", "--summary")
    lines = text.stdout.replace("\n  ", " ").splitlines()  # the total line, folded at 80 columns, as one
    assert lines[0].split() == ["target", "space", "op", "what", "entries", "size"]
    # a row per space and op, the biggest first, at most SUMMARY_ROWS of them and one row for the rest (a few
    # lines whatever the cache holds: cron mails it), then the total line
    from kcache_cli.cli.cmd_delete import SUMMARY_ROWS

    shown = min(len(groups), SUMMARY_ROWS)
    assert len(groups) > SUMMARY_ROWS and len(lines) == 1 + shown + 1 + 1
    assert lines[-2].split()[:3] == ["...", str(len(groups) - shown), "more"]
    assert lines[-1].startswith(f"Would remove {len(full['removed'])} entries")
    assert max(len(line) for line in lines[:-1]) <= 80
    assert sum(int(line.split()[-3]) for line in lines[1:-1]) == len(full["removed"])
    done = kcache("--cache-dir", root, "prune", "--max-size", "0", "--yes", "--summary")
    assert done.exit_code == 0, done.stderr
    done_lines = done.stdout.replace("\n  ", " ").splitlines()
    assert done_lines[1:] == lines[1:-1] + [done_lines[-1]]  # the same groups
    assert done_lines[-1].startswith(f"Removed {len(full['removed'])} entries")


@pytest.mark.skipif(CXX is None, reason="g++ not found")
def test_prune_summary_names_a_target_a_target_not_a_space(kcache, tmp_path):
    """An Inductor C++ code shard is target cpu in no space (ls --space cpu finds nothing): the summary
    said space=cpu; it has a target column (and key) of its own now."""
    root = tmp_path / "inductor"
    for shard in ("ab", "cd"):
        key = "c" + shard + "a" * 49
        (root / shard).mkdir(parents=True)
        (root / shard / f"{key}.cpp").write_text('extern "C" int f() { return 1; }\n')
        built = subprocess.run([CXX, "-shared", "-fPIC", "-x", "c++", str(root / shard / f"{key}.cpp"), "-o",
                                str(root / shard / f"{key}.so")], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr
    listed = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert {(e["kind"], e["target"], e["space"]) for e in listed} == {("code", "cpu", None)}
    doc = kcache("--cache-dir", root, "prune", "--max-size", "1B", "--dry-run", "--yes", "--summary", "--json").json()
    assert doc["summary"] == [{"target": "cpu", "space": None, "op": None, "what": "code", "entry_count": 2,
                               "size": sum(e["size"] for e in listed)}]
    text = kcache("--cache-dir", root, "prune", "--max-size", "1B", "--dry-run", "--yes", "--summary").stdout
    header, row = text.splitlines()[:2]
    assert header.split()[:2] == ["target", "space"] and row.split()[:4] == ["cpu", "-", "-", "code"]


# ---- the scan's counting bar -------------------------------------------------------------------------
class Counted:
    def __init__(self) -> None:
        self.totals: list[int] = []
        self.done = 0

    def start(self, total: int) -> None:
        self.totals.append(total)

    def advance(self, n: int) -> None:
        self.done += n


@pytest.mark.parametrize("parallel", [False, True])
def test_scan_counts_every_entry_found_and_judged(tmp_path, monkeypatch, parallel):
    import kcache_cli.catalog.scan_context as scan_context

    root = gen(tmp_path, 60)
    if parallel:  # the workers count in shared memory; this process moves the bar
        from kcache_cli.util import parallel as par

        monkeypatch.setattr(scan_context, "PARALLEL_MIN_JOBS", 2)
        monkeypatch.setattr(par, "cpus", lambda: 2)
    seen = Counted()
    result = scan_cache(root, progress=seen)
    assert len(result.entries) == 60
    assert seen.totals and seen.totals[-1] == 60 and seen.totals == sorted(seen.totals)
    assert seen.done == 60


def fake_terminal(monkeypatch) -> io.StringIO:
    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.delenv("NO_COLOR", raising=False)
    return tty


def test_the_scan_bar_counts_after_half_a_second_and_never_before(monkeypatch):
    from kcache_cli.cli import progress
    from kcache_cli.cli.common import GlobalOptions

    tty = fake_terminal(monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    threads = set(threading.enumerate())  # a test runner's worker may run some of its own
    with progress.scanning(GlobalOptions(), "scanning /c") as bar:
        bar.start(5)
        bar.advance(3)
        assert bar._progress is None and tty.getvalue() == ""  # a quick scan draws nothing
        clock[0] += progress.SCAN_DELAY
        bar.start(20_000)
        clock[0] += 1
        bar.advance(9_000)
        assert "judged 9,003 of 20,000 entries found" in tty.getvalue()
        assert set(threading.enumerate()) <= threads  # no refresh thread: scan workers may fork
    with progress.scanning(GlobalOptions(quiet=True), "scanning") as quiet:
        clock[0] += 10
        quiet.advance(1)
        assert quiet._progress is None


def test_the_scan_bar_says_1_entry_and_entries_for_the_rest(monkeypatch):
    """A terminal showed "judged 0 of 1 entries found": the count found takes its noun's number."""
    from kcache_cli.cli import progress
    from kcache_cli.cli.common import GlobalOptions

    tty = fake_terminal(monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    with progress.scanning(GlobalOptions(), "scanning /c") as bar:
        clock[0] += progress.SCAN_DELAY
        bar.advance(0)
        assert "judged 0 of ? entries found" in tty.getvalue()
        bar.start(1)
        assert "judged 0 of 1 entry found" in tty.getvalue()
        bar.start(2)
        clock[0] += 1
        bar.advance(1)
        assert "judged 1 of 2 entries found" in tty.getvalue()
    assert "1 entries" not in tty.getvalue()


def test_a_counting_bar_groups_its_digits_and_labels_its_time(monkeypatch):
    """`clear` and `export` drew "1486/8000 0:00:02" beside the scan's "judged 3,679 of 8,000 entries
    found": now "1,486 of 8,000" and "eta", as pip labels the time left."""
    from kcache_cli.cli import progress
    from kcache_cli.cli.common import GlobalOptions

    tty = fake_terminal(monkeypatch)
    with progress.Bar(GlobalOptions(), "removing") as bar:
        bar.start(8000)
        bar._drawn = 0.0  # redraw now
        bar.advance(1486)
        shown = tty.getvalue()
    assert "1,486 of 8,000" in shown and "eta" in shown and "1486/8000" not in shown, shown


def test_the_same_counts_elsewhere_take_their_nouns_number(tmp_path):
    """The pattern repeated: a damaged blob ("holds 1 artifacts"), an --op hint over the one cache left of
    several ("in 1 caches"); `remote stats` of an image and a pull that fills the disk are tested with their
    commands (test_remote_oci_qa.py, test_remote.py)."""
    from kcache_cli.catalog import names
    from kcache_cli.formats import megacache
    from kcache_cli.model.records import ScanFilter

    data = megacache.build([("inductor", "k", b"x" * 40)])
    header = 4 + 8 + 8 + len(base64.b64encode(b"inductor")) + 8  # CRC, version, the group's type and count
    problems = megacache.parse(data[:header + 10]).problems  # 1 artifact said, 10 bytes left to frame it
    assert "group 0 (inductor) says it holds 1 artifact, more than the 10 bytes left can frame" in problems[-1]
    root = tmp_path / "c"
    (root / "ops" / "cuda_space_0" / "add" / "8d1f7691cdf75e90").mkdir(parents=True)
    line = names.unknown_across([(root, ScanFilter(ops=("nonesuch",)))], "op", "nonesuch")
    assert line is not None and f"in {root}" in line and "1 caches" not in line


def test_prune_deep_counts_entries_read(fixture_copy, monkeypatch):
    from kcache_cli.ops.delete import plan_prune

    root = fixture_copy("hidet")
    scan, read = Counted(), Counted()
    plan_prune(root, broken=True, deep=True, progress=scan, judging=read)
    assert scan.done == 5 and read.totals == [5] and read.done == 5
    cheap = Counted()
    plan_prune(root, broken=True, deep=False, judging=cheap)
    assert cheap.totals == [] and cheap.done == 0  # the cheap judgement reads nothing more


# ---- Ctrl-C during prune ------------------------------------------------------------------------
SLOW_REMOVAL = """
import sys, time
import kcache_cli.ops.delete as d
real = d._Executor._remove
def slow(self, *a):
    time.sleep(0.004)  # fault injection: each removal takes a while, so a SIGINT lands mid-run
    return real(self, *a)
d._Executor._remove = slow
from kcache_cli.cli.app import main
main(sys.argv[1:])
"""


def count_entries(root: Path) -> int:
    return sum(1 for _ in root.glob("ops/*/*/*"))


@pytest.mark.parametrize("command, sig", [("prune", signal.SIGINT), ("clear", signal.SIGINT),
                                          ("prune", signal.SIGTERM)])
def test_ctrl_c_mid_removal_says_what_was_done(tmp_path, command, sig):
    """Ctrl-C, or SIGTERM (cron's timeout, systemd, docker stop: it killed kcache on the spot before), mid
    removal: what was removed is said, the rest is whole, exit 128 + the signal."""
    n = 400
    root = gen(tmp_path, n)
    size = sum(e.size for e in scan_cache(root).entries)
    what = ["prune", "--max-size", "0"] if command == "prune" else ["clear", "--all"]
    args = ["--cache-dir", str(root), *what, "--yes", "--json"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-c", SLOW_REMOVAL, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), env=env)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and count_entries(root) > n - 40:
        time.sleep(0.01)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err
    left = count_entries(root)
    assert 0 < left <= n - 40  # interrupted once 40 were gone: some removed, not all
    import json

    data = json.loads(out)
    assert data["interrupted"] is True and data["entry_count"] == n - left
    freed = data["freed"]
    assert freed == size - sum(e.size for e in scan_cache(root).entries)
    assert f"interrupted: removed {n - left:,} of {n:,} entries, {human(freed)}; nothing half-removed" in err
    assert "Traceback" not in err
    for e in scan_cache(root).entries:  # what is still there is whole
        assert e.status == "complete", (e.path, e.reason)
    r = subprocess.run([sys.executable, "-m", "kcache_cli", *args], capture_output=True, text=True,
                       cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr
    assert count_entries(root) == 0 and list(state.trash_dir(root).iterdir()) == []


def test_ctrl_c_while_planning_removes_nothing_and_says_so(kcache, fixture_copy, monkeypatch):
    import kcache_cli.ops.delete as delete

    root = fixture_copy("hidet")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    patch_everywhere(monkeypatch, delete, "plan_prune", interrupted)
    r = kcache("--cache-dir", root, "prune", "--max-size", "0", "--yes")
    assert r.exit_code == 130 and "interrupted: nothing was removed" in r.stderr
    assert count_entries(root) == 5
