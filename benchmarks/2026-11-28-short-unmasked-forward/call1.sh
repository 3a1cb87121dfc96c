# Call 1: one-consumer configs for short unmasked calls (A/B), the plain rows on this GPU, then both Gluon test files
# whole on the last session's final code (91246f8: its last cleanups not run on a GPU), each test printed as it ends.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 benchmarks/2026-11-28-short-unmasked-forward/one_consumer_unmasked_ab.py 2>&1 | grep --line-buffered -v Warning
timeout 170 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 4096 16384 2>&1 | grep --line-buffered -v Warning
timeout 290 python3 -m pytest -v tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
