"""Which tile config the Gluon forward should run where its bias tiles come by TMA (the ring then holds k, v and the
bias: hopper_forward.bias_ring_stages keeps as many of a config's stages as fit). B4 H16 N4096, a ``[1, H, N, N]``
bf16 bias, the op called eagerly, ``do_bench`` medians in two orders, forward and forward+backward (the backward is
the same in every row: only the forward's config changes). Also the peak memory of forward+backward beyond the
inputs, Gluon against the generated template, at D128 causal.
Run from the repository root: ``python3 benchmarks/2026-11-28-gluon-bias-tma/bias_tma_configs.py``."""
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, ".")
from fuse_attn.kernels import hopper_forward as hf  # noqa: E402
from fuse_attn.kernels.hopper_forward import flash_attention_hopper  # noqa: E402
from fuse_attn.kernels.ops import flash_attention  # noqa: E402
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreNode, ScoreTensor  # noqa: E402

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
PROGRAM = (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("add", (0, 1)))
Z, H, N = 4, 16, 4096
# (head dim, causal): configs (rows a consumer, key tile, stages, consumers); the first is forward_config's
CONFIGS = {
    (128, True): [(64, 128, 3, 2), (64, 64, 4, 2)],
    (128, False): [(64, 128, 3, 2), (64, 64, 4, 2)],
    (64, False): [(64, 128, 3, 3), (64, 64, 4, 3), (64, 64, 5, 3)],
    (64, True): [(64, 128, 3, 3), (64, 64, 4, 3), (64, 64, 5, 3)],
}


def run_with(config, fn):
    saved = hf.forward_config
    hf.forward_config = lambda *args: config
    try:
        return fn()
    finally:
        hf.forward_config = saved


def main():
    torch.manual_seed(0)
    for (D, causal), configs in CONFIGS.items():
        q, k, v = (torch.randn(Z, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        bias = (torch.randn(1, H, N, N, device="cuda") * 2).to(torch.bfloat16)
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                             causal=CausalMask() if causal else None, score_mod=PROGRAM,
                             score_tensors=(ScoreTensor("bias", "bfloat16", (True, False, False, False)),))
        dout = torch.randn_like(q)
        fns = {str(c): (lambda c=c: run_with(c, lambda: flash_attention_hopper(q, k, v, spec, bias=bias)))
               for c in configs}
        with torch.no_grad():
            ref = flash_attention(q, k, v, spec, [bias]).float()
            for name, f in fns.items():
                print(f"D{D} causal={causal} {name}: max |out - template| {(f().float() - ref).abs().max().item():.4f}")
        res = {}
        for order in (list(fns), list(fns)[::-1]):
            for name in order:
                f = fns[name]
                with torch.no_grad():
                    tf = do_bench(f, warmup=50, rep=300)
                tb = do_bench(lambda: torch.autograd.grad(f(), (q, k, v), dout), warmup=50, rep=300)
                res.setdefault(name, []).append((tf, tb))
        print(f"\nD{D} {'causal' if causal else 'no mask'}, B{Z} H{H} N{N}, [1,H,N,N] bf16 bias\n"
              "| forward config | forward ms | forward+backward ms |\n|---|---|---|")
        for name, runs in res.items():
            print(f"| {name} | {' / '.join(f'{a:.3f}' for a, _ in runs)} | "
                  f"{' / '.join(f'{b:.3f}' for _, b in runs)} |", flush=True)
        if D == 128 and causal:
            for name, f in (("Gluon", fns[str(configs[0])]), ("template", lambda: flash_attention(q, k, v, spec, [bias]))):
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                torch.autograd.grad(f(), (q, k, v), dout)
                torch.cuda.synchronize()
                print(f"forward+backward peak beyond the inputs, {name}: "
                      f"{(torch.cuda.max_memory_allocated() - base) / 2**20:.0f} MiB")
        del q, k, v, bias, dout


main()
