# Call 3: the persistent grid as committed (5570fde + the bert-d128 model): the forward's GPU test file (D128
# unmasked calls now persistent, a new test of many blocks a CTA), then the package against one block a CTA.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -v tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
timeout 150 python3 benchmarks/2026-11-28-short-unmasked-forward/persistent_rule_ab.py 2>&1 | grep --line-buffered -v Warning
