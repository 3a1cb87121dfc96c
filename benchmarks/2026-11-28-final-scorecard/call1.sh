# Call 1: the Gluon ops' host cost split (host_profile.py) and what the padding rows allocate at their peak
# (padding_memory.py).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-final-scorecard
timeout 200 python3 $D/host_profile.py 2>&1 | grep --line-buffered -v Warning
timeout 300 python3 $D/padding_memory.py 2>&1 | grep --line-buffered -v Warning
