"""Check and time every norm on a CUDA GPU in one run.

    PYTHONPATH=. python benchmarks/gpu_report.py [--commit SHA] [--out DIR] [--no-compile] [--quick]

Checks (against the float64 reference, at real sizes): every norm x layout x dtype (fp32, fp16, bf16)
with affine, lengths and states; chunked streaming; DC offset 1e4 in fp32 (no NaN); a tensor of more than
2^31 elements. Then times the forward of normlib (Triton), torch eager and torch.compile of the
reference, and a copy (clone) of the same tensor, in the same run; prints GB/s and ratios to the copy and
writes a markdown table (for benchmarks/RESULTS.md) under --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import triton
from triton.testing import do_bench

import normlib
from normlib import reference as R
from normlib.functional import norm

NORMS = ["cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln"]
LARGE = [(16, 512, 16000), (2, 256, 64000), (1, 128, 256000), (4, 512, 4000)]
SMALL = [(80, 64, 301), (64, 128, 500)]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FAILS: list[str] = []


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def check(name, ok, detail=""):
    print(f"  {'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        FAILS.append(f"{name} {detail}")


def spec_of(name):
    return normlib.get(name).spec


def make(B, C, T, dtype, layout, offset=0.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, C, T, device="cuda", generator=g) * 2 + offset
    x = x.to(dtype)
    return x if layout == "b c t" else x.transpose(1, 2).contiguous()


def as_bct(x, layout):
    return x if layout == "b c t" else x.transpose(1, 2)


def run_checks(quick):
    print("== checks against the float64 reference", flush=True)
    shapes = [(3, 50, 1001), (4, 512, 4000)] if not quick else [(3, 50, 1001)]
    for (B, C, T) in shapes:
        for dn, dt in DTYPES.items():
            for layout in ("b c t", "b t c"):
                x = make(B, C, T, dt, layout, offset=3.0, seed=B + C)
                xr = as_bct(x, layout).double()
                w = torch.randn(C, device="cuda")
                b = torch.randn(C, device="cuda")
                lengths = torch.randint(1, T + 1, (B,), device="cuda")
                lengths[0] = T
                for name in NORMS:
                    spec = spec_of(name)
                    kw = dict(lengths=lengths, layout=layout, backend="triton")
                    if spec.causal:
                        y, s = norm(spec, x, w, b, return_state=True, **kw)
                        yr, sr = R.REFERENCES[name](xr, w.double(), b.double(), lengths=lengths, return_state=True)
                        e_s = max(rel(p, q) for p, q in zip(s, sr))
                    else:
                        y = norm(spec, x, w, b, **kw)
                        yr, e_s = R.REFERENCES[name](xr, w.double(), b.double(), lengths=lengths), 0.0
                    e = rel(as_bct(y, layout), yr)
                    ok = e < TOL[dt] and e_s < 1e-4 and y.dtype == dt and torch.isfinite(y).all().item()
                    check(f"{name} {dn} {layout!r} B{B}-C{C}-T{T}", ok, f"y {e:.1e} state {e_s:.1e}")

    print("== chunked streaming equals the whole sequence", flush=True)
    B, C, T = (2, 256, 64000) if not quick else (2, 64, 5000)
    for layout in ("b c t", "b t c"):
        x = make(B, C, T, torch.float32, layout, seed=7)
        for name in NORMS:
            spec = spec_of(name)
            if not spec.causal:
                continue
            whole = as_bct(norm(spec, x, layout=layout, backend="triton"), layout)
            cuts = [0, 1, 4097, 20000, 20001, T]
            st, parts = None, []
            for lo, hi in zip(cuts, cuts[1:]):
                xs = x[..., lo:hi] if layout == "b c t" else x[:, lo:hi]
                yc, st = norm(spec, xs, layout=layout, state=st, return_state=True, backend="triton")
                parts.append(as_bct(yc, layout))
            e = rel(torch.cat(parts, -1), whole)
            check(f"stream {name} {layout!r}", e < 1e-5, f"{e:.1e}")

    print("== DC offset 1e4, fp32", flush=True)
    x = make(4, 256, 20000, torch.float32, "b c t", offset=1e4, seed=3)
    for name in NORMS:
        y = norm(spec_of(name), x, backend="triton")
        e = rel(y, R.REFERENCES[name](x.double()))
        check(f"offset 1e4 {name}", e < 1e-3 and torch.isfinite(y).all().item(), f"{e:.1e}")

    print("== more than 2^31 elements (fp16)", flush=True)
    B, C, T = 2, 256, (1 << 22) + 3
    assert B * C * T > 2**31
    x = make(B, C, T, torch.float16, "b c t", seed=11)
    for name in ("cln", "gln"):
        y = norm(spec_of(name), x, backend="triton")
        yr = R.REFERENCES[name](x[1:].double())  # the second sequence lies past 2^31 elements
        e = rel(y[1:], yr)
        check(f"{name} {B}x{C}x{T} fp16, batch item 1", e < TOL[torch.float16], f"{e:.1e}")
        del y, yr
    del x
    torch.cuda.empty_cache()


def bench(quick, compile_ref):
    print("== forward timings (median of do_bench, L2 flushed); ratios are copy_time / time", flush=True)
    rows = []
    shapes = LARGE + SMALL if not quick else [LARGE[0], SMALL[0]]
    for (B, C, T) in shapes:
        for dn in ("fp32", "bf16"):
            dt = DTYPES[dn]
            for layout in ("b c t", "b t c"):
                x = make(B, C, T, dt, layout, seed=1)
                nbytes = 2 * x.numel() * x.element_size()
                t_copy = do_bench(lambda: x.clone(), return_mode="median")
                w = torch.ones(C, device="cuda", dtype=torch.float32)
                b = torch.zeros(C, device="cuda", dtype=torch.float32)
                for name in NORMS:
                    spec = spec_of(name)
                    f = lambda: norm(spec, x, w, b, layout=layout, backend="triton")  # noqa: E731
                    t_nl = do_bench(f, return_mode="median")
                    xr = as_bct(x, layout)
                    ref = R.REFERENCES[name]
                    t_eager = do_bench(lambda: ref(xr, w, b), return_mode="median")
                    t_comp = float("nan")
                    if compile_ref and layout == "b c t":
                        torch._dynamo.reset()
                        cf = torch.compile(lambda v: ref(v, w, b))
                        try:
                            cf(xr)
                            t_comp = do_bench(lambda: cf(xr), return_mode="median")
                        except Exception as exc:  # pragma: no cover
                            print("compile failed", name, exc)
                    row = dict(norm=name, B=B, C=C, T=T, dtype=dn, layout=layout, ms=t_nl, copy_ms=t_copy,
                               eager_ms=t_eager, compile_ms=t_comp, gbps=nbytes / t_nl / 1e6)
                    rows.append(row)
                    print(f"  {name:8s} {B:3d}x{C:4d}x{T:6d} {dn} {layout!r}: {t_nl*1e3:8.1f} us "
                          f"{row['gbps']:7.0f} GB/s  copy x{t_copy/t_nl:.2f}  eager x{t_copy/t_eager:.2f}  "
                          f"compile x{t_copy/t_comp:.2f}  vs compile {t_comp/t_nl:.2f}x", flush=True)
                del x
    return rows


def table(rows):
    lines = ["| norm | B, C, T | dtype | layout | normlib µs | GB/s | ÷ copy | eager ÷ copy | compile ÷ copy | speed-up vs compile |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["copy_ms"]
        lines.append(f"| {r['norm']} | {r['B']}, {r['C']}, {r['T']} | {r['dtype']} | {r['layout']} | "
                     f"{r['ms']*1e3:.1f} | {r['gbps']:.0f} | {c/r['ms']:.2f} | {c/r['eager_ms']:.2f} | "
                     f"{c/r['compile_ms']:.2f} | {r['compile_ms']/r['ms']:.2f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--commit", default=os.environ.get("NORMLIB_COMMIT", "unknown"))
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-checks", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    a = p.parse_args()
    assert torch.cuda.is_available(), "gpu_report needs a CUDA GPU"
    head = (f"date {datetime.date.today()}, commit {a.commit}, GPU {torch.cuda.get_device_name()}, "
            f"torch {torch.__version__}, triton {triton.__version__}, python {sys.version.split()[0]}")
    print(head, flush=True)
    t0 = time.time()
    if not a.skip_checks:
        run_checks(a.quick)
    rows = [] if a.skip_bench else bench(a.quick, not a.no_compile)
    md = head + "\n\n" + table(rows) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(dict(head=head, rows=rows, fails=FAILS), f)
    print(f"\n{len(FAILS)} check(s) failed" + "".join(f"\n  {s}" for s in FAILS))
    print(f"total {time.time() - t0:.0f} s")
    return 1 if FAILS else 0


if __name__ == "__main__":
    raise SystemExit(main())
