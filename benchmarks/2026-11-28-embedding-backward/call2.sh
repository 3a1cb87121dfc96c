# Second device call: the few-row table gradient (24a0cb8 + its tests) on the GPU -- its tests, the launch-settings
# sweep and the comparison at T5's shapes (table_gradient_bench.py), then T5-small's training step against
# torch.compile default and sdpa + torch.compile.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 150 python3 -m pytest -q tests/test_embedding_backward.py 2>&1 | grep -E '^E  .{0,200}|passed|failed|^FAILED'
timeout 170 python3 benchmarks/2026-11-28-embedding-backward/table_gradient_bench.py --sweep 2>&1 | grep -v -i warn
TORCH_LOGS=fuse_attn timeout 300 python3 tools/bench_models.py --models t5 --lengths 4096 --modes train --variants fuse_attn inductor sdpa+inductor --out $OUT 2>&1 | grep -E "table_gradient|tuned impl|tokens/s|\||device"
