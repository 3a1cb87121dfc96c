source .gpu/setup.sh
C=("causal D64 N1024 B8 H12" "full D64 N512 B32 H12" "causal D128" "window1024 D128" "full D128")
echo "=== NEW"; python3 .gpu/delta_ab.py "${C[@]}" 2>&1 | grep -v -i warn | tail -7
echo "=== OLD"; FUSE_ATTN_CACHE_DIR=/tmp/fa_cache_old python3 .gpu/run_old.py .gpu/delta_ab.py "${C[@]}" 2>&1 | grep -v -i warn | tail -7
echo "=== VARIANTS NEW"; FUSE_ATTN_CANDIDATES=triton python3 tools/bench_variants.py --out $OUT/new --variants window_causal --methods fuse_attn flex 2>&1 | grep "^|" | tail -2
echo "=== SWEEP"; timeout 200 python3 tools/bench_attention.py --out $OUT/sweep --skip-speed 2>&1 | grep -v -i warn | tail -16
