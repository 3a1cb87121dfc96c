source .gpu/setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 tools/profile_kernels.py --shape 4,8,4096,256 --causal > $OUT/prof_d256_causal.txt 2>$OUT/prof_d256_causal.err; grep -v INFO $OUT/prof_d256_causal.txt | head -70
FUSE_ATTN_CACHE_DIR=/tmp/c_old python3 .gpu/old_wide.py tools/bench_variants.py --variants softcap_causal_d256 --methods fuse_attn --out $OUT/old > $OUT/old.log 2>&1; tail -8 $OUT/old.log
FUSE_ATTN_CACHE_DIR=/tmp/c_new python3 tools/bench_variants.py --variants softcap_causal_d256 --out $OUT/new > $OUT/new.log 2>&1; tail -8 $OUT/new.log
