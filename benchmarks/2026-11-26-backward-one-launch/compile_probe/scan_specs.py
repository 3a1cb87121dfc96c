"""ptxas's wgmma-serialization warnings (C7512 / C7515) and spills for every spec of tests/test_gpu_compile.SPECS, at
the configs the tuner picks most on an H100 (BENCHMARKS.md), compiled as compile_probe.py does.

    TRITON_INTERPRET=0 PYTHONPATH=<triton 3.6 wheel>:. python scan_specs.py"""
import os, sys, pytest
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_probe import ptxas, t
from fuse_attn.spec import AttentionSpec
from fuse_attn.kernels.autotune import KernelConfig

PICKS = {"_attn_fwd": [KernelConfig(128, 64, 8, 3), KernelConfig(64, 64, 4, 3)],
         "_attn_bwd_dq": [KernelConfig(128, 64, 8, 3), KernelConfig(128, 32, 4, 3)],
         "_attn_bwd_dkdv": [KernelConfig(64, 128, 8, 3), KernelConfig(32, 128, 8, 3), KernelConfig(64, 64, 4, 3)]}
for name, fields in t.SPECS.items():
    spec = AttentionSpec(**{"dtype": "bfloat16", "head_dim": 64, "head_dim_v": 64, "scale": 0.125, **fields})
    if spec.head_dim > 128 or spec.dtype == "float32":
        continue  # wide heads and fp32 take other candidates
    with pytest.MonkeyPatch.context() as mp:
        launches = t._captured_launches(spec, mp)
    for kernel, args in launches:
        for cfg in PICKS.get(kernel.fn.__name__, []):
            c = t._compile(kernel, dict(args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n), cfg, 90)
            verdict = ptxas(c, "scan").replace("Potential Performance Loss: wgmma.mma_async instructions are serialized due to", "SERIALIZED:")
            print(f"{name} | {kernel.fn.__name__} {cfg} | {verdict}", flush=True)
