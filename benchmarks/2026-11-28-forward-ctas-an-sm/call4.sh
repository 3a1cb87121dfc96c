# Call 4: ring stages of the three-CTA config (A/B); the table gradient's tests (last session's next_call.sh; call 2's
# 150 s limit ended them before their summary).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 150 python3 benchmarks/2026-11-28-forward-ctas-an-sm/ring_stages_ab.py 2>&1 | grep --line-buffered -v Warning
FUSE_ATTN_AUTOTUNE=0 timeout 280 python3 -m pytest -v tests/test_embedding_backward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|passed|failed|error'
