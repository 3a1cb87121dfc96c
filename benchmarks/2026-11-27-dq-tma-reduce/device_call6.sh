source .gpu/setup.sh
mkdir -p $OUT
timeout 200 python3 .gpu/v15/fwd_var_ab.py fwd_lpt -- 64:1024:1 64:2048:1 64:4096:1 64:16384:1 128:1024:1 128:2048:1 128:4096:1 128:16384:1 2>&1 | tee $OUT/fwd_lpt_ab.log
timeout 200 python3 .gpu/v15/var_ab.py bwd_lpt -- 64:1024:1 64:4096:1 64:16384:1 128:1024:1 128:4096:1 128:16384:1 2>&1 | tee $OUT/bwd_lpt_ab.log
