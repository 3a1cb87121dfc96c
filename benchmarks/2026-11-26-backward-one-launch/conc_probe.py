"""Our dQ and dK/dV kernels one after the other (as launched) against both at once on two streams (what one launch
holding both kinds of programs allows, as FlexAttention's backward), at sliding windows; FlexAttention's
backward kernels (profiler) beside."""
import torch, triton
from tabulate import tabulate
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
from fuse_attn.kernels import flash_attention, launch, autotune
from fuse_attn.spec import AttentionSpec, CausalMask
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300)
flex_c = torch.compile(flex_attention)
rows = []
for (B, H, N, D), window in [((4, 16, 4096, 128), 128), ((4, 16, 4096, 128), 512), ((4, 16, 4096, 128), 1024),
                             ((4, 16, 4096, 128), None), ((4, 16, 4096, 64), 1024), ((16, 16, 1024, 128), None)]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(window=window))
    flash_attention(q, k, v, spec).backward(do)
    rec, orig = [], launch.launch
    launch.launch = lambda kern, grid, args, cfg=None, warmup=False: (rec.append((kern, grid, args, cfg)), orig(kern, grid, args, cfg, warmup))[1]
    out = flash_attention(q, k, v, spec); rec.clear(); out.backward(do); torch.cuda.synchronize()
    launch.launch = orig
    by = {kern.fn.__name__: (kern, grid, args, cfg) for kern, grid, args, cfg in rec}
    run = lambda name: orig(*by[name])
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    def concurrent():
        ev = torch.cuda.Event(); ev.record()
        s1.wait_event(ev); s2.wait_event(ev)
        with torch.cuda.stream(s1): run("_attn_bwd_dkdv")
        with torch.cuda.stream(s2): run("_attn_bwd_dq")
        torch.cuda.current_stream().wait_stream(s1); torch.cuda.current_stream().wait_stream(s2)
    seq = lambda: [run(n) for n in ("_attn_bwd_dq", "_attn_bwd_dkdv")]
    t = {n: bench(lambda: run(n)) for n in by}
    t_seq, t_conc = bench(seq), bench(concurrent)
    w = window or N + 1
    bm = create_block_mask(lambda b, h, m, n: (m >= n) & (m - n < w), None, None, N, N)
    step = lambda: flex_c(q, k, v, block_mask=bm).backward(do)
    step(); step(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    fb = sum(e.device_time_total / 5 for e in p.key_averages() if "flex_attention_backward" in e.key)
    rows.append([f"{B},{H},{N},{D}", window, f"{t['_attn_bwd_dq']*1000:.1f}", f"{t['_attn_bwd_dkdv']*1000:.1f}",
                 f"{t_seq*1000:.1f}", f"{t_conc*1000:.1f}", f"{fb:.1f}", str(by["_attn_bwd_dq"][3]), str(by["_attn_bwd_dkdv"][3])])
    print(rows[-1], flush=True)
    autotune._chosen.clear()
print(tabulate(rows, headers=["B,H,N,D", "window", "dQ us", "dK/dV us", "in order", "two streams", "flex bwd (+pre)", "dQ cfg", "dK/dV cfg"]))
