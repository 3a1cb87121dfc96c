"""ptxas -v of the Gluon forward with a bias at a forced config: probe_cfg.py name bias BM BN STAGES CONSUMERS"""
import sys, os, subprocess, tempfile
sys.path.insert(0, "/work/main/tests")
import triton
import test_gpu_compile as t
from fuse_attn.kernels import hopper_forward as hf
name, bias = sys.argv[1], sys.argv[2]
cfg = tuple(int(x) for x in sys.argv[3:7])
hf.forward_config = lambda *a, **k: cfg
c = t.compile_hopper(name, "forward", bias=bias)
out = tempfile.mkdtemp() + "/k"
open(out + ".ptx", "w").write(c.asm["ptx"])
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
r = subprocess.run([ptxas, "-arch=sm_90a", "-v", out + ".ptx", "-o", out + ".cubin"], capture_output=True, text=True)
info = " | ".join(l.split("ptxas info    :")[-1].strip() for l in r.stderr.splitlines() if "spill" in l)
print(f"{name} {cfg} smem {c.metadata.shared}: {info}", [l[:80] for l in r.stderr.splitlines() if "arning" in l][:2], flush=True)
