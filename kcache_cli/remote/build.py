"""kcache build --remote: a local hit is done; a remote hit is pulled; a miss is compiled, published
here, then pushed. The remote never fails a build: down, slow or refusing, it is one warning and the
build goes on locally."""

from __future__ import annotations

import os
from pathlib import Path

from kcache_cli.errors import KcacheError
from kcache_cli.model import ScanFilter, Warn
from kcache_cli.remote.store import CONNECT_TIMEOUT

IO_TIMEOUTS_PER_CONNECT = 5  # a build waits for one remote command 5 connect timeouts (10 s by default)


def _arch_refusal(want: str, target: str):
    """accept() for pull: an entry built for another arch would only make the build fail."""
    def accept(record: dict) -> str | None:
        have = [a.strip() for a in str(record.get("arch") or "").split(",") if a.strip()]
        if target == "cuda" and have and want not in have:
            return f"the remote's entry is built for {', '.join(have)}, not {want}"
        return None
    return accept


def build_with_remote(root: Path, task, options, url: str, *, source=None, listener=None, warn: Warn | None = None,
                      connect_timeout: float = CONNECT_TIMEOUT):
    """Build one task like build.build_task, consulting the remote at `url`. Returns the BuildResult
    (a pulled entry is a hit, with a note saying so)."""
    from kcache_cli import build as b
    from kcache_cli.terms import COMPLETE

    warn = warn or (lambda m: None)
    root = Path(root).absolute()
    spec = task if isinstance(task, b.TaskSpec) else b.load_task(task, options, source)
    if not options.force and b.entry_status(str(root / spec.relpath))[0] == COMPLETE:
        return b.build_task(root, spec, options, listener=listener)  # a local hit: the remote is not asked
    store = _open(url, connect_timeout, warn)
    pulled = False
    if store is not None and not options.force:
        pulled, reachable = _try_pull(root, store, spec, options, warn)
        if not reachable:  # one warning per build: the push would only fail the same way
            store.close()
            store = None
    result = b.build_task(root, spec, options, listener=listener)
    if pulled and result.status == b.HIT:
        result = result._replace(notes=(*result.notes, f"pulled {spec.relpath} from {store.url}"))
    if store is not None and result.status == b.BUILT:
        _try_push(root, store, spec, warn)
    if store is not None:
        store.close()
    return result


def _open(url: str, connect_timeout: float, warn: Warn):
    from kcache_cli.remote.store import open_store

    try:
        return open_store(url, connect_timeout=connect_timeout, io_timeout=connect_timeout * IO_TIMEOUTS_PER_CONNECT)
    except KcacheError as exc:
        warn(f"remote not used: {exc}")
        return None


def _try_pull(root: Path, store, spec, options, warn: Warn) -> tuple[bool, bool]:
    """(pulled, the remote answered)."""
    from kcache_cli import build as b
    from kcache_cli.layouts import builder
    from kcache_cli.remote.pull import pull

    try:
        want = b.resolve_arch(root, spec.target, options, fresh=False).value
        result = pull(root, store, ids=[(builder().name, spec.relpath)], accept=_arch_refusal(want, spec.target),
                      warn=warn)
    except KcacheError as exc:
        warn(f"remote not used, building locally: {exc}")
        return False, False
    for e in result.entries:
        if e.action in ("refuse", "skip") and e.reason:
            warn(f"remote entry {e.relpath} not used: {e.reason}")
    return any(e.done for e in result.entries), True


def _try_push(root: Path, store, spec, warn: Warn) -> None:
    from kcache_cli.remote.push import push

    from kcache_cli.layouts import builder

    name = os.path.basename(spec.relpath)
    layout = builder()  # where kcache build publishes
    flt = ScanFilter(layouts=(layout.name,), kinds=(layout.shape.build_kind or "",), spaces=(spec.space,),
                     ops=(spec.op,), hash_prefixes=(name,))
    try:
        result = push(root, store, flt, warn=warn)
    except KcacheError as exc:
        warn(f"built locally; not pushed: {exc}")
        return
    for e in result.entries:
        if e.action == "left out" and e.relpath == spec.relpath:
            warn(f"built locally; not pushed: {e.reason}")
