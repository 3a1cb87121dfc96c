"""dK/dV candidates plus split configs (dkdv_launches=2), through tools/profile_kernels.py (argv passed on)."""
import runpy, sys
from fuse_attn.kernels import autotune
from fuse_attn.kernels.autotune import KernelConfig
orig = autotune.dkdv_candidates
WIDE = [(32, 64, 4), (64, 64, 4), (32, 64, 8), (64, 64, 8), (16, 128, 8), (32, 128, 8), (64, 128, 8), (32, 128, 4)]
NARROW = [(32, 128, 4), (64, 128, 8), (32, 128, 8), (64, 64, 4), (64, 64, 8)]
def extended(block_d, block_dv, elem, causal, smem_limit):
    out = list(orig(block_d, block_dv, elem, causal, smem_limit))
    for bm, bn, w in (WIDE if max(block_d, block_dv) > 128 else NARROW):
        for st in (1, 2, 3):
            if autotune._smem_bytes(bn, bm, block_d, block_dv, elem, st) <= smem_limit + 64 * 1024:
                out.append(KernelConfig(bm, bn, w, st, 2))
    return out
autotune.dkdv_candidates = extended
sys.argv = ["profile_kernels.py", *sys.argv[1:]]
runpy.run_path("tools/profile_kernels.py", run_name="__main__")
