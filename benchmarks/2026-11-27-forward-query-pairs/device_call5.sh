source .gpu/setup.sh
mkdir -p $OUT
timeout 120 python3 benchmarks/2026-11-27-forward-query-pairs/wall_per_call.py 2>&1 | tee $OUT/wall_per_call.log
timeout 420 python3 tools/bench_models.py --models llama-1b --lengths 2048 --modes infer train --batch-tokens 2048 --variants sdpa+inductor sdpa+fuse_attn:ours --out $OUT/models 2>&1 | tail -n 8
