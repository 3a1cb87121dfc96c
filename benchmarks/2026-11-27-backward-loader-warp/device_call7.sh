source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 200 python3 -m pytest -q -x tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | tail -3 | tee $OUT/gpu_tests_final.log
OLD_BWD=.gpu/v17/old_bwd_395d771.py timeout 200 python3 benchmarks/2026-11-27-backward-loader-warp/paired_key_tiles_ab.py 2>&1 | tee $OUT/paired_when_few_ctas_ab.log
timeout 150 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 4096 16384 2>&1 | tee $OUT/product_rows_final.log
FUSE_ATTN_CANDIDATES=triton,gluon timeout 150 python3 tools/bench_variants.py --variants gqa_causal --methods fuse_attn cudnn --out $OUT/gqa 2>&1 | tail -n 12
