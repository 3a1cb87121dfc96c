source .gpu/setup.sh
mkdir -p $OUT
timeout 200 python3 benchmarks/2026-11-27-gluon-forward-configs/product_rows.py 1024 2048 4096 16384 2>&1 | tee $OUT/product_rows.log
