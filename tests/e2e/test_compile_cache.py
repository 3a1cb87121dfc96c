"""Inductor's FX graph cache, AOTAutograd's cache and the backend's analysis cache (``fuse_attn.analysis_cache``)
across processes: a second process compiling the same model starts warm (cache hits, the graph not traced again),
still calls the fused op, and gets the right results; a process running changed sources of this package (here: a
changed kernel template, which leaves the rewritten graph as it was) misses all three, through the source digest
that ``backend.PostGradPass`` puts into their keys.

Each compile runs in a fresh Python process with its own cache directories (``TORCHINDUCTOR_CACHE_DIR``,
``FUSE_ATTN_CACHE_DIR``) and both caches on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import torch

from tests.support.numerics import FLOOR

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One training step of a causal attention, compiled; prints what the caches did and how it went. The model is the
# attention alone, so that little besides the fused op is left to compile.
TRAINING_STEP = """
import json, math, torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code
import fuse_attn
import fuse_attn.backend
from fuse_attn.report import collect_reports

def attention(q, k, v):
    T = q.shape[-2]
    w = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    w = w.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(w, -1) @ v

torch.manual_seed(0)
q, k, v = (torch.randn(2, 2, 17, 16, requires_grad=True) for _ in range(3))
with collect_reports() as reports:
    out, code = run_and_get_code(torch.compile(attention, backend="fuse_attn"), q, k, v)
(dq,) = torch.autograd.grad(out.sum(), q)
eager = attention(q, k, v)
(eager_dq,) = torch.autograd.grad(eager.sum(), q)
q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
ref = attention(q64, k64, v64)
(ref_dq,) = torch.autograd.grad(ref.sum(), q64)
err = lambda a, b: (a.double() - b).abs().max().item()
print(json.dumps({
    "package": fuse_attn.__file__,
    "fx_hit": counters["inductor"]["fxgraph_cache_hit"], "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
    "aot_hit": counters["aot_autograd"]["autograd_cache_hit"], "aot_miss": counters["aot_autograd"]["autograd_cache_miss"],
    "rewrites": len(reports),
    "traced_seconds": fuse_attn.backend.compile_seconds()["trace"],
    "calls_op": "fuse_attn.flash_attention" in "\\n".join(code),
    "errors": {"output": [err(out, ref), err(eager, ref)], "grad of q": [err(dq, ref_dq), err(eager_dq, ref_dq)]},
}))
"""


def compile_in_a_new_process(cache: str, package_root: str) -> dict:
    """Run TRAINING_STEP with the fuse_attn package found under ``package_root``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
               FUSE_ATTN_CACHE_DIR=os.path.join(cache, "fuse_attn"), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1", TRITON_INTERPRET="0",
               PYTHONPATH=package_root)
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    result = subprocess.run([sys.executable, "-c", TRAINING_STEP], env=env, cwd=cache, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert os.path.dirname(os.path.dirname(stats["package"])) == package_root, stats["package"]
    return stats


def test_warm_start_in_a_new_process_and_invalidation_by_changed_sources(tmp_path):
    cache = str(tmp_path / "cache")
    os.makedirs(cache)
    cold = compile_in_a_new_process(cache, REPO)
    assert (cold["fx_hit"], cold["aot_hit"]) == (0, 0) and cold["fx_miss"] > 0 and cold["aot_miss"] > 0, cold
    assert cold["rewrites"] == 1 and cold["calls_op"] and cold["traced_seconds"] > 0, cold

    warm = compile_in_a_new_process(cache, REPO)
    assert warm["aot_hit"] > 0 and warm["aot_miss"] == 0 and warm["fx_miss"] == 0, warm
    assert warm["calls_op"], "the cached code calls the fused op"
    # the analysis stored by the first process: not traced again, its report published the same
    assert warm["traced_seconds"] == 0 and warm["rewrites"] == 1, warm
    for stats in (cold, warm):
        for what, (ours, eager) in stats["errors"].items():  # the 2x rule against fp64
            assert ours <= 2 * eager + FLOOR[torch.float32], (what, stats)

    changed = tmp_path / "changed"
    shutil.copytree(os.path.join(REPO, "fuse_attn"), changed / "fuse_attn", ignore=shutil.ignore_patterns("__pycache__"))
    with open(changed / "fuse_attn" / "kernels" / "generated" / "templates" / "flash_attention.py.tmpl", "a", encoding="utf-8") as f:
        f.write("\n# a changed kernel\n")
    after_change = compile_in_a_new_process(cache, str(changed))
    assert (after_change["fx_hit"], after_change["aot_hit"]) == (0, 0), after_change
    assert after_change["aot_miss"] > 0 and after_change["calls_op"], after_change
    assert after_change["traced_seconds"] > 0, "changed sources: the graph is analysed again"
