# First device call of the twenty-second session: the twenty-first session's call7 (where T5-small's training step
# goes, kernel by kernel, fuse_attn and torch.compile default) and call6 (issue 17's two bias rows after the choice
# keys on the bias's TMA layout and times a learned bias's gradient).
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
for variant in fuse_attn inductor; do
  timeout 200 python3 benchmarks/2026-11-28-gluon-bias-tma/model_profile.py --model t5 --length 4096 --batch 4 --mode train --variant $variant --steps 2 --top 25 2>&1 | grep -v -i "warn\|profiler"
done
FUSE_ATTN_CANDIDATES=triton,gluon TORCH_LOGS=fuse_attn timeout 180 python3 tools/bench_variants.py --variants alibi_causal_precomputed dense_bias --methods fuse_attn flex --out $OUT 2>&1 | grep -E "tuned|\|" | head -30
