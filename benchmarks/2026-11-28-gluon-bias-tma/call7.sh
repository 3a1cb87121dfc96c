# Not run yet (written in the twenty-first session, after its device time was spent): where T5-small's training step
# goes, kernel by kernel, under fuse_attn and torch.compile default (the attentions are ~33 ms of a 406 ms step).
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
for variant in fuse_attn inductor; do
  timeout 280 python3 benchmarks/2026-11-28-gluon-bias-tma/model_profile.py --model t5 --length 4096 --batch 4 --mode train --variant $variant --steps 2 --top 25 2>&1 | grep -v -i "warn\|profiler"
done
