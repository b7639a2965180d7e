"""Run by the torch venv's python: Mega-Cache through torch 2.13's own API, on CPU.

    python mega_probe.py save CACHE BLOB   compile the functions of inductor_probe.py into CACHE (fresh),
                                           write torch.compiler.save_cache_artifacts()'s blob to BLOB
    python mega_probe.py load CACHE BLOB   torch.compiler.load_cache_artifacts(BLOB) into CACHE (empty),
                                           then the same compiles; print the fx graph counters

Prints one JSON line: the counters (inductor_probe.main's), and for `load` what load_cache_artifacts
reported (the artifact keys by type) or the error it raised."""

import json
import os
import sys

os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from inductor_probe import main  # noqa: E402

if __name__ == "__main__":
    mode, blob = sys.argv[1], sys.argv[3]
    loaded = None
    if mode == "load":
        info = torch.compiler.load_cache_artifacts(open(blob, "rb").read())
        loaded = None if info is None else {k: list(v) for k, v in info.artifacts.items()}
        print(json.dumps({"loaded": loaded}))
    main()
    if mode == "save":
        saved = torch.compiler.save_cache_artifacts()
        with open(blob, "wb") as f:
            f.write(saved[0] if saved else b"")
