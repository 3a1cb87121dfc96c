source .gpu/setup.sh
echo "=== PAD NEW"; FUSE_ATTN_CANDIDATES=triton python3 tools/bench_variants.py --out $OUT/new --variants padding_causal --methods fuse_attn flex 2>&1 | grep "^|" | tail -3
echo "=== PAD OLD2 (62a5f2d)"; OLD_PKG=.gpu/old_pkg2 FUSE_ATTN_CACHE_DIR=/tmp/fa_cache_old2 FUSE_ATTN_CANDIDATES=triton python3 .gpu/run_old.py tools/bench_variants.py --out $OUT/old2 --variants padding_causal --methods fuse_attn 2>&1 | grep "^|" | tail -3
echo "=== PAD NEW again"; FUSE_ATTN_CANDIDATES=triton python3 tools/bench_variants.py --out $OUT/new2 --variants padding_causal --methods fuse_attn 2>&1 | grep "^|" | tail -3
for v in new old; do
  if [ $v = new ]; then R="python3"; E="X=1"; VARS="fuse_attn inductor sdpa+inductor"; else R="python3 .gpu/run_old.py"; E="FUSE_ATTN_CACHE_DIR=/tmp/fa_cache_old"; VARS=fuse_attn; fi
  echo "=== MODELS $v"
  env $E FUSE_ATTN_CANDIDATES=triton $R tools/bench_models.py --out $OUT/m$v --models gpt2-small --modes train --lengths 1024 --batch-tokens 8192 --variants $VARS 2>&1 | grep -E "^\|" | tail -3
  env $E FUSE_ATTN_CANDIDATES=triton $R tools/bench_models.py --out $OUT/m$v --models bert-padded --modes train --lengths 512 --batch-tokens 16384 --variants $VARS 2>&1 | grep -E "^\|" | tail -3
done
