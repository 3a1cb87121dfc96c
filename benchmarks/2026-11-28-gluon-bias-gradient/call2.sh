# Second device call: call 1 ran out of its 600 s with nothing printed (each step's timeout killed its pytest before a
# summary, and the run's limit killed the benchmark with grep's buffer unflushed). The same checks, fewer, with each
# test's result printed as it ends: the Gluon backward's bias rows and the op-level comparison.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 240 python3 -m pytest -v -x tests/test_hopper_backward.py -k "added_bias or chunks or fake" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|passed|failed'
timeout 250 python3 benchmarks/2026-11-28-gluon-bias-gradient/bias_gradient_bench.py 2>&1 | grep --line-buffered -v -i "warn"
