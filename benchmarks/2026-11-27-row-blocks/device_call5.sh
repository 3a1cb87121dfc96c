source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 200 python3 .gpu/v16/bwd_tiles_ab.py 2>&1 | tee $OUT/bwd_tiles_ab.log
timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | tail -n 3 | tee $OUT/gpu_tests.log
