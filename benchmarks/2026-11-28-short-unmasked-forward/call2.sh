# Call 2: the output stored from registers and persistent grids against the package's forward (persistent_ab.py).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 benchmarks/2026-11-28-short-unmasked-forward/persistent_ab.py 2>&1 | grep --line-buffered -v Warning
