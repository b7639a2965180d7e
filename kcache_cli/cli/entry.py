"""The console script's entry (and `python -m kcache_cli`'s): Ctrl-C, SIGTERM or SIGHUP while kcache is still
starting (loading Typer and its own modules, a tenth of a second) ends it as one during a command does, exit
128 + the signal and `Error: interrupted`, not Python's KeyboardInterrupt traceback. Its handlers are in place
as soon as this module is loaded (the first of kcache's code a console script runs: what the script does
before it calls run(), such as pip's own `re.sub` of argv[0], is covered too); main's TermAsInterrupt takes
over from them for the command."""

from __future__ import annotations

import os  # loaded by the interpreter before any script: no cost
import sys

# the interpreter's own, loaded before any script: `signal` builds its enums first, a millisecond without handlers
import _signal  # type: ignore[import-not-found]  # (typeshed has no stub for it)

_GOT: list[int] = []  # the signals taken while kcache started (or after main gave them back)
_RAISING: list[bool] = []  # run() has begun: a signal stops what is loading (before, the script's own code)


def _stop(signum: int, _frame: object) -> None:
    """Note the signal; inside run(), stop what runs (the import of the app). Before run() (the console
    script's own lines after its import) it is only noted: run() ends at once with it."""
    _GOT.append(signum)
    if _RAISING:
        raise KeyboardInterrupt(f"signal {signum}")


def _take() -> None:
    """SIGINT, SIGTERM and SIGHUP, each one not ignored at start (`nohup`, a script's background job)."""
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(sig) != _signal.SIG_IGN:
            _signal.signal(sig, _stop)
    sys.unraisablehook = _unraisable


def _unraisable(info) -> None:
    """What a finalizer swallowed of _stop's KeyboardInterrupt is not reported: the import's check says it."""
    if not (_GOT and isinstance(info.exc_value, KeyboardInterrupt)):
        sys.__unraisablehook__(info)


def _interrupted(signum: int) -> None:
    """`Error: interrupted` (under --json also the error document main writes), exit 128 + the signal."""
    code = 128 + signum
    sys.stderr.write("Error: interrupted\n")
    args = sys.argv[1:]
    if "--json" in (args[:args.index("--")] if "--" in args else args):
        # the error document main writes (options.schema_id("error"): options itself may be what the
        # interrupt left half loaded), as json.dumps writes it: nothing to load on the way out
        sys.stdout.write(f'{{"schema": "kcache/error/1", "error": "interrupted", "exit": {code}}}\n')
    sys.exit(code)


def run() -> None:
    """Load the app and run it, the signals taken since this module loaded (_take). C code may swallow what
    _stop raised (the import machinery does), so a signal taken shows after the import too, and an error
    that follows one is that interrupt."""
    if _GOT:  # between this module's load and this call
        _interrupted(_GOT[0])
    _RAISING.append(True)
    try:
        from kcache_cli.cli import app

        if _GOT:
            raise KeyboardInterrupt
        app.run()
    except KeyboardInterrupt:
        _interrupted(_GOT[0] if _GOT else _signal.SIGINT)
    except Exception:
        if not _GOT:
            raise
        _interrupted(_GOT[0])


def _standard_fds() -> None:
    """A standard stream the caller closed (`kcache ls >&-`, a daemon's child) is opened on /dev/null: Python
    leaves sys.stdout None (every write a traceback), and the descriptor would be the next file kcache opens,
    so that a print, or a compiler's output, lands in a cache file. What was to go there is dropped, as
    with `>/dev/null`."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one, the lower ones open
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


_standard_fds()  # at load, before anything is opened
_take()  # at load: the first of kcache's code the console script runs
