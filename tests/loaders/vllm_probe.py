"""Run by the torch venv's python. vLLM needs a GPU, so its torch_compile_cache is made here from what vLLM
itself stores: torch's own `standalone_compile` artifacts (CompiledArtifact.save, both formats), and the
index files vLLM's CompilerManager writes by its own rules (vllm/compilation/backends.py and
compiler_interface.py, InductorStandaloneAdaptor):

  <root>/torch_compile_cache/<h10>/rank_<rank>_<dp_rank>/<prefix>/
      vllm_compile_cache.py       pprint.PrettyPrinter(indent=4).pformat of
                                  {(compile_range, graph_index, "inductor_standalone"): (key, path)}
      artifact_compile_range_<start>_<end>_subgraph_<i>   the artifact at `path` (a file, or an unpacked
                                  Inductor root), key = its name
      cache_key_factors.json      the factors the <h10> hash is made of

`make ROOT H10 FORMAT` writes one such <h10> unit (two prefixes, two subgraphs each); `load UNIT FORMAT`
is the loader oracle: for every index under the unit, what vLLM's load does (ast.literal_eval of the
index, then torch._inductor.CompiledArtifact.load(path=handle[1], format=FORMAT) and a call), printing
{"loaded": n, "failed": [why...]} as one JSON line."""

import ast
import json
import os
import pprint
import sys

import torch

FACTORS = {"env": {"VLLM_USE_STANDALONE_COMPILE": True}, "config_hash": "0c1d2e3f4a", "code_hash": "9a8b7c6d5e",
           "compiler_hash": "1234abcd56"}


def pieces():
    def f0(x):
        return (torch.relu(x) * 3.0,)

    def f1(x):
        return (torch.sin(x) + torch.cos(x) * 2.0,)

    return [f0, f1]


def make(root: str, h10: str, fmt: str) -> None:
    from torch._inductor import standalone_compile

    unit = os.path.join(root, "torch_compile_cache", h10)
    for prefix in ("backbone", "eagle_head"):
        local = os.path.join(unit, "rank_0_0", prefix)
        os.makedirs(local, exist_ok=True)
        cache = {}
        for i, fn in enumerate(pieces()):
            x = torch.ones(4, 4)
            gm = torch.fx.symbolic_trace(fn)
            compiled = standalone_compile(gm, [x], dynamic_shapes="from_example_inputs")
            compile_range = (1, 8192)
            key = f"artifact_compile_range_{compile_range[0]}_{compile_range[1]}_subgraph_{i}"
            path = os.path.join(local, key)
            compiled.save(path=path, format=fmt)
            cache[(compile_range, i, "inductor_standalone")] = (key, path)
        with open(os.path.join(local, "vllm_compile_cache.py"), "w") as f:
            f.write(pprint.PrettyPrinter(indent=4).pformat(cache))
        with open(os.path.join(local, "cache_key_factors.json"), "w") as f:
            json.dump({**FACTORS, "format": fmt, "prefix": prefix}, f, indent=2)


def load(unit: str, fmt: str) -> None:
    loaded, failed = 0, []
    for dirpath, _dirs, files in sorted(os.walk(unit)):
        if "vllm_compile_cache.py" not in files:
            continue
        try:
            with open(os.path.join(dirpath, "vllm_compile_cache.py")) as f:
                cache = ast.literal_eval(f.read())
            for (_range, i, _name), handle in sorted(cache.items()):
                art = torch._inductor.CompiledArtifact.load(path=handle[1], format=fmt)
                out = art(torch.ones(4, 4))
                expected = pieces()[i](torch.ones(4, 4))[0]
                assert torch.allclose(out[0], expected)
                loaded += 1
        except Exception as exc:  # what vLLM would raise at start-up
            failed.append(f"{dirpath}: {type(exc).__name__}: {str(exc)[:200]}")
    print(json.dumps({"loaded": loaded, "failed": failed}))


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        load(sys.argv[2], sys.argv[3])
