# Third device call: after the chunk rule's change (the dQ accumulator counted, equal launches), the bias rows of the
# Gluon backward's tests, the op-level comparison with the no-gradient line, and issue 17's dense-bias row through
# the backend (bench_variants: fuse_attn's choice against Flex, time and memory).
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 200 python3 -m pytest -v -x tests/test_hopper_backward.py -k "added_bias or chunks or fake" 2>&1 | grep --line-buffered -E '^E  .{0,200}|FAILED|passed|failed'
timeout 300 python3 benchmarks/2026-11-28-gluon-bias-gradient/bias_gradient_bench.py 2>&1 | grep --line-buffered -v -i "warn"
TORCH_LOGS=fuse_attn timeout 200 python3 tools/bench_variants.py --variants dense_bias --methods fuse_attn flex --out $OUT 2>&1 | grep --line-buffered -E "tuned impl|\|"
