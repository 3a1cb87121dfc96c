import torch, sys, time
sys.path.insert(0, "tests")
from test_launch_path import CausalAttention
import torch._inductor.config as ic
print("static user kernels:", ic.static_launch_user_defined_triton_kernels, "static:", ic.use_static_cuda_launcher)
for B, H, N, D in [(8, 12, 1024, 64), (1, 32, 256, 128)]:
    torch._dynamo.reset()
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    f = torch.compile(CausalAttention(N).cuda(), backend="fuse_attn")
    for bwd in (False, True):
        def step():
            out = f(q, k, v)
            if bwd: out.backward(dout)
        for _ in range(5): step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(100): step()
        torch.cuda.synchronize()
        print((B, H, N, D), "fwd+bwd" if bwd else "fwd", "wall per step us", round((time.perf_counter() - t) / 100 * 1e6, 1))
