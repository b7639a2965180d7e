"""Run by the torch venv's python (tests/loaders/venvs.py "torch"): torch's own `load_inline` of the small
extension of tests/fixtures/real/make/make_torch.py with $TORCH_EXTENSIONS_DIR set, printing one JSON
line: {"value": 42, "rebuilt": bool} (rebuilt: the module's mtime changed, ninja built it again), or
{"error": "..."} when torch's import of the module failed. A `lock` left in the build directory makes
torch wait for ever: the caller's timeout is the verdict then."""

import json
import os
import sys

from torch.utils.cpp_extension import load_inline

NAME = "kc_add_one"
SOURCE = "int64_t kc_add_one(int64_t x) { return x + 1; }"


def mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def main() -> None:
    module = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], NAME, f"{NAME}.so")
    before = mtime(module)
    try:
        m = load_inline(name=NAME, cpp_sources=[SOURCE], functions=[NAME], extra_cflags=["-Os", "-g0"])
        out: dict = {"value": m.kc_add_one(41)}
    except Exception as exc:  # what torch raised is the verdict
        out = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    out["rebuilt"] = mtime(module) != before
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
