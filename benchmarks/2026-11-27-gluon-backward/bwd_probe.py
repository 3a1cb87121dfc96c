"""The Gluon backward of plain attention (fuse_attn/kernels/hopper_backward.py) on an sm90 GPU: gradients against
fp64 under the tests' 2x rule, then GPU time (CUDA-graph replay) and wall time per call against SDPA cuDNN.

    python3 bwd_probe.py check            # dq, dk, dv of long and odd shapes
    python3 bwd_probe.py bench [N ...]    # B * N = 16384, H16, bf16: backward alone, forward + backward
"""
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

from fuse_attn.kernels import reference_attention
from fuse_attn.kernels.hopper_backward import hopper_backward
from fuse_attn.kernels.hopper_forward import flash_attention_hopper, hopper_forward
from fuse_attn.spec import AttentionSpec, CausalMask
from test_kernels import assert_close_2x


def spec_of(D, causal, group=1, dtype="bfloat16"):
    return AttentionSpec(dtype=dtype, head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None, gqa_group=group)


def check():
    bad = 0
    for B, H, N, D, causal, group in ((1, 4, 4096, 128, True, 2), (1, 4, 4096, 64, False, 1), (2, 8, 1000, 128, False, 4),
                                      (2, 2, 130, 64, True, 1), (1, 2, 64, 128, True, 1), (3, 2, 1, 128, False, 1)):
        spec = spec_of(D, causal, group)
        g = torch.Generator(device="cuda").manual_seed(N)
        q = torch.randn(B, H, N, D, device="cuda", generator=g, dtype=torch.bfloat16)
        k, v = (torch.randn(B, H // group, N, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
        leaves = lambda cast=None: [t.detach().to(cast or t.dtype).requires_grad_() for t in (q, k, v)]  # noqa: E731
        ours_in, ref_in, eager_in = leaves(), leaves(torch.float64), leaves()
        out = flash_attention_hopper(*ours_in, spec)
        ref, _ = reference_attention(*ref_in, [], spec)
        eager, _ = reference_attention(*eager_in, [], spec)
        dout = torch.randn(out.shape, device="cuda", generator=g, dtype=torch.bfloat16)
        for name, a, b, c in zip(("dq", "dk", "dv"), torch.autograd.grad(out, ours_in, dout),
                                 torch.autograd.grad(ref, ref_in, dout.double()),
                                 torch.autograd.grad(eager, eager_in, dout)):
            what = f"B{B} H{H} N{N} D{D} causal={causal} G{group} {name}"
            try:
                assert_close_2x(what, a, b, c, torch.bfloat16)
                print(f"check {what}: PASS (err {(a.double() - b).abs().max().item():.2e}, eager "
                      f"{(c.double() - b).abs().max().item():.2e})", flush=True)
            except AssertionError as e:
                bad += 1
                print(f"check {what}: FAIL {str(e)[:300]}", flush=True)
    print("all checks PASS" if not bad else f"{bad} CHECKS FAILED", flush=True)


def bench(lengths):
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    print("shape,what,method,gpu_ms,wall_ms,tflops,gpu_vs_cudnn", flush=True)
    for D in (64, 128):
        for N in lengths:
            B = max(1, 16384 // N)
            for causal in (False, True):
                spec = spec_of(D, causal)
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, dout = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                                 for _ in range(4))
                shape = f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'}"
                flops = 4 * B * 16 * N * N * D / (2 if causal else 1)

                def cudnn(q, k, v):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)

                out, lse = hopper_forward(q, k, v, spec)
                text = spec.to_json()
                bwd = {"gluon bwd": lambda: hopper_backward(dout, q, k, v, out, lse, spec.scale, causal, 1),
                       "template bwd": lambda: torch.ops.fuse_attn.flash_attention_backward(
                           dout, q, k, v, [], None, out, lse, text, [], None)}
                fwd_bwd = {"gluon fwd+bwd": lambda q, k, v: flash_attention_hopper(q, k, v, spec), "cuDNN": cudnn}
                times = {}
                for name, fn in bwd.items():
                    fn()
                    torch.cuda.synchronize()
                    times[name] = (do_bench_cudagraph(fn, rep=100), do_bench(fn, warmup=25, rep=100), 2.5 * flops)
                for name, fn in fwd_bwd.items():
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

                    def step():
                        torch.autograd.grad(fn(*leaves), leaves, dout)
                    step()
                    torch.cuda.synchronize()
                    times[name] = (do_bench_cudagraph(step, rep=100), do_bench(step, warmup=25, rep=100), 3.5 * flops)
                    if name == "cuDNN":  # its backward alone: fwd+bwd less its forward
                        with torch.no_grad():
                            fwd = do_bench_cudagraph(lambda: cudnn(q, k, v), rep=100)
                        times["cuDNN bwd (fwd+bwd - fwd)"] = (times[name][0] - fwd, float("nan"), 2.5 * flops)
                ref = {"bwd": times["cuDNN bwd (fwd+bwd - fwd)"][0], "fwd+bwd": times["cuDNN"][0]}
                for name, (gpu, wall, fl) in times.items():
                    what = "fwd+bwd" if name in fwd_bwd else "bwd"
                    print(f"{shape},{what},{name},{gpu:.4f},{wall:.4f},{fl / gpu / 1e9:.0f},{ref[what] / gpu:.3f}",
                          flush=True)


if __name__ == "__main__":
    if "check" in sys.argv[1:]:
        check()
    if "bench" in sys.argv[1:]:
        bench([int(a) for a in sys.argv[1:] if a.isdigit()] or [1024, 4096, 16384])
