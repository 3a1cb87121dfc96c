"""dK/dV candidates plus extra one- and two-launch configs for head dims <= 128, through tools/profile_kernels.py."""
import runpy, sys
from fuse_attn.kernels import autotune
from fuse_attn.kernels.autotune import KernelConfig
orig = autotune.dkdv_candidates
EXTRA = [(64, 64, 4, 1), (64, 64, 8, 1), (128, 64, 8, 1), (32, 64, 4, 1), (32, 128, 8, 2), (64, 128, 8, 2), (32, 128, 4, 2)]
def extended(block_d, block_dv, elem, causal, smem_limit):
    out = list(orig(block_d, block_dv, elem, causal, smem_limit))
    for bm, bn, w, launches in EXTRA:
        for st in (2, 3):
            if autotune._smem_bytes(bn, bm, block_d, block_dv, elem, st) <= smem_limit:
                out.append(KernelConfig(bm, bn, w, st, launches))
    return out
autotune.dkdv_candidates = extended
sys.argv = ["profile_kernels.py", *sys.argv[1:]]
runpy.run_path("tools/profile_kernels.py", run_name="__main__")
