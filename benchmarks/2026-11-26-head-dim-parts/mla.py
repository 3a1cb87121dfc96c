"""D192 / DV128 (DeepSeek MLA's training shapes), causal bf16: the 2x-rule check at an odd shape, then fwd and fwd+bwd
time (do_bench median) of the fused op against SDPA cuDNN. argv[1]: label."""
import sys, torch, triton
sys.path.insert(0, "tools")
import bench_attention as ba
from fuse_attn.spec import CausalMask
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
ok, desc, detail = ba.check_case(torch.bfloat16, Z=2, H=4, M=777, N=777, D=192, DV=128, causal=CausalMask())
print("check", "PASS" if ok else "FAIL", desc, detail, flush=True)
from fuse_attn.kernels import flash_attention
from fuse_attn.spec import AttentionSpec
SPEC = AttentionSpec(dtype="bfloat16", head_dim=192, head_dim_v=128, scale=192 ** -0.5, causal=CausalMask())
B, H, N = 4, 16, 4096
q, k = (torch.randn(B, H, N, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
v = torch.randn(B, H, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
do = torch.randn(B, H, N, 128, device="cuda", dtype=torch.bfloat16)
def ours():
    return flash_attention(q, k, v, SPEC)
def cudnn():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=192 ** -0.5)
for name, fn in (("ours", ours), ("SDPA cuDNN", cudnn)):
    try:
        fwd = triton.testing.do_bench(fn, return_mode="median")
        def step():
            o = fn(); o.backward(do); q.grad = k.grad = v.grad = None
        both = triton.testing.do_bench(step, return_mode="median")
        print(f"{sys.argv[1]} {name}: fwd {fwd:.3f} ms, fwd+bwd {both:.3f} ms", flush=True)
    except Exception as e:
        print(name, "failed:", type(e).__name__, str(e)[:200])
