"""Compile the package's Gluon backward for sm90 (Triton 3.6 wheel on PYTHONPATH, TRITON_INTERPRET=0) at D causal(0/1) GQA [out-prefix]: ptxas -v summary; the TTGIR and PTX with a prefix."""
import sys, os, subprocess, tempfile
sys.path.insert(0, "/work/main/tests")
import torch, triton
import test_gpu_compile as t
from fuse_attn.kernels import hopper_backward as hb, autotune

def run(D, causal, group, dtype=torch.bfloat16, Mlen=300):
    q = torch.randn(2, 4, Mlen, D, dtype=dtype)
    k, v = (torch.randn(2, 4 // group, Mlen, D, dtype=dtype) for _ in range(2))
    launches = {}
    class Rec:
        def __init__(s, name): s.name = name
        def __getitem__(s, grid): return lambda *a, **kw: launches.setdefault(s.name, (a, kw))
    orig = hb._hopper_attn_bwd
    saved = {n: getattr(hb, n) for n in ("_hopper_attn_bwd", "_delta_kernel", "_dq_cast_kernel")}
    for n in saved:
        setattr(hb, n, Rec(n))
    lse = torch.randn(2, 4, Mlen)
    hb.hopper_backward(q.clone(), q, k, v, q.clone(), lse, D ** -0.5, causal, group)
    for n, f in saved.items():
        setattr(hb, n, f)
    args, kw = launches["_hopper_attn_bwd"]
    bm, bn, st = hb._CONFIGS[D]
    cfg = autotune.KernelConfig(bm, bn, kw["num_warps"], st)
    c = t._compile(orig, dict(zip(orig.arg_names, args)), cfg, 90)
    fname = os.path.join(tempfile.mkdtemp(), "k.ptx"); open(fname, "w").write(c.asm["ptx"])
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", fname, "-o", "/dev/null"], capture_output=True, text=True)
    info = " | ".join(l.split("ptxas info    :")[-1].strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l)
    print(f"D{D} causal={causal} G{group}: smem {c.metadata.shared} {info}", [l for l in r.stderr.splitlines() if "arning" in l][:2], flush=True)
    return c

if __name__ == "__main__":
    c = run(int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]))
    if len(sys.argv) > 4:
        open(sys.argv[4] + ".ttgir", "w").write(c.asm["ttgir"]); open(sys.argv[4] + ".ptx", "w").write(c.asm["ptx"])
