"""Compile kernels of a spec for sm90 with tests/test_gpu_compile._compile (as a launch specializes them) and print
Triton's shared memory and ptxas's verdict: registers, spills and wgmma serialization warnings (C7512 / C7515).

    HD=128 TRITON_INTERPRET=0 PYTHONPATH=<triton 3.6 wheel>:. python compile_probe.py causal|window|full \
        _attn_bwd_dkdv[,_attn_bwd_dq,...] 64x128x8x3[,32x128x8x3,...]    (BLOCK_M x BLOCK_N x warps x stages)

ptxas: the one bundled with that Triton (third_party bin)."""
import os, sys, subprocess, tempfile, pytest, triton
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
import test_gpu_compile as t
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.kernels.autotune import KernelConfig

def ptxas(c, tag):
    fn = os.path.join(tempfile.mkdtemp(), f"{tag}.ptx")
    open(fn, "w").write(c.asm["ptx"])
    r = subprocess.run([os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"), "-arch=sm_90a", "-v", fn, "-o", "/dev/null"], capture_output=True, text=True)
    return " | ".join(l.split("ptxas info    :")[-1].strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l or "C75" in l)

if __name__ == "__main__":
    which = sys.argv[1]  # causal | window | full | a name of tests/test_gpu_compile.SPECS
    kernels = sys.argv[2].split(",")
    cfgs = [KernelConfig(*map(int, c.split("x"))) for c in sys.argv[3].split(",")]  # e.g. 64x128x8x3
    hd = int(os.environ.get("HD", "128"))
    if which in t.SPECS:  # a spec of tests/test_gpu_compile.py, at head dim HD unless it names its own
        spec = AttentionSpec(**{"dtype": "bfloat16", "head_dim": hd, "head_dim_v": hd, "scale": hd ** -0.5, **t.SPECS[which]})
    else:
        causal = {"causal": CausalMask(), "window": CausalMask(window=1024), "full": None}[which]
        spec = AttentionSpec(dtype="bfloat16", head_dim=hd, head_dim_v=hd, scale=hd ** -0.5, causal=causal)
    with pytest.MonkeyPatch.context() as mp:
        launches = t._captured_launches(spec, mp)
    for kernel, args in launches:
        if kernel.fn.__name__ not in kernels:
            continue
        for cfg in cfgs:
            c = t._compile(kernel, dict(args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n), cfg, 90)
            print(f"D{hd}", which, kernel.fn.__name__, cfg, "smem", c.metadata.shared, ptxas(c, f"{which}_{kernel.fn.__name__}_{cfg.block_m}x{cfg.block_n}"), flush=True)

