source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 200 python3 -m pytest -q -x tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | tail -3 | tee $OUT/gpu_tests_paired.log
OLD_BWD=.gpu/v17/old_bwd_395d771.py timeout 300 python3 benchmarks/2026-11-27-backward-loader-warp/paired_key_tiles_ab.py 2>&1 | tee $OUT/paired_key_tiles_ab.log
