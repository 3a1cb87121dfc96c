# Fifth device call (what was left of the budget): a compiled learned bias trained through the Gluon backward's dS
# stores, with the Gluon candidate forced (tests/test_implementations.py), and the GPU compile-path tests of the
# implementation choice.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
timeout 150 python3 -m pytest -v tests/test_implementations.py -k "ds_stores or each_candidate" 2>&1 | grep --line-buffered -E '^E  .{0,200}|PASSED|FAILED|passed|failed'
