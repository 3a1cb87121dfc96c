"""dQ by TMA reductions in the dK/dV kernel (FUSE_ATTN_DQ_REDUCE=1) against the two-kernel backward: each kernel's
GPU time from its captured launch, the whole backward, fwd+bwd through the op, and cuDNN's."""
import os, sys, torch, triton
from tabulate import tabulate
from torch.nn.attention import sdpa_kernel, SDPBackend
from fuse_attn.kernels import flash_attention, launch
from fuse_attn.spec import AttentionSpec, CausalMask
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
bench = lambda f: triton.testing.do_bench(f, warmup=30, rep=200)
SHAPES = [(4, 16, 16, 4096, 128, True), (4, 16, 16, 4096, 64, True), (8, 16, 16, 2048, 128, True),
          (4, 16, 16, 4096, 128, False), (2, 32, 8, 4096, 128, True), (4, 8, 8, 4096, 256, True)]
if len(sys.argv) > 1:
    SHAPES = [SHAPES[int(i)] for i in sys.argv[1:]]
rows = []
for B, H, HKV, N, D, causal in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None, gqa_group=H // HKV)
    res = {}
    for mode in ("0", "1"):
        os.environ["FUSE_ATTN_DQ_REDUCE"] = mode
        try:
            out = flash_attention(q, k, v, spec); out.backward(do)
            grads = [t.grad.float().clone() for t in (q, k, v)]
            for t in (q, k, v): t.grad = None
            rec, orig = [], launch.launch
            launch.launch = lambda kern, grid, args, cfg=None, warmup=False: (rec.append((kern, grid, args, cfg)), orig(kern, grid, args, cfg, warmup))[1]
            out = flash_attention(q, k, v, spec); rec.clear(); out.backward(do); torch.cuda.synchronize()
            launch.launch = orig
            for t in (q, k, v): t.grad = None
            by = {kern.fn.__name__: (kern, grid, args, cfg) for kern, grid, args, cfg in rec}
            run = lambda name: orig(*by[name])
            t = {n: bench(lambda: run(n)) for n in by}
            if mode == "1":
                acc = by["_attn_bwd_dkdv"][2]["DQAcc"]
                def bwd():
                    acc.zero_(); run("_attn_bwd_preprocess"); run("_attn_bwd_dkdv")
                    return (acc[..., :D] * D ** -0.5).to(torch.bfloat16)
            else:
                bwd = lambda: [run(n) for n in ("_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq")]
            t_bwd = bench(bwd)
            fb = bench(lambda: flash_attention(q, k, v, spec).backward(do))
            cfg = str(by["_attn_bwd_dkdv"][3])
            res[mode] = (t.get("_attn_bwd_dkdv"), t.get("_attn_bwd_dq", 0.0), t_bwd, fb, grads, cfg)
        except Exception as e:
            print("mode", mode, "failed:", repr(e)[:2000], flush=True)
            launch.launch = orig
    for t in (q, k, v): t.grad = None
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        sd = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != HKV)
        cud_fb = bench(lambda: sd().backward(do))
    diff = ""
    if "0" in res and "1" in res:
        diff = " ".join(f"{(a - b).abs().max().item():.2e}/{a.abs().max().item():.1e}" for a, b in zip(res["0"][4], res["1"][4]))
    r = [f"{B},{H}/{HKV},{N},{D},{'causal' if causal else 'full'}"]
    for mode in ("0", "1"):
        if mode in res:
            dkdv, dq, tb, fb, _, cfg = res[mode]
            r += [f"{dkdv:.3f}+{dq:.3f}", f"{tb:.3f}", f"{fb:.3f}", cfg]
        else:
            r += ["-"] * 4
    r += [f"{cud_fb:.3f}", diff]
    rows.append(r)
    print(r, flush=True)
print(tabulate(rows, headers=["shape", "two: dkdv+dq", "two: bwd", "two: fwd+bwd", "cfg", "reduce: dkdv", "reduce: bwd", "reduce: fwd+bwd", "cfg", "cuDNN fwd+bwd", "grad diff two vs reduce"]))
