"""Summarize ncu --csv --page raw logs: one line per kernel, and the top stall reasons."""
import csv, re, sys

SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
         "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "Tbyte": 1e6}


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def rows(path):
    lines = [l for l in open(path, errors="replace") if not l.startswith("==")]
    rd = list(csv.reader(lines))
    for i, r in enumerate(rd):
        if "Kernel Name" in r:
            head, units, data = r, rd[i + 1], rd[i + 2:]
            if units and units[0] not in ("",):  # no unit row
                data, units = rd[i + 1:], [""] * len(head)
            for d in data:
                if len(d) == len(head):
                    yield {h: (d[j], units[j]) for j, h in enumerate(head)}
            return


def val(row, key, unit_scale=True):
    if key not in row:
        return None
    v, u = row[key]
    x = num(v)
    if x is None:
        return None
    return x * SCALE.get(u, 1.0) if unit_scale else x


def main(paths):
    for path in paths:
        label = re.sub(r".*/|\.csv$", "", path)
        got = list(rows(path))
        if not got:
            print(f"{label}: no kernel profiled")
            continue
        for r in got:
            name = r["Kernel Name"][0][:20]
            f = lambda k, d=1: (lambda v: "-" if v is None else f"{v:.{d}f}")(val(r, k))
            stalls = sorted(((val(r, k), re.sub(r"smsp__average_warps_issue_stalled_|_per_issue_active.ratio", "", k))
                             for k in r if k.startswith("smsp__average_warps_issue_stalled_") and k.endswith("per_issue_active.ratio")
                             and val(r, k) is not None), reverse=True)[:4]
            print(f"{label}: {name} grid {r.get('launch__grid_size', ('-',))[0]} block {r.get('launch__block_size', ('-',))[0]} "
                  f"regs {r.get('launch__registers_per_thread', ('-',))[0]} "
                  f"{f('gpu__time_duration.sum')} us, DRAM r {f('dram__bytes_read.sum')} w {f('dram__bytes_write.sum')} MB, "
                  f"L2 hit {f('lts__t_sector_hit_rate.pct')} %, occ {f('sm__warps_active.avg.pct_of_peak_sustained_active')} % "
                  f"(theor {f('sm__maximum_warps_per_active_cycle_pct')}), issue {f('smsp__issue_active.avg.pct_of_peak_sustained_active')} %, "
                  f"inst {(val(r, 'smsp__inst_executed.sum') or 0) / 1e6:.1f} M, "
                  f"cyc/issue {f('smsp__average_warp_latency_per_inst_issued.ratio', 2)}; "
                  + ", ".join(f"{n} {v:.2f}" for v, n in stalls), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
