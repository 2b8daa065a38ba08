# Call 1: every check at real sizes and the GPU's state tests (parallel), Triton's cache warmed for the
# ncu cases, then ncu profiles one at a time until the deadline.
export PYTHONPATH=.:benchmarks PYTHONUNBUFFERED=1
T0=$(date +%s); C=$(cat scratch/commit)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
mkdir -p /tmp/chk
run() { name=$1; shift; timeout ${CHK_T:-320} python benchmarks/gpu_report.py --commit $C --out /tmp/chk/$name "$@" > /tmp/chk/$name.txt 2>&1; echo "$name rc $?" >> /tmp/chk/rc.txt; }
run fwd-ref --stages fwdchecks --fwd-parts ref &
run fwd-stream --stages fwdchecks --fwd-parts stream &
run fwd-dc-big --stages fwdchecks --fwd-parts dc,big &
run opchecks --stages opchecks &
run grad-a --stages gradchecks --grad-shapes 3x50x1001 &
run grad-b --stages gradchecks --grad-shapes 2x50x1000 &
run grad-c --stages gradchecks --grad-shapes 4x512x4000 &
run grad-d --stages gradchecks --grad-shapes 2x128x20000:seg &
(timeout ${CHK_T:-320} python -m pytest -q -p no:cacheprovider tests/test_triton_forward.py tests/test_streaming.py \
   -k "outgoing_state or one_frame or heavy or stream or nan_and_inf" > /tmp/chk/pytest.txt 2>&1; echo "pytest rc $?" >> /tmp/chk/rc.txt) &
(while IFS='|' read -r label args; do echo "$args"; done < scratch/ncu_cases.txt | \
   xargs -P 3 -I{} sh -c 'timeout 300 python benchmarks/ncu_run.py {} --calls 1 > /dev/null 2>&1') &
wait
echo "phase 1 done at $(( $(date +%s) - T0 )) s"; cat /tmp/chk/rc.txt
for f in /tmp/chk/*.txt; do echo "#### $f"; cat $f; done > $OUT/checks.txt
grep -h "FAIL\|check(s) failed\|passed\|failed\|Error" /tmp/chk/*.txt | grep -v "^  PASS" | head -40
DEADLINE=$((T0 + ${NCU_END:-555})) bash scratch/ncu_all.sh ${NCU_FIRST:-1} 2>&1 | tee $OUT/ncu_summary.txt
tar czf $OUT/ncu.tgz -C /tmp ncu 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"
