source .gpu/setup.sh
mkdir -p $OUT
timeout 400 python3 tools/bench_models.py --out $OUT/models --models llama --lengths 1024 4096 --modes train --variants sdpa+inductor sdpa+fuse_attn:ours 2>&1 | tail -8
