# Fifth device call (what was left of the budget): a compiled learned bias trained through the Gluon backward's dS
# stores, with the Gluon candidate forced (tests/test_implementations.py), then the Gluon candidate's compiled causal
# test.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 110 python3 -m pytest -v tests/test_implementations.py -k "ds_stores" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|passed|failed'
timeout 70 python3 -m pytest -v tests/test_implementations.py -k "each_candidate and gluon" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|passed|failed'
