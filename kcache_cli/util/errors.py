"""The one error family of kcache: each error carries the exit code the CLI returns."""

from __future__ import annotations


class KcacheError(Exception):
    """An operational error: printed as one line `Error: ...`, exit 1."""

    exit_code = 1


class UsageError(KcacheError):
    """Bad input from the command line (unknown prefix, bad size...): exit 2."""

    exit_code = 2


class LockTimeout(KcacheError):
    """A lock held by another process did not come free in time: exit 3."""

    exit_code = 3

