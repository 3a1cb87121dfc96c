source .gpu/setup.sh
mkdir -p $OUT
timeout 230 python3 tools/bench_attention.py --out $OUT/template --skip-check --lengths 4096 --head-dims 128 64 --methods ours "SDPA cuDNN" 2>&1 | tail -n 14
