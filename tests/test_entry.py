"""The console script while kcache starts (cli/entry.py): Ctrl-C, SIGTERM or SIGHUP before main's own handling
is in place ends kcache as one during a command does, exit 128 + the signal and no traceback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# A finder first on sys.meta_path that sends `sig` to the process when kcache's import reaches `target`:
# the handler in place then runs inside the import machinery, halfway through loading kcache.
_SIGNAL_AT = """import os, signal, sys
if {ignore}:
    signal.signal({sig}, signal.SIG_IGN)
class SignalAt:
    def find_spec(self, name, path=None, target=None):
        if name == {target!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), {sig})
        return None
sys.meta_path.insert(0, SignalAt())
"""


def _console_script() -> str:
    """What pip writes for pyproject's `kcache` script: import its function, exit with what it returns."""
    module, func = re.search(r'^kcache = "([\w.]+):(\w+)"$', PYPROJECT.read_text(), re.M).groups()
    return f"import re, sys\nfrom {module} import {func}\nsys.exit({func}())\n"


def _start(sig: int, target: str, *args: str, ignore: bool = False, main: str = "") -> subprocess.CompletedProcess:
    code = _SIGNAL_AT.format(sig=int(sig), target=target, ignore=ignore) + (main or _console_script())
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=_default_signals)


def _default_signals() -> None:
    """The signals the test sends at their defaults in the child: xdist ignores SIGINT, nohup SIGHUP."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("target", ["kcache_cli.cli.app", "typer", "kcache_cli.util.interrupts"])
def test_a_signal_while_kcache_loads_is_an_interrupt(sig, target):
    """Ctrl-C while the console script imported Typer and kcache's modules: Python's KeyboardInterrupt
    traceback, exit 130 (SIGTERM: killed by it, -15). Now `Error: interrupted`, 128 + the signal."""
    r = _start(sig, target, "--version")
    assert (r.returncode, r.stderr, r.stdout) == (128 + sig, "Error: interrupted\n", "")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_between_the_scripts_import_and_its_call_is_an_interrupt(sig):
    """pip's console script runs its own lines after `from kcache_cli.cli.entry import run` (a `re.sub` of
    argv[0] in older pip) before it calls run(): a signal there was a traceback (SIGTERM: killed)."""
    module, func = re.search(r'^kcache = "([\w.]+):(\w+)"$', PYPROJECT.read_text(), re.M).groups()
    main = f"import os, re, sys\nfrom {module} import {func}\nos.kill(os.getpid(), {int(sig)})\n" \
           f"sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\nsys.exit({func}())\n"
    r = _start(sig, "no.such.module", "--version", main=main)
    assert (r.returncode, r.stderr, r.stdout) == (128 + sig, "Error: interrupted\n", "")


def test_python_m_kcache_cli_takes_it_too():
    r = _start(signal.SIGTERM, "typer", "--json", "--version", main="import runpy\n"
               "runpy.run_module('kcache_cli', run_name='__main__')\n")
    assert (r.returncode, r.stderr) == (143, "Error: interrupted\n")
    assert r.stdout == '{"schema": "kcache/error/1", "error": "interrupted", "exit": 143}\n'


def test_a_signal_ignored_at_start_stays_ignored_while_kcache_loads():
    """`trap '' INT` or nohup: the signal, sent halfway through the import, changes nothing."""
    r = _start(signal.SIGINT, "typer", "--version", ignore=True)
    assert (r.returncode, r.stdout, r.stderr) == (0, "kcache 0.1.0\n", "")


@pytest.mark.parametrize("closed", [">&-", "2>&-", "<&-"])
def test_a_closed_standard_stream_is_no_traceback(fixture_copy, closed):
    """`kcache ls >&-`: Python leaves sys.stdout None, and every write was a traceback (exit 1); the
    descriptor is opened on /dev/null first, so the command runs (what it prints is dropped, as with
    `>/dev/null`) and no file kcache opens becomes a standard stream."""
    import shlex

    cache = fixture_copy("hidet")
    cmd = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "kcache_cli", "--cache-dir", str(cache), "ls"))
    r = subprocess.run(["sh", "-c", f"exec {cmd} {closed}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    if closed != ">&-":
        assert "8d1f7691cdf75e90" in r.stdout
