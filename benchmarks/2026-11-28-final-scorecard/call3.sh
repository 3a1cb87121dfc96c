# Call 3: the plain rows as the product launches them at N1024-16384 (product_rows.py), N1024 / 2048 again (their
# ratios move 2-4% run to run), a forward CTA's fixed cost (cta_fixed_cost.py), and Nsight Compute on the D128
# unmasked backward's main kernel at N4096.
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
D=benchmarks/2026-11-28-final-scorecard
P=benchmarks/2026-11-27-gluon-forward-configs/product_rows.py
timeout 200 python3 $P 1024 2048 4096 16384 2>&1 | grep --line-buffered -v Warning
timeout 80 python3 $P 1024 2048 2>&1 | grep --line-buffered -v Warning
timeout 60 python3 $D/cta_fixed_cost.py 2>&1 | grep --line-buffered -v Warning
timeout 120 ncu --clock-control none -k regex:_hopper_attn_bwd --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
    python3 $D/backward_once.py 128 > $OUT/ncu_bwd_d128.txt 2>&1
echo "ncu rc $?"; grep -E "Throughput|Pipe|Busy|Occupancy|Registers|Shared Memory|L1/TEX|L2 Cache|DRAM|Duration|Issue|Warp Cycles|Block Limit" $OUT/ncu_bwd_d128.txt | head -60
