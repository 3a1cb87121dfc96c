# Call 5: odd numbers of blocks a head in the causal persistent grid (the middle blocks of two heads an item) and
# D128's causal crossover at 1664 rows: the forward's GPU test file; the three launches at odd block counts
# (launch_modes_ab.py odd); D128 one consumer against two where two have odd blocks (config_ab.py crossover-odd);
# the plain rows as the product launches them (product_rows.py: GPU time, wall time a call, against cuDNN).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-causal-persistent-forward
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -v tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
timeout 120 python3 $D/launch_modes_ab.py odd 2>&1 | grep --line-buffered -v Warning
timeout 60 python3 $D/config_ab.py crossover-odd 2>&1 | grep --line-buffered -v Warning
timeout 120 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 2>&1 | grep --line-buffered -v Warning
