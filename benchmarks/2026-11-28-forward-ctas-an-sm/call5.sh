# Call 5: the table gradient's golden-graph test on the GPU machine after its fix (its tensors on the device the
# table's kernel runs on: call 4 had them on the CPU, where only the interpreter runs that kernel).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
FUSE_ATTN_AUTOTUNE=0 timeout 200 python3 -m pytest -v tests/test_embedding_backward.py -k "Golden or handles" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|passed|failed|error'
