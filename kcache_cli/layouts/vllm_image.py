"""vLLM's image in MCV's compat layout (redhat-et/GKM mcv/pkg/cache/vllm.go): `io.vllm.cache/` is vLLM's
cache root, so the torch_compile_cache entries sit under `io.vllm.cache/torch_compile_cache/`; the
config carries `cache.vllm.image/format` and KServe's `io.kserve.km/*` mount hints (framework, cache
type, the entries' hashes, the subpath to mount)."""

from __future__ import annotations

from kcache_cli.layouts.image_format import ImageFormat, json_bytes
from kcache_cli.layouts.shapes import VLLM

SUBDIR = "torch_compile_cache"  # vLLM's compile cache under VLLM_CACHE_ROOT: kcache's root for it


class VllmImage(ImageFormat):

    def __init__(self) -> None:
        super().__init__(VLLM.name)

    @property
    def prefix(self) -> str:
        return f"io.{self.name}.cache/{SUBDIR}/"

    def manifest(self, records: list[dict], metadata: list[dict]) -> bytes | None:
        return json_bytes({self.name: [{"vllm_hash": r.get("hash"), "arch": r.get("arch"),
                                        "backend": r.get("target")} for r in records]})

    def labels(self, records: list[dict]) -> dict[str, str]:
        hashes = [str(r.get("hash")) for r in records if r.get("hash")]
        return {f"{self.label_prefix}format": "unpacked", "io.kserve.km/framework": self.name,
                "io.kserve.km/cache-type": "torch-compile", "io.kserve.km/cache-mount-subpath": SUBDIR,
                "io.kserve.km/cache-hash": ",".join(dict.fromkeys(hashes))}
