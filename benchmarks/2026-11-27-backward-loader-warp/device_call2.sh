source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 150 python3 -m pytest -q -x tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | tail -3 | tee $OUT/gpu_tests.log
OLD_BWD=.gpu/v17/old_bwd.py timeout 150 python3 benchmarks/2026-11-27-gluon-forward-configs/deferred_bwd_ab.py full causal 2>&1 | tee $OUT/loader_warp_d128_ab.log
timeout 240 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 4096 16384 2>&1 | tee $OUT/product_rows.log
