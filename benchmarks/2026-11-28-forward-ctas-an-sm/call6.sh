# Call 6 (the session's last device seconds): query-block pairing at three CTAs an SM, A/B.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 120 python3 benchmarks/2026-11-28-forward-ctas-an-sm/pairing_at_three_ctas_ab.py 2>&1 | grep --line-buffered -v Warning
