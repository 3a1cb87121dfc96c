# The forward and backward launchers called directly (no Inductor, no tuner choice between implementations) with
# 4400 batch rows x 16 heads = 70,400 (batch row, head) pairs, against eager fp64.
import torch, fuse_attn
from fuse_attn.kernels import launch
from fuse_attn.spec import AttentionSpec, CausalMask
print("package:", fuse_attn.__file__, flush=True)
Z, H, L, D = 4400, 16, 16, 64
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
torch.manual_seed(0)
q, k, v = (torch.randn(Z, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
try:
    out, lse = launch.triton_forward(q, k, v, [], spec, None)
    torch.cuda.synchronize()
    s = (q.double() @ k.double().transpose(-1, -2)) * D ** -0.5
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    print(f"forward ran: max error {(out.double() - ref).abs().max().item():.2e}", flush=True)
except Exception as e:
    print(f"forward failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
