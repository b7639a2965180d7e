"""SIGTERM and SIGHUP as Ctrl-C: every command's unwinding cleans up after it (main takes them for each)."""

from __future__ import annotations

import signal
import sys
import threading

_LAST = [0]  # the signal TermAsInterrupt last took in this command (0: none)
_TAKEN = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class TermAsInterrupt:
    """While a command runs (main, and again export and build around their writes), SIGTERM and SIGHUP unwind
    it like Ctrl-C (temp files removed, the compilers it started stopped, locks let go): CI timeouts, `docker
    stop`, systemd and Kubernetes send SIGTERM, not SIGINT. Python runs a handler between any two bytecodes,
    inside a finalizer or an at-fork hook too, and those swallow what it raises: so the signal is also noted,
    `check()` raises it again before anything is published, and the interpreter's "Exception ignored" report
    of it is kept off stderr. Made and restored in the main thread (only it can install handlers; elsewhere
    it does nothing). Ctrl-C is taken the same way (it raises as Python's own handler does), so that an
    interrupt is known to have come even where C code swallowed what the handler raised (the import
    machinery does, for a module whose first attribute runs its code: util/lazy.py): see `taken`."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.old: dict = {}
        self.old_hook = sys.unraisablehook
        if threading.current_thread() is threading.main_thread():  # only it can install handlers
            # one ignored (SIG_IGN: `nohup`, a background job of a script) stays ignored
            self.old = {sig: signal.signal(sig, self._interrupt) for sig in _TAKEN
                        if signal.getsignal(sig) is not signal.SIG_IGN}
            sys.unraisablehook = self._unraisable

    def _interrupt(self, signum, _frame):
        self.got.append(signum)
        took(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    def _unraisable(self, info) -> None:
        if not (self.got and isinstance(info.exc_value, KeyboardInterrupt)):
            self.old_hook(info)

    def check(self) -> None:
        if self.got:
            raise KeyboardInterrupt(f"signal {self.got[0]}")

    def restore(self) -> None:
        for sig, h in self.old.items():
            signal.signal(sig, h)
        sys.unraisablehook = self.old_hook

    def __enter__(self) -> TermAsInterrupt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def exit_status() -> int:
    """The exit status of a command an interrupt ended: 128 + the signal, as a shell reports a process it
    ended (143 for a SIGTERM TermAsInterrupt took, 129 for a SIGHUP, 130 for Ctrl-C)."""
    return 128 + (_LAST[0] or int(signal.SIGINT))


def taken() -> bool:
    """Whether a handler took a signal to stop this command: an error that ends it afterwards is that
    interrupt, whatever it says (an ImportError of a module the interrupt left half-run, say)."""
    return _LAST[0] != 0


def took(signum: int) -> None:
    """A handler took `signum` to stop the command (exit_status says so)."""
    _LAST[0] = signum


def forget() -> None:
    """A new command starts (main runs many in one process in tests): no signal taken yet."""
    _LAST[0] = 0
