source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 150 python3 -m pytest -q -x tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -3 | tee $OUT/gpu_tests_spare_consumers.log
OLD_FWD=.gpu/v17/old_fwd_kernel.py timeout 300 python3 benchmarks/2026-11-27-backward-loader-warp/spare_consumers_ab.py 2>&1 | tee $OUT/spare_consumers_ab.log
