export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
(timeout 200 python benchmarks/gpu_report.py --quick --stages checks --out $OUT > $OUT/checks.log 2>&1; grep -E "FAIL|check\(s\)|total" $OUT/checks.log) &
wait
python benchmarks/overhead.py 2>&1 | tee $OUT/overhead.log
python benchmarks/overhead.py --shape 64,128,500 --norm ccln 2>&1 | tee -a $OUT/overhead.log
python benchmarks/sweep.py --norm cln --block-t 8,16,32,64 --warps 4,8,16 --window 32 2>&1 | tee $OUT/sweep.log
python benchmarks/sweep.py --norm cln --dtype bf16 --block-t 16,32,64 --warps 4,8,16 --window 32 2>&1 | tee -a $OUT/sweep.log
python benchmarks/sweep.py --norm frameln --block-t 16,32,64 --warps 8 2>&1 | tee -a $OUT/sweep.log
python benchmarks/sweep.py --norm cln --block-t 16 --warps 8 --window 4,8,64 2>&1 | tee -a $OUT/sweep.log
timeout 120 ncu --clock-control none -k regex:running_norm_fwd --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats python benchmarks/sweep.py --norm cln --block-t 16 --warps 8 > $OUT/ncu.log 2>&1; grep -E "Throughput|Occupancy|Registers|Stall|Duration|Warp Cycles|Block Limit" $OUT/ncu.log | head -40
