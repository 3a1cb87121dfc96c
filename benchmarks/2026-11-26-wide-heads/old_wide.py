# Run a tool with the backward candidates of head dims > 128 as they were before the wide-head shapes
# (dK/dV 32x64 and dQ 64x32, 4 warps), for an old-against-new comparison in one call.
import runpy, sys
from fuse_attn.kernels import autotune
_dkdv, _dq = autotune.dkdv_candidates, autotune.dq_candidates
def old(gen, shape):
    def f(block_d, block_dv, *a):
        c = gen(block_d, block_dv, *a)
        if max(block_d, block_dv) > 128:
            c = [x for x in c if (x.block_m, x.block_n) == shape and x.num_warps == 4]
        return c
    return f
autotune.dkdv_candidates = old(_dkdv, (32, 64))
autotune.dq_candidates = old(_dq, (64, 32))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
