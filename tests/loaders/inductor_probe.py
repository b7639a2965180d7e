"""Run by the torch venv's python (tests/loaders/venvs.py "torch"): compile a few functions with
torch.compile on CPU into the Inductor cache at $TORCHINDUCTOR_CACHE_DIR and print, as one JSON line,
the fx graph cache's counters for this process: {"hit": n, "miss": n, "results": [...]}.

What it compiles (C++ kernels through g++): a pointwise function, a function with a dynamic shape
(two sizes, so its key directory holds a guard variant), and a small model's forward and backward
pass (an aotautograd entry naming its forward and backward fx graphs). A fresh process that finds
every graph in the cache reports only hits: the loader oracle for kcache's Inductor statuses."""

import json
import os
import sys

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # 2 shared cores: no compile worker pool

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402


def pointwise(x):
    return torch.sin(x) * 2.0 + torch.cos(x)


def dynamic(x):
    return (x * x).sum(dim=-1) + 1.0


def main() -> None:
    torch.manual_seed(0)
    results = []
    f = torch.compile(pointwise)
    results.append(float(f(torch.ones(8)).sum()))
    d = torch.compile(dynamic, dynamic=True)
    results.append(float(d(torch.ones(4, 3)).sum()))
    results.append(float(d(torch.ones(5, 7)).sum()))
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    m = torch.compile(model)
    x = torch.ones(3, 6)
    loss = m(x).sum()
    loss.backward()
    results.append(round(float(loss), 4))
    ind = counters["inductor"]
    print(json.dumps({"hit": ind["fxgraph_cache_hit"], "miss": ind["fxgraph_cache_miss"],
                      "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
                      "aot_miss": counters["aot_autograd"]["autograd_cache_miss"], "results": results}))


if __name__ == "__main__":
    sys.exit(main())
