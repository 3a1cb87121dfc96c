source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
FUSE_ATTN_AUTOTUNE=0 timeout 240 python3 -m pytest -x -q -p no:cacheprovider tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -n 3 | tee $OUT/gpu_tests.log
timeout 330 python3 .gpu/v16/d256.py 2>&1 | tee $OUT/d256.log
