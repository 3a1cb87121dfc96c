# Call 4: where the shorter configs stop (config_ab.py crossover): D128 causal one consumer against two at N1664-1920,
# D64 unmasked one consumer (persistent) against three at N1024-1792.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-causal-persistent-forward
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 $D/config_ab.py crossover 2>&1 | grep --line-buffered -v Warning
