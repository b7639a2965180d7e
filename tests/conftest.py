"""Shared test helpers: copies of the real fixture caches, running the CLI in-process, compilers."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "real"
# The samples as shared with the project (tilus links flattened into files); tests that care use them.
SHARED_FIXTURES = Path(os.environ.get("KCACHE_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures" / "real"))

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.access("/usr/local/bin/nvcc", os.X_OK) else None)
CXX = shutil.which("g++")

# pytest imports readline at start (_pytest/capture.py), and GNU readline on a terminal exports LINES and
# COLUMNS into the C environment: os.environ does not show them, but every kcache a test starts inherits
# them and folds its stderr to 80 columns. Only a width the developer exported (os.environ) stays.
for _var in ("COLUMNS", "LINES"):
    if _var not in os.environ:
        os.unsetenv(_var)

from oci_registry import DOCKER_REGISTRY, SKOPEO, oci_registry  # noqa: E402, F401 - a real OCI registry
from redis_server import REDIS_SERVER, redis_server  # noqa: E402, F401 - the remote tests' real redis-server

# Why a test was skipped -> what the run's summary says loudly (the reasons below are the skips' own words).
# The summary reads the skip reports, so it works where tests run in xdist's worker processes too.
LOUD = {
    "nvcc not found": ("NVCC MISSING", "tests that compile CUDA with nvcc were SKIPPED: nothing proved that kcache "
                       "builds CUDA kernels on this machine."),
    "redis-server not found": ("REDIS-SERVER MISSING", "tests that need a real redis-server were SKIPPED: nothing "
                               "proved that push, pull and build --remote work against Redis "
                               "(apt-get install redis-server)."),
    "not root: this test runs an attacker": ("NOT ROOT", "shared-cache attack tests were SKIPPED: they need root to "
                                             "run the attacker as a second user (uid 65534); nothing proved that a "
                                             "co-user cannot make kcache write outside a group-shared cache."),
    "loader oracle venv": ("LOADER ORACLE SKIPPED", "loader oracle runs were SKIPPED: nothing proved that kcache's "
                           "statuses agree with these real loaders (python tests/loaders/venvs.py --all):"),
    "docker-registry or skopeo not found": ("DOCKER-REGISTRY/SKOPEO MISSING", "tests that need a real OCI "
                                            "registry were SKIPPED: nothing proved that push, pull and remote "
                                            "ls/prune work against a registry (apt-get install docker-registry "
                                            "skopeo)."),
    "strace not": ("STRACE MISSING", "tests that count kcache's system calls under strace were SKIPPED: nothing "
                   "proved that reads below a held cache root go through its fd (apt-get install strace)."),
    "SKIPPED LOUDLY": ("SKIPPED LOUDLY", "tests could not exercise what they are for:"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not NVCC and item.get_closest_marker("nvcc"):
            item.add_marker(pytest.mark.skip(reason="nvcc not found: this test compiles CUDA for real"))
        if not REDIS_SERVER and item.get_closest_marker("redis"):
            item.add_marker(pytest.mark.skip(reason="redis-server not found: this test needs a real Redis"))
        if not (DOCKER_REGISTRY and SKOPEO) and item.get_closest_marker("oci"):
            item.add_marker(pytest.mark.skip(reason="docker-registry or skopeo not found: this test needs a real "
                                             "OCI registry"))
        if os.geteuid() != 0 and item.get_closest_marker("second_user"):
            item.add_marker(pytest.mark.skip(reason="not root: this test runs an attacker as a second user"))


def pytest_runtest_setup(item):
    from loaders import venvs

    venvs.SLOW_TIER[0] = item.get_closest_marker("slow") is not None


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    reasons = [_skip_reason(r) for r in tr.stats.get("skipped", [])]
    for needle, (title, what) in LOUD.items():
        found = [r for r in reasons if needle in r]
        if not found:
            continue
        tr.write_sep("!", title, red=True, bold=True)
        tr.write_line(f"{len(found)} {what}", red=True, bold=True)
        if needle in ("loader oracle venv", "SKIPPED LOUDLY"):
            for why in sorted(set(found)):
                tr.write_line(f"  {why[:300]}", red=True)
        tr.write_sep("!", red=True, bold=True)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """No test sees the developer's caches or hidet config: HOME is a fresh directory, no KCACHE_DIR,
    and the working directory is outside any git tree."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KCACHE_DIR", raising=False)
    monkeypatch.delenv("TILELANG_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_HOME", raising=False)
    # Inductor's, vLLM's and the CUDA driver's caches: their defaults lie under HOME or the temp dir
    for var in ("TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "CUDA_CACHE_PATH",
                "XDG_CONFIG_HOME", "KCACHE_CONFIG"):  # and kcache's own config (a budget prune would keep)
        monkeypatch.delenv(var, raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("COLUMNS", raising=False)  # tables fit COLUMNS when set: tests that want a width say so
    monkeypatch.chdir(tmp_path)



@pytest.fixture(autouse=True)
def _no_thread_left():
    """A test leaves no thread of its own running: in a process that runs another thread, every later
    scan and export in it reads without forked workers (parallel.fork_safe), and the tests of the
    parallel path would fail far from the leak. A thread gets a few seconds to end."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for thread in left:
        thread.join(timeout=5)
    still = [t.name for t in left if t.is_alive()]
    assert not still, f"the test left threads running: {', '.join(still)}"

def make_writable(path: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, os.lstat(p).st_mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if n in dirnames else 0))


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    make_writable(dst)
    return dst


@pytest.fixture
def fixture_copy(tmp_path):
    """fixture_copy("hidet") -> a private, writable copy of that real cache in tmp_path."""

    def make(name: str, dest: str | None = None, shared: bool = False) -> Path:
        src = (SHARED_FIXTURES if shared else FIXTURES) / name
        if not src.is_dir():
            pytest.skip(f"fixture {src} not found")
        return copy_tree(src, tmp_path / (dest or f"cache-{name}"))

    return make


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        import json

        return json.loads(self.stdout)


def run_kcache(*args: str, input: str | None = None, env: dict | None = None) -> Run:
    """Run `kcache ARGS` in-process through the real entry point (error handling included)."""
    from typer.testing import CliRunner

    from kcache_cli.cli.app import main

    runner = CliRunner()
    with runner.isolation(input=input, env=env) as (out, err, _):
        code = 0
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    return Run(code, stdout, stderr)


@pytest.fixture
def kcache():
    return run_kcache


def fake_python(tmp_path: Path, package: str, version: str | None, python: str = "3.11.7") -> str:
    """An executable that answers explain's question (--python) as a Python `python` with `package` at
    `version` (None: not installed) would."""
    import json

    exe = tmp_path / f"python-{python}-{package}-{version}"
    doc = {"python": python, "executable": str(exe), "versions": {package: version}}
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(doc)}\nEOF\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.fixture
def stress_seed(request):
    """The seed of a stress test's random choices: KCACHE_STRESS_SEED=N replays a run; printed either way
    (pytest shows it with a failure's captured output)."""
    raw = os.environ.get("KCACHE_STRESS_SEED")
    seed = int(raw) if raw else int.from_bytes(os.urandom(4), "little")
    print(f"{request.node.nodeid}: KCACHE_STRESS_SEED={seed}")
    return seed


@pytest.fixture
def area():
    """A directory in /tmp that other users (a co-user, a group member, an outsider) can reach (pytest's own
    are 0700), removed at the end, relative to its parent's fd (it may hold links another user planted)."""
    import tempfile

    from kcache_cli.fs import delete as fsdelete

    d = Path(tempfile.mkdtemp(prefix="kcache-users-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    fd = os.open(d.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsdelete.remove_tree(fd, d.name)
    finally:
        os.close(fd)


def patch_everywhere(monkeypatch, module, name: str, new) -> None:
    """`module.name = new`, and the same in every kcache_cli module that imported the original by name
    (`from module import name` binds it at the importer's top). Every command's module is loaded first:
    a run loads only its own, later, and would bind the original."""
    from kcache_cli.cli.app import full_app

    full_app()
    real = getattr(module, name)
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("kcache_cli") and getattr(mod, name, None) is real:
            monkeypatch.setattr(mod, name, new)
