# Prepared for the next session's first device call (not run in this one: its device time was spent): the change
# after the scorecard (bb433b1: under CUDA graphs the Gluon kernels are offered at every size) on the GPU -- its
# test (a small training graph on the Gluon kernels recorded and replayed by CUDA graph trees), the choice's tests,
# test_compose's CUDA graph modes -- then GPT-2 small and Llama-1B's shape with every variant under
# --compile-mode reduce-overhead against the default mode (bench_models).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 150 python3 -m pytest -v tests/test_hopper_forward.py tests/test_compose.py tests/test_implementations.py \
    -k "replayed_as_cuda_graphs or compiled_graph or cuda_graphs" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
for mode in default reduce-overhead; do
  TORCH_LOGS=fuse_attn timeout 200 python3 tools/bench_models.py --models gpt2-small --lengths 1024 --modes train infer \
      --variants sdpa+fuse_attn sdpa+inductor --compile-mode $mode --out $OUT 2>&1 | grep --line-buffered -E "tokens/s|attention\(s\) runs"
done
cat $OUT/bench_models.csv
