# Third device call: the table gradient's tests on the GPU (call 2's run of them hit its 150 s limit: every compiled
# test tuned its attention; here FUSE_ATTN_AUTOTUNE=0), then BERT-base with padding in training, whose 2-row
# token-type table the rewrite now gives the same kernel, against torch.compile default and sdpa + torch.compile.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
FUSE_ATTN_AUTOTUNE=0 timeout 280 python3 -m pytest -q tests/test_embedding_backward.py 2>&1 | grep -E '^E  .{0,200}|passed|failed|^FAILED'
TORCH_LOGS=fuse_attn timeout 250 python3 tools/bench_models.py --models bert-padded --modes train --variants fuse_attn inductor sdpa+inductor --out $OUT 2>&1 | grep -E "table_gradient|tokens/s|\||device"
