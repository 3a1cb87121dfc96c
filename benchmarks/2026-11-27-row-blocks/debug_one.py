"""One forward launch at a config (subprocess per case: an illegal address poisons the context)."""
import importlib.util, sys
import torch
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask
s = importlib.util.spec_from_file_location("old_fwd", ".gpu/v16/old_fwd_kernel.py")
old = importlib.util.module_from_spec(s); s.loader.exec_module(old)
cfg = tuple(int(x) for x in sys.argv[1].split(",")); causal = sys.argv[2] == "1"; M = int(sys.argv[3]); group = int(sys.argv[4])
D = 64 if len(sys.argv) < 6 else int(sys.argv[5])
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None, gqa_group=group)
g = torch.Generator(device="cuda").manual_seed(M + group)
q = torch.randn(2, 4, M, D, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(2, 4 // group, M, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
ref, ref_lse = old.hopper_forward(q, k, v, spec)
torch.cuda.synchronize()
hf.forward_config = lambda *a: cfg
try:
    out, lse = hf.hopper_forward(q, k, v, spec)
    torch.cuda.synchronize()
    print(f"{cfg} causal={causal} M={M} g={group} D={D}: ok, out diff {(out.float() - ref.float()).abs().max().item():.2e} lse diff {(lse - ref_lse).abs().max().item():.2e}", flush=True)
except Exception as e:
    print(f"{cfg} causal={causal} M={M} g={group} D={D}: {type(e).__name__} {str(e)[:80]}", flush=True)
