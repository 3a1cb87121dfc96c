# Call 7: heads 2 g and 2 g + 1's items side by side in the causal persistent grid (their middle blocks between
# their pairs, for L2; no spills, ptxas sm90a): the forward's GPU test file, the three launches at odd and even
# block counts (launch_modes_ab.py odd+even), the plain rows as the product launches them.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-causal-persistent-forward
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -v tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed' | grep -v "PASSED"
timeout 150 python3 $D/launch_modes_ab.py odd+even 2>&1 | grep --line-buffered -v Warning
timeout 120 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 2>&1 | grep --line-buffered -v Warning
