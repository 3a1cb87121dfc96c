source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 150 python3 -m pytest -q -x tests/test_hopper_forward.py 2>&1 | tail -2 | tee $OUT/gpu_tests_forward_final.log
OLD_FWD=.gpu/v18/old_fwd_5f0551e.py timeout 330 python3 benchmarks/2026-11-27-forward-query-pairs/paired_query_blocks_ab.py product 2>&1 | tee $OUT/paired_ab_product_final.log
