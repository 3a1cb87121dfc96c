source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 170 python3 -m pytest -x -q -p no:cacheprovider tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | tail -n 3 | tee $OUT/gpu_tests.log
OLD_BWD=.gpu/old_bwd.py timeout 200 python3 benchmarks/2026-11-27-gluon-forward-configs/deferred_bwd_ab.py full causal 2>&1 | tee $OUT/bwd_ab.log
FUSE_ATTN_CANDIDATES=triton,gluon timeout 150 python3 tools/bench_variants.py --variants gqa_causal --methods fuse_attn cudnn --out $OUT/gqa 2>&1 | tail -n 12
