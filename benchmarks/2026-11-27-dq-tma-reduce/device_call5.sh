source .gpu/setup.sh
mkdir -p $OUT
timeout 300 python3 .gpu/v15/var_ab.py swap2 -- 128:1024:0 128:1024:1 128:4096:0 128:4096:1 128:16384:0 128:16384:1 64:4096:0 64:4096:1 2>&1 | tee $OUT/var_ab.log
