# Call 5: the final rule (no persistent grid for one query row): the forward's GPU test file, then the plain rows at
# N1024 / 2048 as the product launches them.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -v tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
timeout 120 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 2>&1 | grep --line-buffered -v Warning
