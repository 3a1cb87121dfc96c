# First device call: the Gluon backward's bias gradient (8eecf65) -- its GPU tests (the bias rows with gradients, and
# the rest of the Gluon backward's), the tests the last session could not run on the GPU (the table gradient's, the
# zoo's T5), then the op-level comparison (bias_gradient_bench.py).
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | grep -E '^E  .{0,200}|passed|failed|^FAILED'
FUSE_ATTN_AUTOTUNE=0 timeout 150 python3 -m pytest -q tests/test_embedding_backward.py 2>&1 | grep -E '^E  .{0,200}|passed|failed|^FAILED'
FUSE_ATTN_AUTOTUNE=0 timeout 100 python3 -m pytest -q tests/test_model_zoo.py -k "t5 and cuda" 2>&1 | grep -E '^E  .{0,200}|passed|failed|^FAILED'
timeout 240 python3 benchmarks/2026-11-28-gluon-bias-gradient/bias_gradient_bench.py 2>&1 | grep -v -i "warn"
