"""kcache build --remote: a local hit is done; a remote hit is pulled; a miss is compiled, published
here, then pushed. The remote never fails a build: down, slow or refusing, it is one warning and the
build goes on locally."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from kcache_cli.layouts import builder
from kcache_cli.model.records import ScanFilter, Warn
from kcache_cli.model.terms import COMPLETE
from kcache_cli.ops import build as b
from kcache_cli.remote.pull import pull
from kcache_cli.remote.push import push
from kcache_cli.remote.store import CONNECT_TIMEOUT, open_store
from kcache_cli.util.errors import KcacheError

REMOTE_TIMEOUT = 10.0  # seconds the remote part of a build may take in all, by default


class RemoteBudget:
    """The time the remote part of one `build` command (every task's asking, pulling and pushing)
    may take in all: each remote phase runs under the store's deadline set to what is left."""

    def __init__(self, seconds: float = REMOTE_TIMEOUT) -> None:
        self.seconds = seconds
        self.spent = 0.0

    def left(self) -> float:
        return self.seconds - self.spent

    @contextlib.contextmanager
    def phase(self, store) -> Iterator[None]:
        start = time.monotonic()
        store.set_deadline(max(self.left(), 0.0))
        try:
            yield
        finally:
            store.set_deadline(None)
            self.spent += time.monotonic() - start


def _arch_refusal(want: str, target: str):
    """accept() for pull: an entry built for another arch would only make the build fail."""
    def accept(record: dict) -> str | None:
        have = [a.strip() for a in str(record.get("arch") or "").split(",") if a.strip()]
        if target == "cuda" and have and want not in have:
            return f"the remote's entry is built for {', '.join(have)}, not {want}"
        return None
    return accept


def build_with_remote(root: Path, task, options, url: str, *, source=None, listener=None, warn: Warn | None = None,
                      budget: RemoteBudget | None = None):
    """Build one task like build.build_task, consulting the remote at `url` within `budget`. Returns
    the BuildResult (a pulled entry is a hit, with a note saying so)."""
    warn = warn or (lambda m: None)
    root = Path(root).absolute()
    spec = task if isinstance(task, b.TaskSpec) else b.load_task(task, options, source)
    if not options.force and b.entry_status(str(root / spec.relpath))[0] == COMPLETE:
        return b.build_task(root, spec, options, listener=listener)  # a local hit: the remote is not asked
    budget = budget or RemoteBudget()
    store = _open(url, budget, warn)
    pulled = False
    if store is not None and not options.force:
        with budget.phase(store):
            pulled, reachable = _try_pull(root, store, spec, options, warn)
        if not reachable:  # one warning per build: the push would only fail the same way
            store.close()
            store = None
    result = b.build_task(root, spec, options, listener=listener)
    if pulled and result.status == b.HIT:
        result = result._replace(notes=(*result.notes, f"pulled {spec.relpath} from {store.url}"))
    if store is not None and result.status == b.BUILT:
        with budget.phase(store):
            _try_push(root, store, spec, warn)
    if store is not None:
        store.close()
    return result


def _open(url: str, budget: RemoteBudget, warn: Warn):
    if budget.left() <= 0:
        warn(f"remote not used: the remote part of this build took its --remote-timeout ({budget.seconds:g}s)")
        return None
    timeout = min(CONNECT_TIMEOUT, budget.seconds)
    try:
        return open_store(url, connect_timeout=timeout, io_timeout=budget.seconds, warn=warn)
    except KcacheError as exc:
        warn(f"remote not used: {exc}")
        return None


def _try_pull(root: Path, store, spec, options, warn: Warn) -> tuple[bool, bool]:
    """(pulled, the remote answered)."""
    try:
        want = b.resolve_arch(root, spec.target, options, fresh=False).value
        result = pull(root, store, ids=[(builder().name, spec.relpath)], accept=_arch_refusal(want, spec.target),
                      warn=warn)
    except KcacheError as exc:
        warn(f"remote not used, building locally: {exc}")
        return False, False
    except Exception as exc:  # noqa: BLE001 - a remote never fails a build, whatever it answers
        warn(f"remote not used, building locally: unexpected {type(exc).__name__} reading it")
        return False, False
    for e in result.entries:
        if e.action in ("refuse", "skip") and e.reason:
            warn(f"remote entry {e.relpath} not used: {e.reason}")
    return any(e.done for e in result.entries), True


def _try_push(root: Path, store, spec, warn: Warn) -> None:

    name = os.path.basename(spec.relpath)
    layout = builder()  # where kcache build publishes
    flt = ScanFilter(layouts=(layout.name,), kinds=(layout.shape.build_kind or "",), spaces=(spec.space,),
                     ops=(spec.op,), hash_prefixes=(name,))
    try:
        result = push(root, store, flt, warn=warn)
    except KcacheError as exc:
        warn(f"built locally; not pushed: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - a remote never fails a build, whatever it answers
        warn(f"built locally; not pushed: unexpected {type(exc).__name__}")
        return
    for e in result.entries:
        if e.action == "left out" and e.relpath == spec.relpath:
            warn(f"built locally; not pushed: {e.reason}")
