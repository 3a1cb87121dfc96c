# Not run (written after the twenty-second session's device time was spent): the table gradient's tests added after
# call 3 on the GPU (symbolic lengths through the traced CUDA path, Hugging Face's T5, a graph without attention,
# checkpointed regions), the model zoo's GPU T5 tests, and where T5-small's training step goes now, kernel by kernel.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
FUSE_ATTN_AUTOTUNE=0 timeout 240 python3 -m pytest -q tests/test_embedding_backward.py 2>&1 | grep -E '^E  .{0,200}|passed|failed|^FAILED'
FUSE_ATTN_AUTOTUNE=0 timeout 120 python3 -m pytest -q tests/test_model_zoo.py -k "t5 and cuda" 2>&1 | grep -E '^E  .{0,200}|passed|failed|^FAILED'
timeout 200 python3 benchmarks/2026-11-28-gluon-bias-tma/model_profile.py --model t5 --length 4096 --batch 4 --mode train --variant fuse_attn --steps 2 --top 25 2>&1 | grep -v -i "warn\|profiler"
