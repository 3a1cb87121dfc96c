"""compile the package's Gluon forward for sm90 at a config: D causal(0/1) cfg(a,b,c,d,e) [rows] [maxnreg]"""
import sys, os, subprocess, tempfile
sys.path.insert(0, "/work/main/tests")
import torch, triton
import test_gpu_compile as t
from fuse_attn.kernels import autotune
import importlib.util as iu; _s = iu.spec_from_file_location("fuse_attn.kernels.rb_fwd", "/tmp/rb/rb_kernel.py"); hf = iu.module_from_spec(_s); _s.loader.exec_module(hf)
from fuse_attn.spec import AttentionSpec, CausalMask
D, causal, cfg = int(sys.argv[1]), sys.argv[2] == "1", tuple(int(x) for x in sys.argv[3].split(","))
rows = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
hf.forward_config = lambda *a: cfg
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
q = torch.randn(2, 4, rows, D, dtype=torch.bfloat16); k = q.clone(); v = q.clone()
launches = {}
class Rec:
    def __getitem__(s, grid): return lambda *a, **kw: launches.setdefault("k", (a, kw))
orig = hf._hopper_attn_fwd
hf._hopper_attn_fwd = Rec(); hf.hopper_forward(q, k, v, spec); hf._hopper_attn_fwd = orig
args, kw = launches["k"]
bound = dict(zip(orig.arg_names, args))
kc = autotune.KernelConfig(cfg[0], cfg[1], kw["num_warps"], cfg[2])
c = t._compile(orig, bound, kc, 90, kw.get("maxnreg"))
d = tempfile.mkdtemp(); fname = os.path.join(d, "k.ptx"); open(fname, "w").write(c.asm["ptx"])
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
r = subprocess.run([os.path.join(bindir, "ptxas"), "-arch=sm_90a", "-v", fname, "-o", d + "/k.cubin"], capture_output=True, text=True)
info = " | ".join(l.split("ptxas info    :")[-1].strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l)
print(f"D{D} causal={causal} cfg={cfg} maxnreg={kw.get('maxnreg')}: smem {c.metadata.shared} {info}")
print("  setmaxnreg:", sorted(set(l.strip() for l in c.asm["ptx"].splitlines() if "setmaxnreg" in l)))
print("  warnings:", [l for l in r.stderr.splitlines() if "arning" in l][:3])
sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", d + "/k.cubin"], capture_output=True, text=True).stdout
print("  DEPBAR:", sass.count("WARPGROUP.DEPBAR"), "HGMMA:", sass.count("HGMMA"))
open("/tmp/gf/last.sass","w").write(sass)
