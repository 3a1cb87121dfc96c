source .gpu/setup.sh
mkdir -p $OUT
timeout 280 python3 .gpu/v18/nopair_bench_models.py --models llama-1b --lengths 2048 --modes infer train --batch-tokens 2048 --variants sdpa+fuse_attn:ours --out $OUT/models_nopair 2>&1 | grep "tokens/s"
timeout 280 python3 tools/bench_models.py --models llama-1b --lengths 2048 --modes infer train --batch-tokens 2048 --variants sdpa+fuse_attn:ours --out $OUT/models_paired 2>&1 | grep "tokens/s"
