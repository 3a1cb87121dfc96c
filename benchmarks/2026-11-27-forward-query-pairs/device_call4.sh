source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 150 python3 -m pytest -q -x tests/test_hopper_forward.py 2>&1 | tail -2 | tee $OUT/gpu_tests_forward_final.log
FUSE_ATTN_CANDIDATES=triton,gluon timeout 400 python3 tools/bench_variants.py --variants alibi_causal_precomputed dense_bias padding_causal_mask_input --methods fuse_attn flex sdpa_mask --out $OUT/variants_a 2>&1 | tail -n 14
