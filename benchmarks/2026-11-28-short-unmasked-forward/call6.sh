# Call 6: the Gluon forward's bias paths after the refactor (the bias's head and TMA coordinates now taken per block
# in each partition): the bias tests of the backward's GPU file, which run the Gluon forward with each bias.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -v tests/test_hopper_backward.py -k "bias" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
