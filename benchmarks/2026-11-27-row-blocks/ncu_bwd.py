"""One forward+backward step of SDPA cuDNN at D128 B4 H16 N4096 (for ncu to capture its longest kernel)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
dout = torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(2):
        torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), dout)
torch.cuda.synchronize()
