"""The Gluon backward at head dim 128 with 64-key tiles (dK / dV split between the warpgroups by columns) against the
committed backward (.gpu/v16/old_bwd.py: 2495b29's hopper_backward.py up to its op, 128-key tiles split by rows):
outputs compared at odd lengths, then CUDA-graph GPU time at B*N = 16384, H16, bf16, cuDNN's backward beside (its
forward+backward less its forward)."""
import importlib.util, sys, time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_backward as hb
from fuse_attn.kernels.hopper_forward import hopper_forward
from fuse_attn.spec import AttentionSpec, CausalMask

s = importlib.util.spec_from_file_location("old_bwd", ".gpu/v16/old_bwd.py")
old = importlib.util.module_from_spec(s); s.loader.exec_module(old)
CANDIDATES = [(64, 128, 2), (64, 64, 2), (64, 64, 3)]
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
t0 = time.time()
D = 128
bad = 0
for M in (300, 2049):
    for causal in (False, True):
        for group in (1, 2):
            spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                                 causal=CausalMask() if causal else None, gqa_group=group)
            g = torch.Generator(device="cuda").manual_seed(M)
            q, dout = (torch.randn(2, 4, M, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            k, v = (torch.randn(2, 4 // group, M, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            out, lse = hopper_forward(q, k, v, spec)
            ref = old.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, group)
            for cfg in CANDIDATES:
                hb._CONFIGS[D] = cfg
                got = hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, group)
                torch.cuda.synchronize()
                diffs = [(a.float() - b.float()).abs().max().item() / max(1.0, b.abs().max().item()) for a, b in zip(got, ref)]
                ok = max(diffs) < 2e-2
                bad += not ok
                print(f"check M{M} {'causal' if causal else 'full'} G{group} {cfg}: rel diffs dq/dk/dv "
                      f"{' '.join(f'{d:.1e}' for d in diffs)} {'PASS' if ok else 'FAIL'}", flush=True)
print(f"checks failed: {bad} ({time.time() - t0:.0f} s)", flush=True)
print("shape,config,old_ms,new_ms,new_vs_old,cudnn_bwd_ms,old_vs_cudnn,new_vs_cudnn", flush=True)
for N in (1024, 4096, 16384):
    B = 16384 // N
    for causal in (False, True):
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        out, lse = hopper_forward(q, k, v, spec)
        t_old = do_bench_cudagraph(lambda: old.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, 1))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        def cudnn_fwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=spec.scale)
        def cudnn_step():
            torch.autograd.grad(cudnn_fwd(), (qg, kg, vg), dout)
        def cudnn_only_fwd():
            with torch.no_grad():
                cudnn_fwd()
        t_cudnn = do_bench_cudagraph(cudnn_step) - do_bench_cudagraph(cudnn_only_fwd)
        for cfg in CANDIDATES:
            hb._CONFIGS[D] = cfg
            t_new = do_bench_cudagraph(lambda: hb.hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, 1))
            print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},\"{cfg}\",{t_old:.4f},{t_new:.4f},{t_old / t_new:.3f},"
                  f"{t_cudnn:.4f},{t_cudnn / t_old:.3f},{t_cudnn / t_new:.3f}", flush=True)
print(f"done ({time.time() - t0:.0f} s)", flush=True)
