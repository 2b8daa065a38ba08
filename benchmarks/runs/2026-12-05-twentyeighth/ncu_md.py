"""Markdown rows from ncu raw CSVs named like fwd-cln-fp32-bct-L.csv (ncu_all.sh's labels)."""
import re, sys, os
sys.path.insert(0, os.path.dirname(__file__))
from ncu_table import rows, val
SH = {"L": (16, 512, 16000), "B1": (1, 128, 256000), "S": (80, 64, 301), "M": (4, 512, 4000)}
print("| case | kernel (grid × block) | µs | DRAM read ÷ x | write ÷ x | DRAM busy % | regs | occupancy % (limit) | issue active % | warp-inst / element | stalls per issue (top two) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    lab = os.path.basename(path)[:-4]
    d, norm, dt, lay, sh = lab.split("-")
    B, C, T = SH[sh]
    n = B * C * T
    xb = n * (2 if dt == "bf16" else 4) / 1e6
    for r in rows(path):
        name = r["Kernel Name"][0]
        stalls = sorted(((val(r, k), re.sub(r"smsp__average_warps_issue_stalled_|_per_issue_active.ratio", "", k))
                         for k in r if k.startswith("smsp__average_warps_issue_stalled_") and k.endswith("per_issue_active.ratio")
                         and val(r, k) is not None and "selected" not in k), reverse=True)[:2]
        g = r["launch__grid_size"][0].replace(",", "")
        print(f"| {d} {norm} {dt} {'b c t' if lay == 'bct' else 'b t c'} {SH[sh]} | {name} ({g} × {r['launch__block_size'][0]}) "
              f"| {val(r, 'gpu__time_duration.sum'):.1f} | {val(r, 'dram__bytes_read.sum') / xb:.2f} | {val(r, 'dram__bytes_write.sum') / xb:.2f} "
              f"| {val(r, 'dram__cycles_active.avg.pct_of_peak_sustained_elapsed'):.0f} | {r['launch__registers_per_thread'][0]} "
              f"| {val(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.0f} ({val(r, 'sm__maximum_warps_per_active_cycle_pct'):.0f}) "
              f"| {val(r, 'smsp__issue_active.avg.pct_of_peak_sustained_active'):.0f} | {val(r, 'smsp__inst_executed.sum') / n:.2f} "
              f"| {', '.join(f'{k} {v:.1f}' for v, k in stalls)} |")
