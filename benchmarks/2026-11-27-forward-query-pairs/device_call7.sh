source .gpu/setup.sh
mkdir -p $OUT
args="--models llama --lengths 4096 --modes train --batch-tokens 4096"
for run in nopair paired nopair paired; do
  script=tools/bench_models.py; [ $run = nopair ] && script=.gpu/v18/nopair_bench_models.py
  TORCH_LOGS=fuse_attn timeout 200 python3 $script $args --variants sdpa+fuse_attn:ours --out $OUT/llama_$run > $OUT/llama_$run.log 2>&1
  echo "$run: $(grep -c 'gluon' $OUT/llama_$run.log) log lines naming gluon; $(grep 'tokens/s' $OUT/llama_$run.log)"
done
timeout 200 python3 tools/bench_models.py $args --variants sdpa+inductor --out $OUT/llama_inductor 2>&1 | grep "tokens/s"
grep -m3 "gluon" $OUT/llama_paired.log | cut -c1-400
