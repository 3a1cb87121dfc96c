# Which arguments torch's analysis of user Triton kernels (torch._higher_order_ops.triton_kernel_wrap.identify_accessed_tensors,
# what Inductor functionalizes by) takes as written, for the launches of a few specs; CPU only: Triton 3.6 wheel on the path
# (TRITON_INTERPRET=0 PYTHONPATH=<triton 3.6>:. python inductor_mutation_analysis.py), a fake driver for the sm90 target.
import torch, triton, os
from triton.backends.compiler import GPUTarget
class _FakeDriver:
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")
triton.runtime.driver._active = _FakeDriver()
from torch._higher_order_ops import triton_kernel_wrap as w
from fuse_attn.kernels import launch
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreProgramBuilder, ScoreTensor
launches = []
launch.launch = lambda kernel, grid, args, cfg=None, warmup=False: launches.append((kernel, args, cfg))
def bias_prog():
    b = ScoreProgramBuilder()
    return dict(score_mod=b.program(b.add("add", b.add("score"), b.add("load", value=0))),
                score_tensors=(ScoreTensor("bias", "DT", (True, False, False, False)),))
CASES = {
  "bf16 causal": (dict(causal=CausalMask()), "bfloat16", False),
  "bf16 bias grad": (bias_prog(), "bfloat16", True),
  "fp32 bias grad (exact delta)": (bias_prog(), "float32", True),
  "bf16 dropout causal gqa2": (dict(causal=CausalMask(), dropout_p=0.1, gqa_group=2), "bfloat16", False),
  "bf16 window": (dict(causal=CausalMask(window=64)), "bfloat16", False),
}
for name, (extra, dt, need) in CASES.items():
    launches.clear()
    if "score_tensors" in extra:
        extra = dict(extra, score_tensors=(ScoreTensor("bias", dt, (True, False, False, False)),))
    spec = AttentionSpec(dtype=dt, head_dim=64, head_dim_v=64, scale=0.125, **extra)
    dtype = getattr(torch, dt)
    g = spec.gqa_group
    q, dout = (torch.randn(2, 4, 256, 64, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(2, 4 // g, 256, 64, dtype=dtype) for _ in range(2))
    scores = [torch.randn(1, 4, 256, 256, dtype=dtype)] if spec.score_tensors else []
    seed = torch.tensor(7) if spec.dropout_p else None
    launch.triton_forward(q, k, v, scores, spec, seed)
    out, lse = torch.empty_like(q), torch.zeros(2, 4, 256)
    launch.triton_backward(dout, q, k, v, scores, out, lse, spec, [need] * len(scores), seed)
    for kernel, args, cfg in launches:
        kw = dict(args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
        acc = w.identify_accessed_tensors(kernel, kw, {})
        flags = {k: v for k, v in args.items() if k.startswith(("NEED_DT", "EXACT", "COMPUTE"))}
        print(f"{name:30s} {kernel.fn.__name__:16s} writes {sorted(d.name for d in acc.read_writes.writes)} {flags}")
