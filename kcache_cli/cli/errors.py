"""Turning an exception that escaped a command into one line and an exit status."""

from __future__ import annotations

import errno
import os
import stat
import sys

from typing import TYPE_CHECKING

from kcache_cli.cli.typer_compat import click_exceptions
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:
    from kcache_cli.util import suggest
else:
    suggest = lazy_module("kcache_cli.util.suggest")  # difflib: loaded by a mistake only


def describe_exception(exc: BaseException) -> tuple[str, int]:
    click_exc = click_exceptions()

    if isinstance(exc, click_exc.UsageError):
        ctx = exc.ctx
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        said = exc.format_message()
        if isinstance(exc, click_exc.NoSuchOption) and exc.possibilities:  # as every did-you-mean of kcache's
            said = exc.message + suggest.did_you_mean(exc.possibilities)  # (click's: "(Possible options: ...)")
        return said + where, exc.exit_code
    if isinstance(exc, click_exc.ClickException):
        return exc.format_message(), exc.exit_code
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename or exc}", 1
    if isinstance(exc, OSError):
        target = f": {exc.filename}" if exc.filename else ""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and not exc.filename and _stdout_full():
            return f"cannot write the output: {exc.strerror or exc} (standard output)", 1  # `ls > /dev/full`
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # kcache writes through temp files it publishes whole
            target += ("; what was being written is not published (each entry is whole or not there); free "
                       "space and run the command again")
        return f"{exc.strerror or exc}{target}", 1
    return f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", 1


def _stdout_full() -> bool:
    """Whether standard output is what has no space left: a file on a full file system, or /dev/full. (A
    write of kcache's own, to a temp file, fails the same way and names no file either; a failed flush
    keeps nothing to try again with.)"""
    try:
        st = os.fstat(sys.stdout.fileno())
        if stat.S_ISCHR(st.st_mode):
            return (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 7)  # /dev/full
        return stat.S_ISREG(st.st_mode) and os.fstatvfs(sys.stdout.fileno()).f_bavail == 0
    except (OSError, ValueError, AttributeError):  # closed, or not a real file (tests)
        return False


def is_usage_error(exc: BaseException) -> bool:
    """A mistake on the command line (bad option, missing argument...): one line even under --debug."""
    return isinstance(exc, click_exceptions().UsageError)


def no_args_help(exc: BaseException) -> str | None:
    """For a bare `kcache`: the help text still to print ('' when Rich has printed it), else None."""
    if not isinstance(exc, click_exceptions().NoArgsIsHelpError):
        return None
    text = exc.format_message()
    return text if not text or text.endswith("\n") else text + "\n"
