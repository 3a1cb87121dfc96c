"""Tune the forward of one causal shape in a fresh tuning cache and print the pick with the tuner's timings
(first pass and finalists). argv: B,H,N,D."""
import logging, os, sys, tempfile
os.environ["FUSE_ATTN_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
import torch
from fuse_attn.kernels import launch
from fuse_attn.spec import AttentionSpec, CausalMask
B, H, N, D = (int(x) for x in sys.argv[1].split(","))
lines = []
class H_(logging.Handler):
    def emit(self, r):
        msg = r.getMessage()
        if "config" in msg or "finalist" in msg or "tuned" in msg:
            lines.append(msg)
log = logging.getLogger("fuse_attn.kernels.autotune"); log.setLevel(logging.DEBUG); log.addHandler(H_())
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
launch.triton_forward(q, k, v, [], spec)
for l in lines:
    if l.startswith("config") or l.startswith("finalist") or l.startswith("tuned"):
        print(l.split(" for ")[0], l.rsplit(":", 1)[-1] if not l.startswith("tuned") else l.split(": ", 1)[-1][:90])
