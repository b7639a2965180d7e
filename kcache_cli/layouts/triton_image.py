"""Triton's image in MCV's compat layout (redhat-et/GKM mcv/pkg/cache/triton.go): the cache under
`io.triton.cache/`, MCV's manifest `{"triton": [metadata...]}` (one record per kernel JSON with a
"hash", its target flattened in: backend, arch as a string, warp_size) in `io.triton.manifest/`, and the
summary's targets and entry count from those records, as MCV counts them."""

from __future__ import annotations

import json

from kcache_cli.layouts.image_format import MAX_META, ImageFormat, json_bytes, unique_targets
from kcache_cli.layouts.shapes import TRITON, TRITON_GROUP


class TritonImage(ImageFormat):

    def __init__(self) -> None:
        super().__init__(TRITON.name)

    def wants(self, name: str) -> bool:
        base = name.rpartition("/")[2]
        return base.endswith(".json") and not base.startswith(TRITON_GROUP)

    def metadata(self, name: str, data: bytes) -> dict | None:
        if len(data) > MAX_META:
            return None
        try:
            meta = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None
        target = meta.get("target") if isinstance(meta, dict) else None
        if not isinstance(meta.get("hash") if isinstance(meta, dict) else None, str) or not isinstance(target, dict):
            return None
        out = {"hash": meta["hash"]}
        for k in ("ptx_version", "num_stages", "num_warps", "debug"):  # omitempty in MCV's Go struct
            if meta.get(k) not in (None, 0, False):
                out[k] = meta[k]
        return out | {"backend": str(target.get("backend") or ""), "arch": str(target.get("arch")),
                      "warp_size": target.get("warp_size") if isinstance(target.get("warp_size"), int) else 0}

    def manifest(self, records: list[dict], metadata: list[dict]) -> bytes | None:
        return json_bytes({self.name: metadata})

    def entry_count(self, records: list[dict], metadata: list[dict]) -> int:
        return len(metadata) if metadata else len(records)

    def targets(self, records: list[dict], metadata: list[dict]) -> list[dict]:
        if not metadata:
            return super().targets(records, metadata)
        return unique_targets((m["backend"], m["arch"], m["warp_size"]) for m in metadata)
