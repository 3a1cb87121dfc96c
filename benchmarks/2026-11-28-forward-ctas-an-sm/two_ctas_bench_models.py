"""tools/bench_models.py with head dim 64's one-consumer forward config at two CTAs an SM, as before this session
(hopper_forward._ONE_CONSUMER_CTAS_AN_SM[64] = 2). Run from the repository root."""
import runpy, sys
import fuse_attn.kernels.hopper_forward as hf
hf._ONE_CONSUMER_CTAS_AN_SM[64] = 2
sys.argv = ["tools/bench_models.py", *sys.argv[1:]]
runpy.run_path("tools/bench_models.py", run_name="__main__")
