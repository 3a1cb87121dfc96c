source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 200 python3 -m pytest -q -x tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -2 | tee $OUT/gpu_tests_final.log
