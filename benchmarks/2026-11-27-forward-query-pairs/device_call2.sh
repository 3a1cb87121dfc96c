source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 240 python3 -m pytest -q -x tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -3 | tee $OUT/gpu_tests_call2.log
OLD_FWD=.gpu/v18/old_fwd_5f0551e.py timeout 200 python3 benchmarks/2026-11-27-forward-query-pairs/paired_query_blocks_ab.py boundary 2>&1 | tee $OUT/paired_boundary_ab_call2.log
timeout 150 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 4096 16384 2>&1 | tee $OUT/product_rows.log
