"""`kcache explain`: will the consumer here use an entry, an archive's entries or a blob's artifacts, and
if not, which recorded factor differs. "Here" is the Python that will run the model (`--python`, default
the `python3` on PATH), asked for its installed versions through importlib.metadata in a child process
(torch, Triton... are never imported, by it or by kcache), the GPU arch (`--gpu`, else nvidia-smi) and the
environment switches the layouts name. Each layout judges its own entries (`Layout.explain`); what a
layout cannot know is `unknown`, never `hit`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from kcache_cli import layouts
from kcache_cli.archive.importer import archive_records
from kcache_cli.archive.mega import SIDECAR_SUFFIX, mega_layouts, read_blob
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.formats.gpu import ARCH_RE, local_gpu_arch
from kcache_cli.fs import read as fsread
from kcache_cli.layouts.base import HIT, MISS, UNKNOWN, Here, Verdict
from kcache_cli.model.records import Entry
from kcache_cli.model.terms import unknown_layout
from kcache_cli.remote.oci_ops import other_arch
from kcache_cli.util import capped
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.signing import verifier

# Run as `python -c` in the user's current directory, which `-c` puts first on sys.path: it goes before any
# import, or a json.py (csv.py, email/...) another user left there would run as this user (root's cron).
_VERSIONS = """import sys
if sys.path[:1] in ([""], ["."]):
    del sys.path[0]
import json
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except Exception:
        out[name] = None
