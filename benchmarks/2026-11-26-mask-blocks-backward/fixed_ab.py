"""Per-kernel GPU time (profiler, 5 calls) of the op called directly at FIXED configs (env FWD / DQ / DKDV, the
tuner bypassed), on plain causal, causal + a [1,H,N,N] bf16 bias (ALiBi precomputed), causal + ALiBi from slopes.
usage: python3 .gpu/fixed_ab.py [case ...]   (run via run_old.py for the old package)"""
import os, sys
import torch, triton
from torch.profiler import profile, ProfilerActivity
from fuse_attn.kernels import flash_attention, autotune
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreProgramBuilder, ScoreTensor
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
WANT = {"fwd": os.environ.get("FWD", "BLOCK_M=128 BLOCK_N=64 warps=8 stages=3"),
        "bwd_dq": os.environ.get("DQ", "BLOCK_M=128 BLOCK_N=64 warps=8 stages=3"),
        "bwd_dkdv": os.environ.get("DKDV", "BLOCK_M=64 BLOCK_N=128 warps=8 stages=3")}
_orig = autotune.choose
def choose(key, candidates, launch, reset=None, compile_only=None):
    want = WANT.get(key.kind)
    for c in candidates:
        if want is not None and str(c) == want:
            return c
    print("  (no fixed config for", key.kind, [str(c) for c in candidates][:3], ") tuning", flush=True)
    return _orig(key, candidates, launch, reset, compile_only)
autotune.choose = choose
import fuse_attn.kernels.launch as L
if hasattr(L, "choose"):
    L.choose = choose
B, H, N, D = 4, 16, 4096, 128
def bias_spec():
    b = ScoreProgramBuilder()
    return dict(score_mod=b.program(b.add("add", b.add("score"), b.add("load", value=0))),
                score_tensors=(ScoreTensor("bias", "bfloat16", (True, False, False, False)),))
def slopes_spec():
    b = ScoreProgramBuilder()
    s = b.add("score")
    prog = b.program(b.add("add", s, b.add("mul", b.add("load", value=0), b.add("to_float", b.add("sub", b.add("kv_idx"), b.add("q_idx"))))))
    return dict(score_mod=prog, score_tensors=(ScoreTensor("bias", "bfloat16", (True, False, True, True)),))
slopes = torch.tensor([2 ** (-8 * (i + 1) / H) for i in range(H)], device="cuda", dtype=torch.bfloat16)
pos = torch.arange(N, device="cuda")
alibi = (slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None])).to(torch.bfloat16)[None]
CASES = {"causal": ({}, []), "causal+bias[1,H,N,N]": (bias_spec(), [alibi]),
         "causal+alibi slopes": (slopes_spec(), [slopes.view(1, H, 1, 1)])}
only = sys.argv[1:]
for name, (extra, tensors) in CASES.items():
    if only and name not in only:
        continue
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(), **extra)
    def step():
        for t in (q, k, v):
            t.grad = None
        flash_attention(q, k, v, spec, tensors).backward(do)
    step(); torch.cuda.synchronize()
    fb = triton.testing.do_bench(step, warmup=50, rep=300)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kern = {e.key: e.device_time_total / e.count for e in p.key_averages() if e.device_time_total > 0 and e.key.startswith("_attn")}
    counts = {e.key: e.count for e in p.key_averages() if e.device_time_total > 0 and e.key.startswith("_attn")}
    print(f"{name:24s} fwd+bwd {fb:.3f} ms | fwd {kern.get('_attn_fwd', 0):7.1f} dQ {kern.get('_attn_bwd_dq', 0):7.1f} "
          f"dK/dV {kern.get('_attn_bwd_dkdv', 0):7.1f} us per launch; launches {counts}", flush=True)
