"""The names closest to one typed wrong ("did you mean matmul?"): one rule, difflib's ratio of at least
CUTOFF, for ops, spaces and targets present in a cache, the entries a lookup nearly named, and an option's
fixed choices. Loaded where a hint is made (lazy_module): difflib costs every command nothing otherwise."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from kcache_cli.util.errors import UsageError

CUTOFF = 0.6


def closest(value: str, names: Iterable[str], n: int = 2) -> list[str]:
    """At most `n` of `names` close to `value`, closest first."""
    return difflib.get_close_matches(value, list(names), n=n, cutoff=CUTOFF)


def did_you_mean(names: Iterable[str]) -> str:
    """"; did you mean a or b?" naming `names`, "" when there are none."""
    said = list(names)
    return f"; did you mean {' or '.join(said)}?" if said else ""


def unknown_choice(what: str, value: str, allowed: Iterable[str]) -> UsageError:
    """The usage error for a `value` of `what` outside `allowed`: the closest choices first ("did you
    mean complete?"), then every choice."""
    choices = list(allowed)
    return UsageError(f"unknown {what} '{value}'{did_you_mean(closest(value, choices))} "
                      f"(choose from {', '.join(choices)})")
