# Second device call (bias_tma.patch applied, test case 9 made [Z,H,M,N]): the Gluon kernels' GPU tests, then the
# forward configs where the bias comes by TMA and the memory of forward+backward.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 330 python3 -m pytest -q tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | grep -E "^E  .{0,200}|passed|failed|^FAILED" | head -20
timeout 220 python3 benchmarks/2026-11-28-gluon-bias-tma/bias_tma_configs.py 2>&1 | grep -v Warning
