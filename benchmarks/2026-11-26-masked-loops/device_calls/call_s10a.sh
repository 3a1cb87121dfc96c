source .gpu/setup.sh
C=("full D128" "full D64 N512 B32 H12" "causal D128" "window1024 D128" "causal D64")
echo "=== NEW"; python3 .gpu/delta_ab.py "${C[@]}" 2>&1 | grep -v -i warn | tail -7
echo "=== OLD"; FUSE_ATTN_CACHE_DIR=/tmp/fa_cache_old python3 .gpu/run_old.py .gpu/delta_ab.py "${C[@]}" 2>&1 | grep -v -i warn | tail -7
echo "=== VARIANTS NEW"; FUSE_ATTN_CANDIDATES=triton python3 tools/bench_variants.py --out $OUT/new --variants padding_causal window_causal --methods fuse_attn flex 2>&1 | grep -v -i warn | tail -10
echo "=== VARIANTS OLD"; FUSE_ATTN_CACHE_DIR=/tmp/fa_cache_old FUSE_ATTN_CANDIDATES=triton python3 .gpu/run_old.py tools/bench_variants.py --out $OUT/old --variants padding_causal window_causal --methods fuse_attn 2>&1 | grep -v -i warn | tail -10
