source .gpu/setup.sh
echo "=== NEW"; FUSE_ATTN_CANDIDATES=triton python3 tools/bench_variants.py --out $OUT/new --variants window_causal padding_causal --methods fuse_attn flex 2>&1 | grep "^|" | tail -4
echo "=== OLD"; FUSE_ATTN_CACHE_DIR=/tmp/fa_cache_old FUSE_ATTN_CANDIDATES=triton python3 .gpu/run_old.py tools/bench_variants.py --out $OUT/old --variants window_causal padding_causal --methods fuse_attn 2>&1 | grep "^|" | tail -4
echo "=== NEW again"; FUSE_ATTN_CANDIDATES=triton python3 tools/bench_variants.py --out $OUT/new2 --variants window_causal --methods fuse_attn 2>&1 | grep "^|" | tail -2
echo "=== OTHERS"; FUSE_ATTN_CANDIDATES=triton timeout 200 python3 tools/bench_variants.py --out $OUT/others --variants alibi_causal_precomputed padding_causal_mask_input --methods fuse_attn flex 2>&1 | grep "^|" | tail -4
