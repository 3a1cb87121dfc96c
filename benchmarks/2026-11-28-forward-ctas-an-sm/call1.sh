# Call 1: the A/B of more CTAs an SM (first: it is short), then both Gluon test files whole on the last session's
# final code (b2e6b3f: not run on a GPU), each test printed as it ends.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/2026-11-28-forward-ctas-an-sm/ctas_an_sm_ab.py 2>&1 | grep --line-buffered -v Warning
timeout 330 python3 -m pytest -v tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
