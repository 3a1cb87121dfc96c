# Call 2: the causal persistent grid in the package (runs_persistent: causal where one block a CTA would fill more
# than the 8 waves that pair, an even number of blocks a head): the forward's GPU test file, then the three launches
# forced (launch_modes_ab.py) at 1-16 k rows.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -v tests/test_hopper_forward.py 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|SKIPPED|passed|failed'
timeout 330 python3 benchmarks/2026-11-28-causal-persistent-forward/launch_modes_ab.py 2>&1 | grep --line-buffered -v Warning
