# Fourth device call (the last of this session's budget): after dS stores were kept to head dim 128
# (hopper_backward._DS_MIN_HEAD_DIM, from call 3), the test row of a batch-broadcast bias in two launches at head
# dim 128, and issue 17's dense-bias row through the backend with the Gluon kernels competing (bench_variants).
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 90 python3 -m pytest -v tests/test_hopper_backward.py -k "520-sizes or chunks" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|passed|failed'
FUSE_ATTN_CANDIDATES=triton,gluon TORCH_LOGS=fuse_attn timeout 220 python3 tools/bench_variants.py --variants dense_bias --methods fuse_attn flex --out $OUT 2>&1 | grep --line-buffered -E "tuned impl|set aside|\|"
