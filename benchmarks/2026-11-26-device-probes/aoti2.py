import faulthandler; faulthandler.enable()
import torch
x = torch.randn(4, 16, device="cuda")
m = torch.nn.Linear(16, 16).cuda()
so = torch._export.aot_compile(m, (x,))
print("so", so, flush=True)
runner = torch._export.aot_load(so, "cuda")
print("aot_load ran:", runner(x).shape, flush=True)
