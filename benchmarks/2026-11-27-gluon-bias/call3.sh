set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 150 python3 -m pytest -q tests/test_hopper_backward.py -k "added_bias" 2>&1 | grep -E "^E  .{0,200}|passed|failed" | head -20
timeout 200 python3 .gpu/v19/bias_probe.py timing 2>&1 | grep -v Warning
