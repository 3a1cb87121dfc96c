source .gpu/setup.sh
mkdir -p $OUT
timeout 200 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 2>&1 | tee $OUT/product_rows.log
timeout 60 python3 benchmarks/2026-11-27-dq-tma-reduce/probe.py host 2>&1 | tee $OUT/host_cost.log
timeout 250 python3 tools/bench_models.py --out $OUT/models --models llama --lengths 4096 --modes train --variants sdpa+inductor sdpa+fuse_attn:ours 2>&1 | tail -n 6
