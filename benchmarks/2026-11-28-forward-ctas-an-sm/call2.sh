# Call 2, on the committed three CTAs an SM: the forward's GPU tests whole; the A/B against two CTAs, plain and with a
# bias, with wall time per eager call; the table gradient's tests (last session's next_call.sh).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 150 python3 benchmarks/2026-11-28-forward-ctas-an-sm/three_ctas_ab.py 2>&1 | grep --line-buffered -v Warning
timeout 230 python3 -m pytest -v tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
FUSE_ATTN_AUTOTUNE=0 timeout 150 python3 -m pytest -v tests/test_embedding_backward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|FAILED|passed|failed'
