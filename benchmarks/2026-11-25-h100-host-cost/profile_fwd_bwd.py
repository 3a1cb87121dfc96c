"""Where the host time of a compiled one-attention fwd+bwd call goes: cProfile of 200 calls, fuse_attn and compiled SDPA."""
import cProfile, io, os, pstats, sys
os.environ["FUSE_ATTN_CANDIDATES"] = "triton"
sys.path.insert(0, ".")
import torch, torch.nn.functional as F
import fuse_attn  # noqa: F401  (registers the backend)
from tools.bench_host_overhead import CausalAttention, random_inputs

B, H, N, D = 8, 12, 1024, 64
for name, fn in [("fuse_attn", torch.compile(CausalAttention(N).cuda(), backend="fuse_attn")),
                 ("compiled SDPA", torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)))]:
    q, k, v, dout = random_inputs(B, H, N, D, torch.bfloat16, True)
    def step():
        out = fn(q, k, v)
        out.backward(dout)
        for t in (q, k, v):
            t.grad = None
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        step()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
    print(f"===== {name}: cProfile of 200 fwd+bwd calls (B{B} H{H} N{N} D{D} bf16 causal)")
    print(s.getvalue())
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())
