# Next device call (from the twenty-eighth session): copy this to scratch/ with the kernels it compares,
#   mkdir -p scratch && cp benchmarks/runs/2026-12-05-twentyeighth/d5.sh scratch/ &&
#   git show 08e922c:normlib/backends/triton/kernels.py > scratch/k_08e922c.py
# then run `BUDGET=500 bash scratch/d5.sh` with carry ["scratch"]. It checks on the GPU the log2d fix (f3f5a64)
# and the backward's m_in - mu_t from the frames' own prefix; times span_scan's one statistic a program
# (759d3de), the backward with a state before and after, and pooled backward tiles of 32 frames.
export PYTHONPATH=.:benchmarks PYTHONUNBUFFERED=1
T0=$(date +%s); END=$((T0 + ${BUDGET:-500}))
left() { echo $(( END - $(date +%s) )); }
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_triton_forward.py tests/test_triton_backward.py \
   tests/test_streaming.py -k "outgoing_state or one_frame or heavy or fades or light_incoming" 2>&1 | tail -4 | tee $OUT/pytest.txt
echo "t $(( $(date +%s) - T0 ))"
timeout $(( $(left) / 3 )) python benchmarks/ab.py --kernels tree@scan_block=4 --procs 2 ccln:1,128,256000:bf16:btc \
   ccemaln:1,128,256000:fp32:btc ccln:2,256,64000:bf16:btc 2>&1 | tee $OUT/ab_scan.txt
echo "t $(( $(date +%s) - T0 ))"
timeout $(( $(left) / 2 )) python benchmarks/ab.py --kernels scratch/k_08e922c.py --procs 2 cln:16,512,16000:fp32:bct:state \
   ccln:16,512,16000:fp32:btc:state ccemaln:16,512,16000:fp32:bct:state emaln:16,512,16000:bf16:btc:state 2>&1 | tee $OUT/ab_state_bwd.txt
echo "t $(( $(date +%s) - T0 ))"
timeout $(( $(left) - 30 )) python benchmarks/ab.py --kernels tree@block_t=32 --procs 2 cln:16,512,16000:fp32:bct \
   cln:16,512,16000:bf16:bct 2>&1 | tee $OUT/ab_bt.txt
echo "t $(( $(date +%s) - T0 ))"
[ $(left) -gt 20 ] && timeout $(left) ncu --clock-control none -k 'regex:running_norm_bwd' --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
  python benchmarks/ncu_run.py --bwd --norm cln --dtype fp32 --layout "b c t" --shape 16,512,16000 --block-t 32 --calls 1 2>&1 | grep -v "^==PROF" | tee $OUT/ncu_bt.txt
echo "total $(( $(date +%s) - T0 ))"
