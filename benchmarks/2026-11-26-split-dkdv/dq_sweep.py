"""Head-dim-256 dQ candidates plus 8-warp shapes with 64-128 resident rows, through tools/profile_kernels.py."""
import runpy, sys
from fuse_attn.kernels import autotune
from fuse_attn.kernels.autotune import KernelConfig
orig = autotune.dq_candidates
EXTRA = [(128, 32, 8), (128, 16, 8), (64, 32, 8), (64, 64, 8), (128, 64, 8)]
def extended(block_d, block_dv, elem, causal, smem_limit):
    out = list(orig(block_d, block_dv, elem, causal, smem_limit))
    for bm, bn, w in EXTRA:
        for st in (1, 2, 3):
            out.append(KernelConfig(bm, bn, w, st))
    return out
autotune.dq_candidates = extended
sys.argv = ["profile_kernels.py", *sys.argv[1:]]
runpy.run_path("tools/profile_kernels.py", run_name="__main__")
