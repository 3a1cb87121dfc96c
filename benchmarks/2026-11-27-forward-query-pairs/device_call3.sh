source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
OLD_FWD=.gpu/v18/old_fwd_5f0551e.py timeout 280 python3 benchmarks/2026-11-27-forward-query-pairs/paired_query_blocks_ab.py boundary 2>&1 | tee $OUT/paired_boundary_ab.log
