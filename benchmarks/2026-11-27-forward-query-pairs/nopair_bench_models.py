"""tools/bench_models.py with the forward's query-block pairing off (hopper_forward._PAIR_UP_TO_WAVES = 0)."""
import runpy, sys
import fuse_attn.kernels.hopper_forward as hf
hf._PAIR_UP_TO_WAVES = 0
sys.argv = ["tools/bench_models.py", *sys.argv[1:]]
runpy.run_path("tools/bench_models.py", run_name="__main__")
