set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 240 python3 -m pytest -q tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -6
timeout 240 python3 .gpu/v19/bias_probe.py timing 2>&1 | grep -v Warning
