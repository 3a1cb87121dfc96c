source .gpu/setup.sh
export PYTHONWARNINGS=ignore
FUSE_ATTN_CACHE_DIR=/tmp/c_old TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old timeout 170 python3 .gpu/run_old.py tools/bench_variants.py --variants padding_causal --methods fuse_attn --out $OUT/old > $OUT/old.log 2>&1; grep -E "package|padding_causal \|" $OUT/old.log
FUSE_ATTN_CACHE_DIR=/tmp/c_new TORCHINDUCTOR_CACHE_DIR=/tmp/ind_new timeout 200 python3 tools/bench_variants.py --variants padding_causal --methods fuse_attn flex sdpa_mask --out $OUT/new > $OUT/new.log 2>&1; tail -5 $OUT/new.log
