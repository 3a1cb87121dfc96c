source .gpu/setup.sh
mkdir -p $OUT
timeout 250 python3 .gpu/v15/var_ab.py bwd_rot -- 128:1024:0 128:4096:0 128:16384:0 64:1024:0 64:4096:0 64:16384:0 2>&1 | tee $OUT/bwd_rot_ab.log
