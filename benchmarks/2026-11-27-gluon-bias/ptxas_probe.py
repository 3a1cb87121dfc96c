"""ptxas -v of the Gluon kernels (Triton 3.6 on PYTHONPATH): probe.py direction name [bias] [sms] [outprefix]"""
import sys, os, subprocess, tempfile
sys.path.insert(0, "/work/main/tests")
import triton
import test_gpu_compile as t
d, name = sys.argv[1], sys.argv[2]
bias = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
sms = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "-" else None
c = t.compile_hopper(name, d, sms=sms, bias=bias)
out = sys.argv[5] if len(sys.argv) > 5 else tempfile.mkdtemp() + "/k"
open(out + ".ptx", "w").write(c.asm["ptx"])
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
r = subprocess.run([ptxas, "-arch=sm_90a", "-v", out + ".ptx", "-o", out + ".cubin"], capture_output=True, text=True)
info = " | ".join(l.split("ptxas info    :")[-1].strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l)
print(f"{d} {name} bias={bias}: {info}", [l for l in r.stderr.splitlines() if "arning" in l][:3], flush=True)
