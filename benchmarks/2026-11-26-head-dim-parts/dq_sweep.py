"""dQ candidates plus extra tiles for head dims <= 128, through tools/profile_kernels.py (argv passed on)."""
import runpy, sys
from fuse_attn.kernels import autotune
from fuse_attn.kernels.autotune import KernelConfig
orig = autotune.dq_candidates
EXTRA = [(64, 64, 4), (64, 32, 4), (64, 128, 4), (128, 128, 8)]
def extended(block_d, block_dv, elem, causal, smem_limit):
    out = list(orig(block_d, block_dv, elem, causal, smem_limit))
    for bm, bn, w in EXTRA:
        for st in (2, 3):
            if autotune._smem_bytes(bm, bn, block_d, block_dv, elem, st) <= smem_limit:
                out.append(KernelConfig(bm, bn, w, st))
    return out
autotune.dq_candidates = extended
sys.argv = ["profile_kernels.py", *sys.argv[1:]]
runpy.run_path("tools/profile_kernels.py", run_name="__main__")
