# Fifth device call (after the keys-contiguous copy of a strided bias and the score gradients followed through the graph): the whole model whose attentions add a bias, T5-small (12 of its 18 attentions add its learned
# [1, 8, N, N] relative position bias), training and inference at B4 N4096, against torch.compile default and HF's
# sdpa + torch.compile; the implementation choices in the log.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
TORCH_LOGS=fuse_attn timeout 540 python3 tools/bench_models.py --models t5 --lengths 4096 --modes train infer --variants fuse_attn inductor sdpa+inductor --out $OUT 2>&1 | grep -E "tuned impl|tokens/s|runs |\||device"
