source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 240 python3 -m pytest -q -x tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -3 | tee $OUT/gpu_tests_call1.log
OLD_FWD=.gpu/v18/old_fwd_5f0551e.py timeout 300 python3 benchmarks/2026-11-27-forward-query-pairs/paired_query_blocks_ab.py 2>&1 | tee $OUT/paired_ab_call1.log
