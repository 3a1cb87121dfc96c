# Call 2: where the eager step's host time goes (host_trace.py).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-final-scorecard
timeout 200 python3 $D/host_trace.py 2>&1 | grep --line-buffered -v Warning
