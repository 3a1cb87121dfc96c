# Call 4: which length of 1 Triton 3.6 cannot lower persistent (one_row_probe.py); then bert-d128 (16 heads of 128,
# unmasked) at B8 N2048 through tools/bench_models.py: ours (persistent, as committed), ours with one block a CTA, sdpa
# + torch.compile default, eager attention + torch.compile default.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-short-unmasked-forward
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 $D/one_row_probe.py 2>&1 | grep --line-buffered -E "^M[0-9]"
TORCH_LOGS=fuse_attn timeout 170 python3 tools/bench_models.py --models bert-d128 --lengths 2048 --modes infer train --variants sdpa+fuse_attn:ours --out $OUT/persistent > $OUT/persistent.log 2>&1; grep -E "tokens/s|\|" $OUT/persistent.log; grep -oE "runs (gluon|triton|sdpa_cudnn|sdpa_flash)" $OUT/persistent.log | sort | uniq -c
timeout 120 python3 $D/one_block_bench_models.py --models bert-d128 --lengths 2048 --modes infer train --variants sdpa+fuse_attn:ours --out $OUT/one_block 2>&1 | grep --line-buffered -E "tokens/s"
timeout 120 python3 tools/bench_models.py --models bert-d128 --lengths 2048 --modes infer train --variants sdpa+inductor inductor --out $OUT/inductor 2>&1 | grep --line-buffered -E "tokens/s"
cat $OUT/*/bench_models.csv
