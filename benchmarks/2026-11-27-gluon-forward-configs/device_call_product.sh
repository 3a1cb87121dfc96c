source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
R=benchmarks/2026-11-27-gluon-forward-configs
mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -4 | tee $OUT/gpu_tests.log
timeout 200 python3 $R/product_rows.py 2>&1 | tee $OUT/product_rows.log
timeout 180 python3 tools/bench_models.py --out $OUT/models --models gpt2 --lengths 4096 --modes train --variants sdpa+inductor sdpa+fuse_attn:ours 2>&1 | tail -8
