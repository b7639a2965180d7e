"""How a layout's entries sit in an OCI image (kcache_cli/remote/oci_image.py): `ImageFormat`, the
shape every layout gets (`io.<layout>.cache/`, `io.<layout>.manifest/manifest.json` holding kcache's
manifest, `cache.<layout>.image/*` labels with targets from kcache's records), which a layout's
`image_format()` subclasses where Red Hat MCV defines the image (Triton's and vLLM's, in their modules).

It reads records as the JSON dicts of kcache's archive manifest, so this floor imports nothing of the
archive or the remote."""

from __future__ import annotations

import json
from collections.abc import Iterable

from kcache_cli.formats.gpu import CPU  # a target every node runs: the GPU preflight passes it

MAX_META = 1 << 20  # bytes of a file read while the layer is written (a Triton kernel's metadata)


class ImageFormat:
    """kcache's own image shape for the layout `name`."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def prefix(self) -> str:
        """The entries' directory in the layer."""
        return f"io.{self.name}.cache/"

    @property
    def manifest_member(self) -> str:
        return f"io.{self.name}.manifest/manifest.json"

    @property
    def label_prefix(self) -> str:
        return f"cache.{self.name}.image/"

    def wants(self, name: str) -> bool:
        """Whether the file `name` (relpath/file) is read for `metadata` as the layer is written."""
        return False

    def metadata(self, name: str, data: bytes) -> dict | None:
        """The manifest record of one file the layer carries (MCV's per-kernel metadata), or None."""
        return None

    def manifest(self, records: list[dict], metadata: list[dict]) -> bytes | None:
        """manifest_member's bytes when it is not kcache's manifest."""
        return None

    def entry_count(self, records: list[dict], metadata: list[dict]) -> int:
        return len(records)

    def targets(self, records: list[dict], metadata: list[dict]) -> list[dict]:
        """The summary's targets, each once, sorted: from kcache's records (cuda: warp size 32; a CPU
        entry's arch is "cpu", warp size 1; an entry of unknown arch names none)."""
        seen = set()
        for r in records:
            if r.get("target") == CPU:
                seen.add((CPU, CPU, 1))
            elif r.get("arch"):
                seen.add((str(r.get("target") or ""), str(r.get("arch")), 32 if r.get("target") == "cuda" else 0))
        return unique_targets(seen)

    def labels(self, records: list[dict]) -> dict[str, str]:
        """Labels beyond MCV's three (vLLM's format, KServe's mount hints)."""
        return {}


def unique_targets(found: Iterable[tuple[str, str, int]]) -> list[dict]:
    return [{"backend": b, "arch": a, "warp_size": w} for b, a, w in sorted(set(found))]


def json_bytes(doc: object) -> bytes:
    """JSON as MCV writes its manifest (Go's json.MarshalIndent with two spaces)."""
    return json.dumps(doc, indent=2).encode()
