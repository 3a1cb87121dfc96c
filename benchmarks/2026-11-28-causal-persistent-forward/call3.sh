# Call 3: configs against each other under their launches (config_ab.py: D128 causal one vs two consumers, D64
# unmasked on one, two or three consumers); then llama-1b (causal D64, GQA 4) at B8 N2048 inference through
# tools/bench_models.py: ours (the causal persistent grid as committed), ours without it, sdpa + torch.compile
# default, eager attention + torch.compile default.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-causal-persistent-forward
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 $D/config_ab.py 2>&1 | grep --line-buffered -v Warning
TORCH_LOGS=fuse_attn timeout 130 python3 tools/bench_models.py --models llama-1b --lengths 2048 --modes infer --variants sdpa+fuse_attn:ours --out $OUT/persistent > $OUT/persistent.log 2>&1; grep -E "tokens/s" $OUT/persistent.log; grep -oE "runs (gluon|triton|sdpa_cudnn|sdpa_flash)" $OUT/persistent.log | sort | uniq -c
timeout 100 python3 $D/no_causal_persistent_bench_models.py --models llama-1b --lengths 2048 --modes infer --variants sdpa+fuse_attn:ours --out $OUT/one_block 2>&1 | grep --line-buffered -E "tokens/s"
timeout 130 python3 tools/bench_models.py --models llama-1b --lengths 2048 --modes infer --variants sdpa+inductor inductor --out $OUT/inductor 2>&1 | grep --line-buffered -E "tokens/s"
cat $OUT/*/bench_models.csv
