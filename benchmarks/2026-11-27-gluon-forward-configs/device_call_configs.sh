source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
R=benchmarks/2026-11-27-gluon-forward-configs
mkdir -p $OUT
timeout 520 python3 $R/fwd_configs.py check bench 2>&1 | tee $OUT/configs.log
