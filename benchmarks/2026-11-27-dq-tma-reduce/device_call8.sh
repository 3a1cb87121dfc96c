source .gpu/setup.sh
mkdir -p $OUT
timeout 200 python3 benchmarks/2026-11-27-dq-tma-reduce/fwd_1c_ab.py 2>&1 | tee $OUT/fwd_1c_ab.log
