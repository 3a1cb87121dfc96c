import sys, torch
sys.path.insert(0, ".")
import fuse_attn  # noqa
from tools.bench_variants import VARIANTS
v = VARIANTS["dense_bias"]
size = v.default.__class__(**{**v.default.__dict__, "batch": 2, "heads": 2, "kv_heads": 2, "seq": 256, "head_dim": 64})
with torch.device("cuda"):
    mod = v.module(size).to(torch.bfloat16)
q, k, vv = (torch.randn(2, 2, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = torch.compile(mod, backend="fuse_attn")(q, k, vv)
out.sum().backward()
torch.cuda.synchronize()
print("done")
