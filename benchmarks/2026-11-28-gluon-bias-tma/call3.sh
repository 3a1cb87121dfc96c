# Third device call (the branch with _BIAS_TMA_CONFIGS: 64-key tiles at 4 stages where the bias comes by TMA): the
# bias tests of the Gluon kernels, bias_tma_bench.py (its "bias by TMA" row is now that config, as is its forced
# 64-key row), and the compiled path of the two bias rows.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 200 python3 -m pytest -q tests/test_hopper_backward.py tests/test_hopper_forward.py -k "bias" 2>&1 | grep -E "^E  .{0,200}|passed|failed|^FAILED" | head -20
timeout 150 python3 benchmarks/2026-11-28-gluon-bias-tma/bias_tma_bench.py 2>&1 | grep -v Warning
FUSE_ATTN_CANDIDATES=triton,gluon TORCH_LOGS=fuse_attn timeout 150 python3 tools/bench_variants.py --variants alibi_causal_precomputed dense_bias --methods fuse_attn flex --out $OUT 2>&1 | grep -E "tuned|\|" | head -30
