# ncu profiles of the cases in scratch/ncu_cases.txt, one at a time, until $DEADLINE (epoch seconds).
# Usage: DEADLINE=... bash scratch/ncu_all.sh [first_line]
mkdir -p /tmp/ncu
first=${1:-1}
NCU=${NCU:-ncu}
n=0
while IFS='|' read -r label args; do
  n=$((n+1)); [ $n -lt $first ] && continue
  left=$((DEADLINE - $(date +%s)))
  if [ $left -lt 25 ]; then echo "ncu: stopped before case $n ($label), deadline"; break; fi
  t=$(( left < 120 ? left : 120 ))
  s=$(date +%s)
  eval "set -- $args"
  timeout $t $NCU --clock-control none -k 'regex:running_norm|span_scan|sum_partials' \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    --csv --page raw --log-file /tmp/ncu/$label.csv python benchmarks/ncu_run.py "$@" --calls 1 > /tmp/ncu/$label.out 2>&1 < /dev/null
  rc=$?
  echo "== case $n $label rc $rc $(( $(date +%s) - s )) s: $(grep -m1 '^tiles' /tmp/ncu/$label.out)"
  [ $rc -ne 0 ] && tail -5 /tmp/ncu/$label.out
  [ -f /tmp/ncu/$label.csv ] && python scratch/ncu_table.py /tmp/ncu/$label.csv
done < scratch/ncu_cases.txt
