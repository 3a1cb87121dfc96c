# Call 3: a whole model whose attentions take head dim 64's short causal config -- Llama-3.2-1B's shape (32 heads of
# 64, GQA 4) at N2048, B8 (16384 tokens a step) -- with our kernels only (the tuner's choice cached by the first run
# and reused by the second, so both run the same kernels but for the CTAs an SM), then sdpa + torch.compile default.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-forward-ctas-an-sm
TORCH_LOGS=fuse_attn timeout 250 python3 tools/bench_models.py --models llama-1b --lengths 2048 --modes infer train --variants sdpa+fuse_attn:ours --out $OUT/three > $OUT/three.log 2>&1; grep -E "tokens/s|\|" $OUT/three.log; grep -oE "runs (gluon|triton|sdpa_cudnn|sdpa_flash)" $OUT/three.log | sort | uniq -c
timeout 160 python3 $D/two_ctas_bench_models.py --models llama-1b --lengths 2048 --modes infer train --variants sdpa+fuse_attn:ours --out $OUT/two 2>&1 | grep --line-buffered -E "tokens/s|\|"
timeout 160 python3 tools/bench_models.py --models llama-1b --lengths 2048 --modes infer train --variants sdpa+inductor --out $OUT/inductor 2>&1 | grep --line-buffered -E "tokens/s|\|"
cat $OUT/*/bench_models.csv
