# checks (quick) + host overhead
export PYTHONPATH=.
timeout 420 python benchmarks/gpu_report.py --quick --stages checks --out $OUT > $OUT/checks.log 2>&1
grep -E "FAIL|check\(s\)|total|Error" $OUT/checks.log | head -30
python benchmarks/overhead.py 2>&1 | tee $OUT/overhead.log
python benchmarks/overhead.py --shape 64,128,500 --norm ccln 2>&1 | tee -a $OUT/overhead.log
