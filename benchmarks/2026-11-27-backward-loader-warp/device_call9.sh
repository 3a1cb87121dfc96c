# the committed backward before key tiles were paired (395d771), in the package, for the same model step
cp .gpu/v17/hopper_backward_395d771.py fuse_attn/kernels/hopper_backward.py
source .gpu/setup.sh
mkdir -p $OUT
timeout 400 python3 tools/bench_models.py --out $OUT/models_395d771 --models llama-1b --lengths 4096 --modes train --batch-tokens 8192 --variants sdpa+fuse_attn:ours 2>&1 | grep "tokens/s\|runs"
