"""The gradient of an ``s + bias`` attention's bias on the GPU, op level: the Gluon forward and backward with each
tile's dS stored (this session's ``hopper_backward`` with ``bias_grad``) against the Gluon forward with the generated
template's backward (before: its dK/dV kernel adds dS into an fp32 buffer by atomics), FlexAttention (compiled, the
bias a captured buffer that needs a gradient), and the Gluon kernels with a bias that needs no gradient (what the
gradient costs). Forward + backward time (``do_bench``: these calls run 1-10 ms of kernels, so the host's share is
small), the backward alone (the forward's time taken off), the memory the step allocates beyond its inputs, the
host's time to enqueue a step, and dbias's error against fp64 (at N 1024, the same shapes otherwise).

    python3 benchmarks/2026-11-28-gluon-bias-gradient/bias_gradient_bench.py
"""
import contextlib
import faulthandler
import time

import torch
from tabulate import tabulate
from torch.nn.attention.flex_attention import flex_attention
from triton.testing import do_bench

from fuse_attn.kernels import hopper_backward, reference_attention
from fuse_attn.kernels.hopper_forward import flash_attention_hopper
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreNode, ScoreTensor

BIAS_PROGRAM = (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("add", (0, 1)))
CASES = [  # (name, Z, H, N, D, bias batch rows, causal)
    ("T5-small encoder", 4, 8, 4096, 64, 1, False),
    ("dense learned bias", 4, 16, 4096, 128, 1, False),
    ("learned bias + causal", 4, 16, 4096, 128, 1, True),
    ("per-row bias", 4, 8, 2048, 64, 4, False),
]
flex = torch.compile(flex_attention, dynamic=False)


def spec_of(D, causal, bias):
    return AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None, score_mod=BIAS_PROGRAM,
                         score_tensors=(ScoreTensor("bias", "bfloat16", tuple(n == 1 for n in bias.shape)),))


def inputs(Z, H, N, D, bias_rows, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(N)
    q, k, v, dout = (torch.randn(Z, H, N, D, device="cuda", generator=g, dtype=dtype) for _ in range(4))
    bias = torch.randn(bias_rows, H, N, N, device="cuda", generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, bias)], dout


def ours(q, k, v, bias, causal):
    return flash_attention_hopper(q, k, v, spec_of(q.shape[-1], causal, bias), bias=bias)


@contextlib.contextmanager
def backward_of(method):
    """The template's backward for the bias's gradient where the method says so: dscore_kv_heads admits no head."""
    saved = hopper_backward.dscore_kv_heads
    if method == "gluon fwd + template bwd":
        hopper_backward.dscore_kv_heads = lambda *a: 0
    try:
        yield
    finally:
        hopper_backward.dscore_kv_heads = saved


def flex_run(q, k, v, bias, causal):
    batch_bias = bias.shape[0] != 1

    def score_mod(score, b, h, q_idx, kv_idx):
        s = score + bias[b if batch_bias else 0, h, q_idx, kv_idx]
        return torch.where(q_idx >= kv_idx, s, float("-inf")) if causal else s

    return flex(q, k, v, score_mod=score_mod)


def ours_without_bias_gradient(q, k, v, bias, causal):
    return ours(q, k, v, bias.detach(), causal)


METHODS = {"gluon + dS stores": ours, "gluon fwd + template bwd": ours, "flex": flex_run,
           "gluon, no bias gradient": ours_without_bias_gradient}  # (the last: what the bias's gradient costs)


def step(method, tensors, dout, causal):
    with backward_of(method):
        out = METHODS[method](*tensors, causal)
        out.backward(dout)
    return out


def measure(name, Z, H, N, D, bias_rows, causal):
    tensors, dout = inputs(Z, H, N, D, bias_rows)
    rows = []
    for method in METHODS:
        def fwd():
            with torch.no_grad():
                METHODS[method](*tensors, causal)
        both = lambda: step(method, tensors, dout, causal)  # noqa: E731
        both()
        torch.cuda.synchronize()
        for t in tensors:
            t.grad = None
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        both()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        for t in tensors:
            t.grad = None
        t_fwd = do_bench(fwd, warmup=25, rep=100)
        t_both = do_bench(both, warmup=25, rep=100, grad_to_none=tensors)
        start = time.perf_counter()
        for _ in range(20):
            both()
        host = (time.perf_counter() - start) / 20  # (enqueue time: the caller waits on no result)
        torch.cuda.synchronize()
        rows.append([name, f"{Z},{H},{N},{D}", f"[{bias_rows},{H},N,N]", causal, method, t_fwd, t_both,
                     t_both - t_fwd, peak, host * 1e3])
    return rows


def error_check(name, Z, H, N, D, bias_rows, causal):
    """dbias's max error against fp64 (the reference's autograd), beside eager bf16's."""
    tensors, dout = inputs(Z, H, 1024, D, bias_rows)
    spec = spec_of(D, causal, tensors[3])
    out = []
    for method in ("gluon + dS stores", "gluon fwd + template bwd", "eager bf16", "fp64"):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        if method == "fp64":
            leaves = [t.detach().double().requires_grad_() for t in leaves]
        with backward_of(method):
            if method.startswith("gluon"):
                o = METHODS[method](*leaves, causal)
            else:
                o = reference_attention(*leaves[:3], leaves[3:], spec)[0]
            o.backward(dout.to(o.dtype))
        out.append(leaves[3].grad.double())
    ref = out[-1]
    return [name] + [(g - ref).abs().max().item() for g in out[:-1]]


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    faulthandler.dump_traceback_later(280, exit=True)  # (where it is, should a kernel never finish)
    rows = []
    for case in CASES:
        rows += measure(*case)
        print(tabulate(rows[-len(METHODS):], floatfmt=".3f"), flush=True)
    print(tabulate(rows, headers=["case", "Z,H,N,D", "bias", "causal", "method", "fwd ms", "fwd+bwd ms", "bwd ms",
                                  "MiB allocated", "host ms a step"], floatfmt=".3f"))
    errs = [error_check(*case) for case in CASES]
    print(tabulate(errs, headers=["case (N 1024)", "dbias err: gluon + dS", "gluon + template", "eager bf16"],
                   floatfmt=".2e"))


if __name__ == "__main__":
    main()
