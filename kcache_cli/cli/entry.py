"""The console script's entry (and `python -m kcache_cli`'s): Ctrl-C, SIGTERM or SIGHUP while kcache is still
starting (loading Typer and its own modules, a tenth of a second) ends it as one during a command does, exit
128 + the signal and `Error: interrupted`, not Python's KeyboardInterrupt traceback. Its handlers are in place
before anything else loads; main's TermAsInterrupt takes over from them for the command."""

from __future__ import annotations

import sys

# the interpreter's own, loaded before any script: `signal` builds its enums first, a millisecond without handlers
import _signal  # type: ignore[import-not-found]  # (typeshed has no stub for it)

_GOT: list[int] = []  # the signals taken while kcache started (or after main gave them back)


def _stop(signum: int, _frame: object) -> None:
    _GOT.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


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
        import json

        # options.schema_id("error"): options itself may be what the interrupt left half loaded
        doc = {"schema": "kcache/error/1", "error": "interrupted", "exit": code}
        sys.stdout.write(json.dumps(doc) + "\n")
    sys.exit(code)


def run() -> None:
    """Take SIGINT, SIGTERM and SIGHUP (each one not ignored at start: `nohup`, a script's background job),
    then load the app and run it. C code may swallow what _stop raised (the import machinery does), so a
    signal taken shows after the import too, and an error that follows one is that interrupt."""
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(sig) != _signal.SIG_IGN:
            _signal.signal(sig, _stop)
    sys.unraisablehook = _unraisable
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
