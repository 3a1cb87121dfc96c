"""Backward probe: our dQ and dK/dV kernels run one after the other (as now) against the two on separate streams
(what one launch holding both kinds of programs would allow, as FlexAttention's backward does), and against
Flex's and cuDNN's fwd / fwd+bwd on the same shapes."""
import torch, triton
from tabulate import tabulate
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
from fuse_attn.kernels import flash_attention, launch, autotune
from fuse_attn.spec import AttentionSpec, CausalMask
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300)
flex_c = torch.compile(flex_attention)
rows = []
for B, H, N, D in [(4, 16, 4096, 128), (4, 16, 4096, 64), (8, 16, 2048, 128), (4, 8, 4096, 256)]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
    flash_attention(q, k, v, spec).backward(do)
    rec, orig = [], launch.launch
    launch.launch = lambda kern, grid, args, cfg=None, warmup=False: (rec.append((kern, grid, args, cfg)), orig(kern, grid, args, cfg, warmup))[1]
    out = flash_attention(q, k, v, spec); rec.clear(); out.backward(do); torch.cuda.synchronize()
    launch.launch = orig
    by = {kern.fn.__name__: (kern, grid, args, cfg) for kern, grid, args, cfg in rec}
    run = lambda name: orig(*by[name])
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    def concurrent():
        run("_attn_bwd_preprocess")
        ev = torch.cuda.Event(); ev.record()
        s1.wait_event(ev); s2.wait_event(ev)
        with torch.cuda.stream(s1): run("_attn_bwd_dkdv")
        with torch.cuda.stream(s2): run("_attn_bwd_dq")
        torch.cuda.current_stream().wait_stream(s1); torch.cuda.current_stream().wait_stream(s2)
    seq = lambda: [run(n) for n in ("_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq")]
    t = {n: bench(lambda: run(n)) for n in by}
    t_seq, t_conc = bench(seq), bench(concurrent)
    ours_f = bench(lambda: flash_attention(q, k, v, spec))
    ours_fb = bench(lambda: flash_attention(q, k, v, spec).backward(do))
    bm = create_block_mask(lambda b, h, m, n: m >= n, None, None, N, N)
    flex_f = bench(lambda: flex_c(q, k, v, block_mask=bm))
    flex_fb = bench(lambda: flex_c(q, k, v, block_mask=bm).backward(do))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        sd = torch.nn.functional.scaled_dot_product_attention
        cud_f = bench(lambda: sd(q, k, v, is_causal=True))
        cud_fb = bench(lambda: sd(q, k, v, is_causal=True).backward(do))
    cfgs = {n: str(c) for n, (_, _, _, c) in by.items() if c is not None}
    rows.append([f"{B},{H},{N},{D}", f"{t['_attn_bwd_dkdv']:.3f}", f"{t['_attn_bwd_dq']:.3f}", f"{t['_attn_bwd_preprocess']:.3f}",
                 f"{t_seq:.3f}", f"{t_conc:.3f}", f"{ours_f:.3f}/{ours_fb:.3f}", f"{flex_f:.3f}/{flex_fb:.3f}", f"{cud_f:.3f}/{cud_fb:.3f}"])
    print(rows[-1], cfgs, flush=True)
print(tabulate(rows, headers=["B,H,N,D causal", "dK/dV", "dQ", "pre", "bwd in order", "dQ || dK/dV", "ours fwd/fwd+bwd", "flex", "cudnn"]))