print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "versions": out}))
"""


def all_packages() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for lay in layouts.all_layouts().values() for p in lay.packages))


def _switches(names: Iterable[str]) -> dict[str, str]:
    out = {}
    for n in names:
        if n.endswith("*"):
            out.update({k: v for k, v in os.environ.items() if k.startswith(n[:-1])})
        elif n in os.environ:
            out[n] = os.environ[n]
    return dict(sorted(out.items()))


def probe(python: str | None, packages: Iterable[str] | None = None, gpu: str | None = None,
          ask_gpu: bool = True, timeout: float = 60.0) -> Here:
    """`Here` for the interpreter `python` (default: python3 on PATH)."""
    if gpu is not None and not ARCH_RE.match(gpu):
        raise UsageError(f"--gpu {gpu!r} is not a CUDA arch (sm_90a, sm_80...)")
    if python is not None and shutil.which(python) is None:  # a typo must not read as "unknown" everywhere
        raise UsageError(f"--python {python}: no such executable")
    pkgs = tuple(packages) if packages is not None else all_packages()
    exe = python or shutil.which("python3")
    env = _switches(s for lay in layouts.all_layouts().values() for s in lay.env_switches)
    found_gpu, source = (gpu, "--gpu") if gpu else (local_gpu_arch() if ask_gpu else None, "nvidia-smi")
    source = source if found_gpu else "none"
    if exe is None:
        return Here(None, None, {}, found_gpu, source, env, "no python3 on PATH (--python names one)")
    try:  # bounded: an interpreter that never answers, or prints without end, costs a wait and a buffer
        done = capped.ask([exe, "-c", _VERSIONS, *pkgs], timeout)
    except OSError as exc:
        return Here(None, exe, {}, found_gpu, source, env, f"{exe}: {exc.strerror or exc}")
    try:
        doc = json.loads(done.out.decode("utf-8").strip().splitlines()[-1]) if done.returncode == 0 else None
    except (ValueError, IndexError):  # not a Python, or one that printed something else (not UTF-8 too)
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("versions"), dict):
        return Here(None, exe, {}, found_gpu, source, env, f"{exe}: {_no_answer(done, timeout)}")
    versions = {k: v if isinstance(v, str) else None for k, v in doc["versions"].items()}
    return Here(str(doc.get("python")), str(doc.get("executable") or exe), versions, found_gpu, source, env)


def _no_answer(done: capped.Answer, timeout: float) -> str:
    """Why the interpreter gave no versions, in a few words (its own last line of stderr, escaped by callers)."""
    if done.timed_out:
        return f"no answer within {timeout:g}s"
    if done.too_much:
        return f"printed more than {capped.LIMIT >> 20} MiB, not an answer"
    said = done.err.decode("utf-8", "replace").strip().splitlines()
    return (said or ["no answer"])[-1][:200]


@dataclass
class Explained:
    """One entry or artifact and whether the consumer here would use it."""

    what: str  # the entry's relpath, or the artifact's key
    layout: str | None  # None: a blob's artifact of a type no layout takes
    kind: str
    path: str  # the entry's path, or the archive, blob or oci:// image it comes from
    verdict: Verdict
    # what tells it from the others in a table cut to the width (ls's columns); a blob artifact's key is its hash
    space: str | None = None
    op: str | None = None
    hash: str | None = None

    def to_json(self) -> dict:
        v = self.verdict
        return {"what": self.what, "layout": self.layout, "kind": self.kind, "path": self.path,
                "verdict": v.verdict, "factor": v.factor, "recorded": v.recorded, "here": v.here, "why": v.why}


@dataclass
class ExplainResult:
    """The verdicts of `kcache explain`, with what this machine is (Here)."""

    here: Here
    items: list[Explained] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(i.verdict.verdict == verdict for i in self.items)

    def to_json(self) -> dict:
        h = self.here
        return {"schema": "kcache/explain/1",
                "here": {"python": h.python, "executable": h.executable, "versions": dict(h.versions), "gpu": h.gpu,
                         "gpu_source": h.gpu_source, "env": dict(h.env), "problem": h.problem},
                "items": [i.to_json() for i in self.items],
                "hit": self.count(HIT), "miss": self.count(MISS), "unknown": self.count(UNKNOWN)}


def explain_root(root: Path, here: Here, entries: Iterable[Entry] | None = None) -> list[Explained]:
    """Every entry of the cache at `root` (or `entries`, found in it), each judged by its layout."""
    out = []
    for e in entries if entries is not None else scan_cache(root).entries:
        lay = layouts.get(e.layout)
        rel = os.path.relpath(e.path, root)
        out.append(Explained(rel, e.layout, e.kind, e.path, lay.explain(root, e, here), e.space, e.op, e.hash))
    return out


def explain_blob(path: str, here: Here) -> list[Explained]:
    """Each artifact torch's load would write from the blob, judged by its layout from the sidecar
    (`<blob>.kcache.json`, kcache export's) when there is one; a damaged blob is a miss for all."""
    data, blob = read_blob(path)
    try:
        side = fsread.parse_json(fsread.read_bytes(path + SIDECAR_SUFFIX, fsread.MAX_JSON, follow=True))
    except (OSError, ValueError):
        side = None
    recorded = side if isinstance(side, dict) else {}
    other = bool(recorded) and recorded.get("sha256") != hashlib.sha256(data).hexdigest()
    places = mega_layouts()
    out = []
    for a in blob.artifacts:
        lay = places.get(a.type)
        if blob.state != "ok" or lay is None:
            why = blob.problems[0] if blob.problems else f"no layout takes {a.type} artifacts"
            v = Verdict(MISS, f"torch loads nothing of this blob: {why}", "blob", blob.state, "ok")
        elif a.group in blob.shadowed():
            v = Verdict(MISS, "a later group of its type replaces it when torch loads the blob", "group", str(a.group),
                        "the last of its type")
        elif other:  # a sidecar left beside another blob: what it records is not this blob's
            v = Verdict(UNKNOWN, f"{os.path.basename(path)}{SIDECAR_SUFFIX} describes another blob (its sha256 "
                        "differs): nothing recorded to judge this one by")
        else:
            v = lay.explain_mega(a.type, recorded, here)
        out.append(Explained(a.key, lay.name if lay else None, a.type, os.path.abspath(path), v, hash=a.key))
    return out


def explain_archive(path: str, here: Here) -> list[Explained]:
    """Each entry of a kcache archive, judged by its layout from its manifest record (the compiler and
    arch export recorded); nothing but the manifest is read."""
    return explain_records(archive_records(path), here, os.path.abspath(path))


def explain_image(records: list[dict], here: Here, url: str) -> list[Explained]:
    """Each entry of an oci:// image kcache pushed, from its manifest `records`, as `kcache pull` writes it:
    pull rewrites the paths an entry records (Triton's group files, vLLM's handles), which the layer holds as
    they were where it was pushed from, so a mount of the image as it is (KServe, GKM) misses what pull hits."""
    # pull checks the signatures of the entries it keeps for the GPU here, not of those it leaves out for theirs
    kept = [here.gpu is None or unknown_layout(rec.get("layout")) is not None
            or other_arch(rec, [here.gpu], str(rec.get("layout"))) is None for rec in records]
    out = explain_records(records, here, url, "pull", "image", kept)
    for i in out:
        lay = layouts.get(i.layout) if i.layout else None
        if lay is not None and i.verdict.verdict != MISS and lay.records_paths(i.kind):
            i.verdict = i.verdict._replace(why=f"{i.verdict.why}; once kcache pull has rewritten the paths it "
                                           f"records: mounted from the image as it is, {i.layout} misses it")
    return out


def explain_records(records: list[dict], here: Here, where: str, taker: str = "import",
                    whole: str = "archive", kept: list[bool] | None = None) -> list[Explained]:
    """Each entry record (an archive's or an image's manifest: what its export recorded), judged by its
    layout; `where` names the archive or image they come from, which `taker` (import, pull) takes whole or
    refuses: with a trust list set, one record no listed key signed makes every entry a miss (of those
    records `kept`, when the taker leaves some out unread: pull, those of other archs)."""
    refused = _refused(records, taker, whole, kept or [True] * len(records))
    out = []
    for rec, no in zip(records, refused):
        unknown = unknown_layout(rec.get("layout"))
        name = None if unknown else str(rec.get("layout"))  # (the schema's null: no layout kcache knows)
        if no:
            v = Verdict(MISS, no)
        elif name is None:
            v = Verdict(UNKNOWN, f"{unknown}: this kcache does not know it")
        else:
            v = layouts.get(name).explain_record(rec, here)
        space, op, key = (value if isinstance(value := rec.get(f), str) and value else None
                          for f in ("space", "op", "hash"))
        out.append(Explained(str(rec.get("relpath")), name, str(rec.get("kind") or "-"), where, v, space, op, key))
    return out


def _refused(records: list[dict], taker: str, whole: str, kept: list[bool]) -> list[str | None]:
    """Why `taker` would refuse each record for the trust list (kcache_cli/util/signing.py), or None for
    each when it takes them: it takes the `whole` (archive, image) only when a listed key signed every one
    it keeps."""
    try:
        check = verifier()
    except KcacheError as exc:  # a trust list that lists no key: nothing is taken
        return [f"{taker} refuses it: {exc}"] * len(records)
    own = [check.problem(rec) if keep else None for rec, keep in zip(records, kept)] if check is not None else []
    first = next(((rec, why) for rec, why in zip(records, own) if why), None)
    if first is None:
        return [None] * len(records)
    return [f"{taker} refuses it: {why}" if why else
            f"{taker} refuses the whole {whole}: its entry {first[0].get('relpath')} is refused ({first[1]})"
            for why in own]
