# bias_tma.patch applied first where the tree lacks it (README). First device call of the session: the GPU tests of the Gluon kernels (the bias cases by TMA among them), then the
# timings, then the compiled path of the two bias rows (the choice's pick in the log).
set -x
P=benchmarks/2026-11-28-gluon-bias-tma/bias_tma.patch
grep -q "def _bias_by_tma" fuse_attn/kernels/hopper_forward.py || git apply $P || patch -p1 < $P
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 200 python3 -m pytest -q tests/test_hopper_backward.py -k "added_bias" 2>&1 | grep -E "^E  .{0,200}|passed|failed" | head -20
timeout 200 python3 benchmarks/2026-11-28-gluon-bias-tma/bias_tma_bench.py 2>&1 | grep -v Warning
FUSE_ATTN_CANDIDATES=triton,gluon TORCH_LOGS=fuse_attn timeout 150 python3 tools/bench_variants.py --variants alibi_causal_precomputed dense_bias --methods fuse_attn flex --out $OUT 2>&1 | grep -E "chose|gluon|\|" | head -30
