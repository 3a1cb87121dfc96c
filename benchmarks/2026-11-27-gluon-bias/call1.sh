set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH

timeout 360 python3 .gpu/v19/bias_probe.py 2>&1 | grep -v Warning
