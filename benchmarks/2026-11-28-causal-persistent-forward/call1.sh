# Call 1: causal calls on a persistent grid (causal_persistent.patch of the last session applied to deee25b, items
# of two blocks of a head) against the package's launch; CUDA-graph GPU time, outputs compared bit for bit.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 benchmarks/2026-11-28-short-unmasked-forward/causal_persistent_ab.py 2>&1 | grep --line-buffered -v Warning
