# Call 5: the whole-model step: Llama-3.2-1B's shape (16 layers, 32 heads of 64, GQA 4) at B8 N2048 through
# tools/bench_models.py, training and inference: sdpa+fuse_attn:ours (our kernels only), sdpa+fuse_attn (the
# product's default candidates: ours and SDPA's, the fastest timed) and sdpa+inductor (Hugging Face's default
# attention under torch.compile, the best peer in earlier runs).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
for variant in sdpa+fuse_attn:ours sdpa+fuse_attn sdpa+inductor; do
  TORCH_LOGS=fuse_attn timeout 150 python3 tools/bench_models.py --models llama-1b --lengths 2048 --modes train infer \
      --variants $variant --out $OUT/$variant > $OUT/$variant.log 2>&1
  grep -E "tokens/s" $OUT/$variant.log; grep -oE "runs (gluon|triton|sdpa_cudnn|sdpa_flash)" $OUT/$variant.log | sort | uniq -c
done
cat $OUT/*/bench_models.csv
