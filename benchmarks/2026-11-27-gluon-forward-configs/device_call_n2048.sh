source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 200 python3 benchmarks/2026-11-27-gluon-forward-configs/fwd_configs.py bench 2048 2>&1 | tee $OUT/configs_n2048.log
