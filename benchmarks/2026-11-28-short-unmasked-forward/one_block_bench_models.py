"""tools/bench_models.py with one query block a CTA in the Gluon forward everywhere, as before this session
(hopper_forward.runs_persistent always False). Run from the repository root."""
import runpy, sys
import fuse_attn.kernels.hopper_forward as hf
hf.runs_persistent = lambda *args: False
sys.argv = ["tools/bench_models.py", *sys.argv[1:]]
runpy.run_path("tools/bench_models.py", run_name="__main__")
