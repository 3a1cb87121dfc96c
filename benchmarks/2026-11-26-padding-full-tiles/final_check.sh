source .gpu/setup.sh
export PYTHONWARNINGS=ignore
timeout 130 python3 tools/bench_attention.py --skip-speed --out $OUT/sweep > $OUT/sweep.log 2>&1; grep -E "PASS|FAIL|sweep" $OUT/sweep.log | tail -16
timeout 110 python3 tools/bench_variants.py --check --variants padding_causal padding_causal_mask_input window_causal --modes fwd --methods fuse_attn --seq 512 --out $OUT/var > $OUT/var.log 2>&1; grep -E "^check|device" $OUT/var.log
