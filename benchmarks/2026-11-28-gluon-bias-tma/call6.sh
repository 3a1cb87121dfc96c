# Sixth device call (after the choice times a learned bias's gradient and keys on the bias's TMA layout): the two
# bias rows of issue 17 compiled, the choices in the log.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
FUSE_ATTN_CANDIDATES=triton,gluon TORCH_LOGS=fuse_attn timeout 200 python3 tools/bench_variants.py --variants alibi_causal_precomputed dense_bias --methods fuse_attn flex --out $OUT 2>&1 | grep -E "tuned|\|" | head -30
