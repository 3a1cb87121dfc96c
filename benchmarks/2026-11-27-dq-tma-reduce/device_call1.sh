source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
timeout 170 python3 -m pytest -x -q -p no:cacheprovider tests/test_hopper_backward.py tests/test_hopper_forward.py 2>&1 | tail -n 3 | tee $OUT/gpu_tests.log
python3 benchmarks/2026-11-27-dq-tma-reduce/make_bwd_variants.py
timeout 150 python3 benchmarks/2026-11-27-dq-tma-reduce/probe.py ablate 2>&1 | tee $OUT/ablate.log
timeout 60 python3 benchmarks/2026-11-27-dq-tma-reduce/probe.py host 2>&1 | tee $OUT/host.log
which ncu; ncu --version | tail -n 1
timeout 200 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats -o $OUT/prof python3 benchmarks/2026-11-27-dq-tma-reduce/probe.py prof 128:4096:0,64:1024:1 > $OUT/ncu_run.log 2>&1; tail -n 5 $OUT/ncu_run.log
ncu -i $OUT/prof.ncu-rep --page details > $OUT/prof_details.txt 2>&1
grep -E "^  [A-Za-z_]|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Issue Slots Busy|No Eligible|Executed Ipc Active" $OUT/prof_details.txt | head -120
