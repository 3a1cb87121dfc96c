source .gpu/setup.sh
mkdir -p $OUT
timeout 150 python3 .gpu/v16/bwd_kernels.py /tmp/longest.txt 2>&1 | tee $OUT/bwd_kernels.log
K=$(cat /tmp/longest.txt | cut -c1-60)
echo "ncu on: $K" | tee $OUT/ncu_cudnn_bwd.txt
[ -n "$K" ] && timeout 200 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$(printf '%s' "$K" | sed 's/[][()*+?.^$|\\]/./g')" --launch-skip 1 --launch-count 1 --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis python3 .gpu/v16/ncu_bwd.py 2>&1 | grep -v "^==PROF==" | tail -n 90 | tee -a $OUT/ncu_cudnn_bwd.txt
