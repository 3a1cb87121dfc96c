"""tools/bench_models.py with causal calls never on a persistent grid in the Gluon forward, as before this session
(hopper_forward.runs_persistent False where causal). Run from the repository root."""
import runpy, sys
import fuse_attn.kernels.hopper_forward as hf
RULE = hf.runs_persistent
hf.runs_persistent = lambda causal, *args: not causal and RULE(causal, *args)
sys.argv = ["tools/bench_models.py", *sys.argv[1:]]
runpy.run_path("tools/bench_models.py", run_name="__main__")
