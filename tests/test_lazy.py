"""kcache_cli/util/lazy.py: a command module names the engines it uses at its top, and they run at
their first use (help and a TAB declare commands without loading them)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from kcache_cli.util.lazy import lazy_module


def _package(tmp_path):
    pkg = tmp_path / "lzpkg"
    (pkg / "heavy").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy" / "__init__.py").write_text("import sys\nsys.ran = getattr(sys, 'ran', []) + ['heavy']\n")
    (pkg / "heavy" / "mod.py").write_text("import sys\nsys.ran = getattr(sys, 'ran', []) + ['mod']\nVALUE = 42\n")
    return tmp_path


def test_nothing_runs_until_an_attribute_is_read(tmp_path):
    code = ("import sys\nfrom kcache_cli.util.lazy import lazy_module\n"
            "m = lazy_module('lzpkg.heavy.mod')\nprint(getattr(sys, 'ran', []))\n"
            "print(m.VALUE, sys.ran)\nprint(lazy_module('lzpkg.heavy.mod') is m, sys.modules['lzpkg.heavy'].mod is m)")
    out = subprocess.run([sys.executable, "-c", code], cwd=_package(tmp_path), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["[]", "42 ['mod']", "True True"]  # the package's own __init__ ran at neither step


def test_threads_reading_a_module_first_at_once_all_wait_for_it(tmp_path, monkeypatch):
    """The first attribute read runs the module's code once, and the other threads reading meanwhile wait
    for it to end (Python 3.11's LazyLoader gave them the half-run module: a scan's worker threads hashing
    their first files at once failed with "module 'hashlib' has no attribute 'sha256'")."""
    import threading

    (tmp_path / "lzslow.py").write_text("import sys, time\nsys.lzslow_runs = getattr(sys, 'lzslow_runs', 0) + 1\n"
                                        "time.sleep(0.3)\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lzslow", raising=False)
    mod = lazy_module("lzslow")
    start = threading.Barrier(4)
    got: list = []

    def read() -> None:
        start.wait()
        try:
            got.append(mod.VALUE)
        except AttributeError as exc:
            got.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert got == [42] * 4 and sys.lzslow_runs == 1  # type: ignore[attr-defined]
    finally:
        sys.modules.pop("lzslow", None)
        if hasattr(sys, "lzslow_runs"):
            del sys.lzslow_runs


def test_an_imported_module_is_returned_as_it_is():
    import json

    assert lazy_module("json") is json


def test_a_missing_module_is_an_import_error():
    try:
        lazy_module("kcache_cli.no_such_module_here")
    except ModuleNotFoundError as exc:
        assert exc.name == "kcache_cli.no_such_module_here"
    else:
        raise AssertionError("no error")


def test_any_module_of_kcache_may_be_the_first_one_loaded():
    """Command modules name their engines lazily: whichever module is read first loads, its package found
    but not run, and never meets itself half loaded when a sibling it imports runs the package (archive's
    __init__ imported its modules: `verify`, then `explain`, in one process failed)."""
    code = r'''
import os, pkgutil, sys
import kcache_cli
from kcache_cli.util.lazy import lazy_module
packages = [m.name for m in pkgutil.iter_modules(kcache_cli.__path__, "kcache_cli.")
            if m.ispkg and m.name != "kcache_cli.cli"]
failed = []
for pkg in packages:
    path = [os.path.join(kcache_cli.__path__[0], pkg.rsplit(".", 1)[1])]
    mods = [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(path)]
    for first in mods:
        pid = os.fork()
        if pid == 0:
            try:
                lazy_module(first).__name__  # its package found, not run; its code runs now
                os._exit(0)
            except BaseException as exc:
                print(first, type(exc).__name__, exc, flush=True)
                os._exit(1)
        if os.waitpid(pid, 0)[1]:
            failed.append(first)
print("FAILED", failed, len(packages))
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1].startswith("FAILED []"), out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupt_while_a_lazy_module_runs_is_the_interrupt(kcache, tmp_path, monkeypatch, sig):
    """A signal while a lazy module's code ran (import's first use of the archive engines): the import
    machinery swallowed the KeyboardInterrupt the handler raised and the next `from X import Y` found X
    half run: `Error: unexpected ImportError: cannot import name ...`, exit 1. It is the interrupt: exit
    128 + the signal. The module below sends the signal to itself halfway through its code."""
    from kcache_cli.cli import cmd_archive

    (tmp_path / "kc_halfway.py").write_text(f"import os\nos.kill(os.getpid(), {int(sig)})\nNAME = 1\n")
    (tmp_path / "kc_engine.py").write_text("from kc_halfway import NAME\n\n\ndef import_archive(*a, **k):\n"
                                           "    return NAME\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "cache").mkdir()
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # (xdist's workers ignore SIGINT)
    ignored = signal.getsignal(sig) == signal.SIG_IGN  # (under nohup, SIGHUP): kcache would rightly keep it so
    if ignored:
        signal.signal(sig, signal.SIG_DFL)
    try:
        lazy_module("kc_halfway")  # named lazily first, as the command modules name their engines
        monkeypatch.setattr(cmd_archive, "importer", lazy_module("kc_engine"))
        r = kcache("--cache-dir", tmp_path / "cache", "import", tmp_path / "a.tar")
    finally:
        signal.signal(signal.SIGINT, old)
        if ignored:
            signal.signal(sig, signal.SIG_IGN)
        for name in ("kc_halfway", "kc_engine"):
            sys.modules.pop(name, None)
    assert (r.exit_code, r.stderr) == (128 + sig, "Error: interrupted\n"), r.stderr


def test_a_signal_ignored_at_start_stays_ignored():
    """`nohup kcache ...` (SIGHUP ignored) or a script's background job (SIGINT ignored): kcache's handler,
    which unwinds the command, is not put in place of what the caller asked for."""
    from kcache_cli.util.interrupts import TermAsInterrupt

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with TermAsInterrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)
