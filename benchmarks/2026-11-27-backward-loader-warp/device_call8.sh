source .gpu/setup.sh
mkdir -p $OUT
timeout 560 python3 tools/bench_models.py --out $OUT/models --models llama-1b --lengths 4096 --modes train --batch-tokens 8192 --variants sdpa+inductor sdpa+fuse_attn:ours inductor 2>&1 | tail -n 25
