"""Check and time every norm on a CUDA GPU in one run.

    PYTHONPATH=. python benchmarks/gpu_report.py [--commit SHA] [--out DIR] [--stages ...] [--quick]

Checks (against the float64 reference, at real sizes): every norm x layout x dtype (fp32, fp16, bf16)
with affine, lengths and states; chunked streaming; DC offset 1e4 in fp32 (no NaN); a tensor of more than
2^31 elements; gradients, determinism, torch.compile and opcheck. Then times the forward of normlib (Triton), torch eager and torch.compile of the
reference, and a copy (clone) of the same tensor, in the same run; prints GB/s and ratios to the copy and
writes a markdown table (for benchmarks/RESULTS.md) under --out. The checks take several minutes (mostly
compiling): split them over device calls with --stages fwdchecks and --stages gradchecks. --stages graphs
times the forward, a training step and the copy replayed from CUDA graphs: the GPU's time, where the eager
rows of small shapes measure the host's launch path (--shapes 4x512x4000,2x256x64000 for the mid sizes).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
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
    a, b = a.detach().double(), b.detach().double()
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


def forward_checks(quick, parts=("ref", "stream", "dc", "big")):
    """Forward of every norm (ref), chunked streaming and long sequences (stream), DC offset (dc), > 2^31
    elements (big): ``parts`` picks them, so that a cold run can be split over device calls."""
    for part in parts:
        dict(ref=_reference_checks, stream=_stream_checks, dc=_offset_checks, big=_big_checks)[part](quick)


def _reference_checks(quick):
    print("== checks against the float64 reference", flush=True)
    shapes = [(3, 50, 1001), (2, 50, 1000), (4, 512, 4000)] if not quick else [(3, 50, 1001)]
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


def _stream_checks(quick):
    print("== chunked streaming equals the whole sequence", flush=True)
    from normlib.backends import triton as tb
    B, C, T = (2, 256, 64000) if not quick else (2, 64, 30000)
    for layout in ("b c t", "b t c"):
        x = make(B, C, T, torch.float32, layout, seed=7)
        for name in NORMS:
            spec = spec_of(name)
            if not spec.causal:
                continue
            yr = R.REFERENCES[name](as_bct(x, layout).double())
            for strip in (0, 1, 2):  # look-back tiles, one program walking each sequence, or segments (SEG)
                with tb.tile_size(strip=strip):
                    whole = as_bct(norm(spec, x, layout=layout, backend="triton"), layout)
                    again = as_bct(norm(spec, x, layout=layout, backend="triton"), layout)
                e_ref = rel(whole, yr)
                check(f"whole {name} {layout!r} B{B}-C{C}-T{T} strip={strip} (a race shows as a run-to-run change)",
                      e_ref < 1e-5 and rel(again, whole) < 1e-6, f"{e_ref:.1e}, run to run {rel(again, whole):.1e}")
            cuts = [0, 1, 4097, 20000, 20001, T]
            st, parts = None, []
            for lo, hi in zip(cuts, cuts[1:]):
                xs = x[..., lo:hi] if layout == "b c t" else x[:, lo:hi]
                yc, st = norm(spec, xs, layout=layout, state=st, return_state=True, backend="triton")
                parts.append(as_bct(yc, layout))
            e = rel(torch.cat(parts, -1), whole)
            check(f"stream {name} {layout!r}", e < 1e-5, f"{e:.1e}")


def _offset_checks(quick):
    print("== DC offset 1e4, fp32", flush=True)
    x = make(4, 256, 20000, torch.float32, "b c t", offset=1e4, seed=3)
    for name in NORMS:
        y = norm(spec_of(name), x, backend="triton")
        e = rel(y, R.REFERENCES[name](x.double()))
        check(f"offset 1e4 {name}", e < 1e-3 and torch.isfinite(y).all().item(), f"{e:.1e}")


def _big_checks(quick):
    print("== more than 2^31 elements (fp16)", flush=True)
    from normlib.backends import triton as tb
    B, C, T = 2, 256, (1 << 22) + 3
    assert B * C * T > 2**31
    # ccln: segments by default (few channel blocks; in "b t c" on one-warp tiles); cln: forced to them; gln
    # and instln "b t c": 264 and 33 spans a sequence, reduced by span_scan
    runs = [("b c t", "cln", None), ("b c t", "gln", None), ("b c t", "cln", 2), ("b c t", "ccln", None),
            ("b t c", "ccln", None), ("b t c", "instln", None)] if not quick else [("b c t", "gln", None)]
    for layout in ("b c t", "b t c"):
        x = make(B, C, T, torch.float16, layout, seed=11)
        for name, strip in [(n, st) for lay, n, st in runs if lay == layout]:
            with tb.tile_size(strip=strip):  # 2: in segments (SEG)
                y = norm(spec_of(name), x, layout=layout, backend="triton")
            yr = R.REFERENCES[name](as_bct(x[1:], layout).double())  # the second sequence lies past 2^31 elements
            e = rel(as_bct(y[1:], layout), yr)
            check(f"{name} {B}x{C}x{T} fp16 {layout!r}, batch item 1" + (" SEG" if strip else ""),
                  e < TOL[torch.float16], f"{e:.1e}")
            del y, yr
        del x
        torch.cuda.empty_cache()


def op_checks():
    """torch.compile(fullgraph=True) of a model against eager, and opcheck; with deterministic algorithms,
    so that the look-back's grouping is fixed and both sides can agree to the bit."""
    print("== torch.compile(fullgraph=True) of a model equals eager; opcheck", flush=True)
    from normlib.backends import triton as tb
    torch.use_deterministic_algorithms(True)
    # Tanh between the norms: a per-channel affine straight before ccemaln (or a norm invariant to it) would
    # have an exactly zero gradient, which no relative error measures
    torch.manual_seed(0)  # the conv's initial weights: the same model on every run
    model = torch.nn.Sequential(torch.nn.Conv1d(64, 64, 3, padding=1), normlib.create("cln", 64), torch.nn.Tanh(),
                                normlib.create("ccemaln", 64, decay=0.9), torch.nn.Tanh(),
                                normlib.create("gln", 64)).cuda()
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # the float32 conv in TF32 is 3e-4 from float64
    x = make(4, 64, 3000, torch.float32, "b c t", seed=9)
    gy = make(4, 64, 3000, torch.float32, "b c t", seed=8)  # sum(y^2) of a gln output is nearly constant
    y_e = model(x)
    g_e = torch.autograd.grad((y_e * gy).sum(), list(model.parameters()))
    model64 = copy.deepcopy(model).double()  # "auto" runs float64 on the PyTorch reference
    y_r = model64(x.double())
    g_r = torch.autograd.grad((y_r * gy.double()).sum(), list(model64.parameters()))
    model_t = copy.deepcopy(model)  # the yardstick: the same model in float32 on the PyTorch backend
    for m in model_t.modules():
        if hasattr(m, "backend"):
            m.backend = "torch"
    y_t = model_t(x)
    g_t = torch.autograd.grad((y_t * gy).sum(), list(model_t.parameters()))
    torch._dynamo.reset()
    y_c = torch.compile(model, fullgraph=True)(x)
    g_c = torch.autograd.grad((y_c * gy).sum(), list(model.parameters()))
    # compiled and eager differ by float32 rounding (Inductor fuses the conv's neighbours differently), which
    # the norms' gradients amplify: each must be as close to the float64 model as eager is, and eager as
    # close as float32 PyTorch (the conv's weight and bias gradients sum a norm's dx, which nearly cancels)
    names = ["y"] + [n for n, _ in model.named_parameters()]
    for n, c, e_, t, r in zip(names, [y_c, *g_c], [y_e, *g_e], [y_t, *g_t], [y_r, *g_r]):
        ec, ee, et = rel(c, r), rel(e_, r), rel(t, r)
        check(f"compile fullgraph model (cln, ccemaln, gln): {n}", ec <= 2 * ee + 1e-6 and ee <= 2 * et + 1e-6,
              f"compiled {ec:.1e}, eager {ee:.1e}, float32 PyTorch {et:.1e} from float64; "
              f"compiled vs eager {rel(c, e_):.1e}")
    for pc, dec in ((False, 1.0), (True, 1.0), (True, 0.9), (False, 0.9), (False, None), (False, 0.0)):
        xo = make(2, 33, 700, torch.float32, "b c t", seed=10).requires_grad_()
        w, b = torch.randn(33, device="cuda", requires_grad=True), torch.randn(33, device="cuda", requires_grad=True)
        nsc = 33 if pc else 1
        sin = None if dec is None or dec == 0 else torch.stack([
            torch.full((2, nsc), 9.0, device="cuda", dtype=torch.float64),
            torch.randn(2, nsc, device="cuda", dtype=torch.float64),
            torch.rand(2, nsc, device="cuda", dtype=torch.float64) * 9]).requires_grad_()
        args = (xo, w, b, torch.tensor([700, 301], device="cuda"), sin, pc, dec, 1e-5, False, dec is not None, True,
                tb.launch.tiles_for(xo, pc, dec))
        try:
            torch.library.opcheck(tb.running_norm_fwd, args)
            check(f"opcheck per_channel={pc} decay={dec}", True)
        except Exception as exc:  # noqa: BLE001
            chain = [exc]
            while chain[-1].__cause__ is not None:
                chain.append(chain[-1].__cause__)
            check(f"opcheck per_channel={pc} decay={dec}", False,
                  " | ".join(" | ".join(str(e).splitlines()) for e in chain)[:3000])
    torch.backends.cudnn.allow_tf32 = tf32
    torch.use_deterministic_algorithms(False)


def grad_runs(spec):
    """"3x50x1001,2x128x20000:seg" -> [((3, 50, 1001), None), ((2, 128, 20000), 2)]; None for None."""
    if not spec:
        return None
    runs = []
    for item in spec.split(","):
        shape, _, how = item.partition(":")
        dims = shape.split("x")
        if how not in ("", "seg") or len(dims) != 3 or not all(d.isdigit() for d in dims):
            raise ValueError(f"--grad-shapes: expected BxCxT or BxCxT:seg, got {item!r}")
        runs.append((tuple(int(v) for v in dims), 2 if how else None))
    return runs


def gradient_checks(quick, shapes=None, dtypes=("fp32", "bf16")):
    """Gradients against the float64 reference, and determinism (two runs, identical bits), for ``shapes``
    as [((B, C, T), 2 for the running norms walked in segments (SEG), else None)]; by default three shapes
    and SEG on a few long sequences."""
    from normlib.backends import triton as tb
    print("== gradients against autograd of the float64 reference; determinism", flush=True)
    torch.use_deterministic_algorithms(True)  # the look-back then combines in a fixed grouping
    runs = list(shapes or ())
    if shapes is None:
        runs = [(s, None) for s in ([(3, 50, 1001), (2, 50, 1000), (4, 512, 4000)] if not quick else [(3, 50, 1001)])]
        runs += [] if quick else [((2, 128, 20000), 2)]
    for (B, C, T), strip in runs:
        for dn in dtypes:
            dt = DTYPES[dn]
            for layout in ("b c t", "b t c"):
                x = make(B, C, T, dt, layout, offset=1.0, seed=5)
                gy = make(B, C, T, dt, layout, seed=6)
                w = (1 + 0.1 * torch.randn(C, device="cuda")).requires_grad_()
                b = torch.randn(C, device="cuda").requires_grad_()
                lengths = torch.randint(1, T + 1, (B,), device="cuda")
                lengths[0] = T
                for name in NORMS:
                    spec = spec_of(name)
                    running = spec.causal and spec.time.value != "frame"
                    if strip == 2 and not running and spec.time.value != "global":
                        continue  # the SEG rows also check GLOBAL's default launch: its spans go through span_scan
                    force = strip if running else None
                    st = None
                    if running:
                        shp = (B, C) if spec.per_channel else (B,)
                        st = normlib.NormState(torch.full(shp, 50.0, device="cuda", dtype=torch.float64),
                                               torch.randn(shp, device="cuda", dtype=torch.float64),
                                               torch.rand(shp, device="cuda", dtype=torch.float64) * 60)
                        # the weight, a count, gets no gradient: m and m2 do
                        st = normlib.NormState(st.w, st.m.requires_grad_(), st.m2.requires_grad_())
                    ins = [t for t in (w, b, *(st or ())) if t is not None and t.requires_grad]
                    xg = x.detach().requires_grad_()
                    grads = []
                    for _ in range(2):
                        with tb.tile_size(strip=force):
                            out = norm(spec, xg, w, b, lengths=lengths, state=st, layout=layout, backend="triton",
                                       return_state=st is not None)
                            y = out[0] if st is not None else out
                            loss = (y.float() * gy.float()).sum() + (out[1].m.sum() * 0.5 if st is not None else 0)
                            grads.append(torch.autograd.grad(loss, [xg] + ins))
                    same = all(torch.equal(p_, q_) for p_, q_ in zip(*grads))
                    xr = as_bct(x, layout).double().requires_grad_()
                    wr, br = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
                    sr = None if st is None else normlib.NormState(
                        st.w, *(t.detach().clone().requires_grad_() for t in (st.m, st.m2)))
                    kw = dict(lengths=lengths)
                    if st is not None:
                        yr, so = R.REFERENCES[name](xr, wr, br, state=sr, return_state=True, **kw)
                        lr = (yr * as_bct(gy, layout).double()).sum() + so.m.sum() * 0.5
                    else:
                        yr = R.REFERENCES[name](xr, wr, br, **kw)
                        lr = (yr * as_bct(gy, layout).double()).sum()
                    ref_g = torch.autograd.grad(lr, [xr, wr, br] + ([] if sr is None else [sr.m, sr.m2]))
                    got = [as_bct(grads[0][0], layout)] + list(grads[0][1:])
                    errs = [rel(a_, b_) for a_, b_ in zip(got, ref_g)]
                    tol = 1e-4 if dt == torch.float32 else 3e-2
                    ok = same and all(e < tol for e in errs[:3]) and all(e < 1e-3 if dt == torch.float32 else 5e-2 for e in errs[3:])
                    check(f"grad {name} {dn} {layout!r} B{B}-C{C}-T{T}" + (" SEG" if force == 2 else ""), ok,
                          "dx dw db dstate " + " ".join(f"{e:.1e}" for e in errs) + ("" if same else " NOT DETERMINISTIC"))

    torch.use_deterministic_algorithms(False)


def _t(fn):
    return do_bench(fn, warmup=5, rep=30, return_mode="median")


def cases(quick, stage, shapes=None, norms=None):
    """(shape, dtype name, layout, norm) of each timing row of a stage."""
    shapes = shapes or (LARGE + SMALL if not quick else [LARGE[0], SMALL[0]])
    layouts = ("b c t", "b t c") if stage == "eager" else ("b c t",)
    return [(s, dn, lay, n) for s in shapes for dn in ("fp32", "bf16") for lay in layouts for n in norms or NORMS]


def run_case(stage, shape, dn, layout, name, timer):
    """Calls each timed function of one row through ``timer`` (do_bench, or once to compile)."""
    B, C, T = shape
    dt = DTYPES[dn]
    x = make(B, C, T, dt, layout, seed=1)
    gy = make(B, C, T, dt, layout, seed=2)
    xr, gyr = as_bct(x, layout), as_bct(gy, layout)
    w = torch.ones(C, device="cuda", requires_grad=True)
    b = torch.zeros(C, device="cuda", requires_grad=True)
    xg, xrg = x.detach().requires_grad_(), xr.detach().requires_grad_()
    spec, ref = spec_of(name), R.REFERENCES[name]
    row = dict(norm=name, B=B, C=C, T=T, dtype=dn, layout=layout, copy_ms=timer(lambda: x.clone()))
    if stage == "eager":
        with torch.no_grad():
            row["fwd"] = timer(lambda: norm(spec, x, w, b, layout=layout, backend="triton"))
            row["ref_fwd"] = timer(lambda: ref(xr, w, b))
        y = norm(spec, xg, w, b, layout=layout, backend="triton")
        row["bwd"] = timer(lambda: torch.autograd.grad(y, (xg, w, b), gy, retain_graph=True))
        del y
        row["step"] = timer(lambda: torch.autograd.grad(
            norm(spec, xg, w, b, layout=layout, backend="triton"), (xg, w, b), gy))
        row["ref_step"] = timer(lambda: torch.autograd.grad(ref(xrg, w, b), (xrg, w, b), gyr))
    else:
        torch._dynamo.reset()
        cf = torch.compile(ref)
        try:
            with torch.no_grad():
                cf(xr, w, b)
                row["cmp_fwd"] = timer(lambda: cf(xr, w, b))
            torch.autograd.grad(cf(xrg, w, b), (xrg, w, b), gyr)
            row["cmp_step"] = timer(lambda: torch.autograd.grad(cf(xrg, w, b), (xrg, w, b), gyr))
        except Exception as exc:  # pragma: no cover
            print("  compile failed", name, type(exc).__name__, str(exc)[:200], flush=True)
    return row


def _once(fn):
    fn()
    return float("nan")


def _one_compile_thread():  # a dozen workers, each with Inductor's own pool of 16, would crowd the CPUs
    import torch._inductor.config as cfg
    cfg.compile_threads = 1


def _warm_worker(job):
    """Compile one row's kernels (Triton's and Inductor's caches on disk are shared between processes)."""
    stage, case_ = job
    run_case(stage, *case_, timer=_once)
    torch.cuda.synchronize()
    return case_


def warm(jobs, procs):
    """Compile every row in ``procs`` processes before any timing: compiling, not the GPU, is what takes
    a report its minutes. Timings then run alone in this process."""
    import multiprocessing as mp
    t0 = time.time()
    with mp.get_context("spawn").Pool(procs, initializer=_one_compile_thread) as pool:
        for _ in pool.imap_unordered(_warm_worker, jobs):
            pass
    print(f"== warmed {len(jobs)} rows in {procs} processes, {time.time() - t0:.0f} s", flush=True)


def bench(jobs, stage, out):
    """stage "eager": normlib, the eager reference and the copy; stage "compile": torch.compile of the
    reference. Times in ms: forward, backward alone (normlib), and a training step (forward + backward)."""
    print(f"== timings ({stage}), median of do_bench with the L2 flushed", flush=True)
    rows = []
    for case_ in jobs:
        row = run_case(stage, *case_, timer=_t)
        rows.append(row)
        with open(os.path.join(out, f"rows-{stage}.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        print("  " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
        torch.cuda.empty_cache()
    return rows


def step_inputs(B, C, T, dtype, layout):
    """x, a copy of it that requires grad, weight and bias (requiring grad) and dy: a training step's inputs."""
    x, gy = make(B, C, T, dtype, layout, seed=1), make(B, C, T, dtype, layout, seed=2)
    w = torch.ones(C, device="cuda", requires_grad=True)
    b = torch.zeros(C, device="cuda", requires_grad=True)
    return x, x.detach().requires_grad_(), w, b, gy


def _graph_t(fn, calls=10):
    """Device time of one call: ``calls`` calls captured in one CUDA graph, replayed (no host launch cost)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the capture: compiles, caches, workspaces
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return _t(g.replay) / calls


def graph_times(shapes, norms, out, dtypes=("fp32", "bf16"), layouts=("b c t", "b t c"), force=None):
    """Stage "graphs": normlib's forward, a training step of the layer (forward, then dx, dweight and dbias,
    as in the eager table) and a copy, each replayed from a CUDA graph, so that they measure the GPU's work
    rather than the host's launch path (what a model run under CUDA graphs, e.g. torch.compile's
    mode="reduce-overhead", pays). The step is captured whole because autograd runs a backward on its
    forward's stream; the backward's time is the step's less the forward's. Replays do not flush L2:
    tensors under about 50 MB run partly from it, the copy as well."""
    print("== CUDA graph replay: device time per call (10 calls a graph)", flush=True)
    lines = ["| norm | B, C, T | dtype | layout | fwd µs | step µs | copy µs | fwd ÷ copy time | fwd ÷ copy "
             "| bwd ÷ copy | step ÷ copy |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    from normlib.backends import triton as tb
    capture_steps = True
    for (B, C, T) in shapes:
        for dn in dtypes:
            for layout in layouts:
                x, xg, w, b, gy = step_inputs(B, C, T, DTYPES[dn], layout)
                copy_ms = _graph_t(lambda: x.clone())
                for name in norms:
                    spec = spec_of(name)
                    with tb.tile_size(**(force or {})), torch.no_grad():
                        ms = _graph_t(lambda: norm(spec, x, w, b, layout=layout, backend="triton"))
                    step = float("nan")
                    if capture_steps:
                        try:
                            with tb.tile_size(**(force or {})):
                                step = _graph_t(lambda: torch.autograd.grad(
                                    norm(spec, xg, w, b, layout=layout, backend="triton"), (xg, w, b), gy))
                        except Exception as exc:  # noqa: BLE001 (a failed capture may leave CUDA unusable for
                            # more: stop capturing steps, keep the forwards)
                            print("  step capture failed", name, type(exc).__name__, str(exc)[:200], flush=True)
                            capture_steps = False
                    bwd = step - ms if step > ms else float("nan")  # noise can put a step under its forward
                    row = dict(norm=name, B=B, C=C, T=T, dtype=dn, layout=layout, graph_fwd=ms, graph_step=step,
                               graph_copy=copy_ms, force=force or {})
                    with open(os.path.join(out, "rows-graphs.jsonl"), "a") as f:
                        f.write(json.dumps(row) + "\n")
                    lines.append(f"| {name} | {B}, {C}, {T} | {dn} | {layout} | {ms * 1e3:.1f} | {step * 1e3:.1f} "
                                 f"| {copy_ms * 1e3:.1f} | {ms / copy_ms:.2f} | {copy_ms / ms:.2f} "
                                 f"| {1.5 * copy_ms / bwd:.2f} | {2.5 * copy_ms / step:.2f} |")
                    print(lines[-1], flush=True)
    return "\n".join(lines)


def table(rows, compiled=()):
    """Markdown: ratios to the copy of the same bytes (forward 2N, backward 3N, step 5N moved)."""
    cmp = {(r["norm"], r["B"], r["C"], r["T"], r["dtype"]): r for r in compiled}
    lines = ["| norm | B, C, T | dtype | layout | fwd µs | fwd ÷ copy | eager ÷ copy | compile ÷ copy | "
             "fwd vs compile | bwd ÷ copy | step ÷ copy | step vs eager | step vs compile |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["copy_ms"]
        k = cmp.get((r["norm"], r["B"], r["C"], r["T"], r["dtype"]), {})
        cf, cs = k.get("cmp_fwd", float("nan")), k.get("cmp_step", float("nan"))
        lines.append(
            f"| {r['norm']} | {r['B']}, {r['C']}, {r['T']} | {r['dtype']} | {r['layout']} | {r['fwd']*1e3:.1f} | "
            f"{c/r['fwd']:.2f} | {c/r['ref_fwd']:.2f} | {c/cf:.2f} | {cf/r['fwd']:.2f} | "
            f"{1.5*c/r['bwd']:.2f} | {2.5*c/r['step']:.2f} | {r['ref_step']/r['step']:.2f} | {cs/r['step']:.2f} |")
    return "\n".join(lines)


POOLED, PER_CHANNEL = ("cln", "gln", "emaln", "frameln"), ("ccln", "instln", "ccemaln")


def targets(rows, compiled=()):
    """Markdown: each target of issues 3 and 4, how many rows meet it, and the worst row."""
    cmp = {(r["norm"], r["B"], r["C"], r["T"], r["dtype"]): r for r in compiled}
    large = {tuple(s) for s in LARGE}

    def ratio(r, what):
        c, k = r["copy_ms"], cmp.get((r["norm"], r["B"], r["C"], r["T"], r["dtype"]), {})
        return {"fwd": c / r["fwd"], "bwd": 1.5 * c / r["bwd"], "copy_x": r["fwd"] / c,
                "vs_cmp_fwd": k.get("cmp_fwd", float("nan")) / r["fwd"],
                "vs_cmp_step": k.get("cmp_step", float("nan")) / r["step"]}[what]

    rules = [  # (target, rows it covers, measure, bound, at least?)
        ("forward ≥ 0.85 of copy (pooled, large)", lambda r: r["norm"] in POOLED, True, "fwd", 0.85, True),
        ("forward ≥ 0.75 of copy (per channel, large)", lambda r: r["norm"] in PER_CHANNEL, True, "fwd", 0.75,
         True),
        ("forward ≤ 1.5 × copy time (small)", lambda r: True, False, "copy_x", 1.5, False),
        ("forward ≥ 1.5 × faster than compile", lambda r: True, None, "vs_cmp_fwd", 1.5, True),
        ("backward ≥ 0.75 of copy (pooled, large)", lambda r: r["norm"] in POOLED, True, "bwd", 0.75, True),
        ("backward ≥ 0.6 of copy (per channel, large)", lambda r: r["norm"] in PER_CHANNEL, True, "bwd", 0.6,
         True),
        ("fwd + bwd ≥ 2 × faster than compile", lambda r: True, None, "vs_cmp_step", 2.0, True),
    ]
    lines = ["| target | rows met | worst row | its figure | no compile figure |", "|---|---|---|---|---|"]
    for name, pick, is_large, what, bound, at_least in rules:
        sel = [r for r in rows if pick(r) and (is_large is None or ((r["B"], r["C"], r["T"]) in large) == is_large)]
        vals = [(ratio(r, what), r) for r in sel]
        known = [(v, r) for v, r in vals if v == v]
        met = sum((v >= bound) if at_least else (v <= bound) for v, _ in known)
        if not known:
            continue
        v, r = (min if at_least else max)(known, key=lambda t: t[0])
        lines.append(f"| {name} | {met} / {len(known)} | {r['norm']} {r['dtype']} {r['layout']} "
                     f"({r['B']}, {r['C']}, {r['T']}) | {v:.2f} | {len(vals) - len(known)} |")
    return "\n".join(lines)


def graph_targets(rows, compiled=()):
    """Markdown: the targets in device time (stage "graphs": CUDA graph replays, the backward taken as the
    step less the forward), a line per group of rows, with the median, lowest and highest figure. The compile
    figures are do_bench times, so they are compared on the large shapes only: elsewhere they time the host."""
    cmp = {(r["norm"], r["B"], r["C"], r["T"], r["dtype"]): r for r in compiled}
    large = {tuple(s) for s in LARGE}

    def vs(r, what):
        k = cmp.get((r["norm"], r["B"], r["C"], r["T"], r["dtype"]), {}).get(f"cmp_{what}")
        return k / r[f"graph_{what}"] if k else float("nan")
    fwd = lambda r: r["graph_copy"] / r["graph_fwd"]  # noqa: E731
    bwd = lambda r: 1.5 * r["graph_copy"] / (r["graph_step"] - r["graph_fwd"])  # noqa: E731
    big = lambda r: (r["B"], r["C"], r["T"]) in large  # noqa: E731
    rules = [(f"forward ≥ 0.85 of a copy: pooled, {dn} {lay!r}", fwd, 0.85,
              lambda r, dn=dn, lay=lay: big(r) and r["norm"] in POOLED and (r["dtype"], r["layout"]) == (dn, lay))
             for dn in ("fp32", "bf16") for lay in ("b c t", "b t c")]
    rules += [(f"forward ≥ 0.75 of a copy: {n}", fwd, 0.75, lambda r, n=n: big(r) and r["norm"] == n)
              for n in PER_CHANNEL]
    rules += [("forward ≤ 1.5 × a copy's time: small (figure: times a copy's)",
               lambda r: r["graph_fwd"] / r["graph_copy"], -1.5, lambda r: not big(r)),
              ("forward ≥ 1.5 × faster than torch.compile: large", lambda r: vs(r, "fwd"), 1.5, big),
              ("backward ≥ 0.75 of a copy: pooled, large", bwd, 0.75, lambda r: big(r) and r["norm"] in POOLED),
              ("backward ≥ 0.6 of a copy: per channel, large", bwd, 0.6,
               lambda r: big(r) and r["norm"] in PER_CHANNEL),
              ("step ≥ 2 × faster than torch.compile: large", lambda r: vs(r, "step"), 2.0, big)]
    lines = ["| target, in device time | rows met | median | lowest | highest |", "|---|---|---|---|---|"]
    for label, measure, bound, pick in rules:  # a negative bound: at most its magnitude
        vals = sorted((measure(r), r) for r in rows if pick(r) and measure(r) == measure(r))
        if not vals:
            continue
        met = sum(v <= -bound if bound < 0 else v >= bound for v, _ in vals)
        ends = [f"{v:.2f} {r['norm']} {r['dtype']} {r['layout']!r} ({r['B']}, {r['C']}, {r['T']})"
                for v, r in (vals[0], vals[-1])]
        lines.append(f"| {label} | {met} / {len(vals)} | {statistics.median(v for v, _ in vals):.2f} | {ends[0]} | {ends[1]} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--commit", default=os.environ.get("NORMLIB_COMMIT", "unknown"))
    out = os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))  # git-ignored
    p.add_argument("--out", default=out)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--stages", default="checks,eager,compile",
                   help="any of checks (= fwdchecks,gradchecks), fwdchecks, gradchecks (with opchecks), "
                        "opchecks (compile and opcheck only), eager, compile, graphs (forward, step and copy "
                        "replayed from CUDA graphs; the small shapes unless --shapes)")
    p.add_argument("--shapes", help="timing shapes as BxCxT,... (default: the issue's six)")
    p.add_argument("--norms", help="timing norms, comma-separated (default: all)")
    p.add_argument("--dtypes", default="fp32,bf16", help="graphs: timing dtypes")
    p.add_argument("--layouts", default="bct,btc", help="graphs: timing layouts, bct and/or btc")
    p.add_argument("--force", help="graphs: launch choices forced as launch.tile_size takes them, "
                                   "k=v,... (hold=0,bwd_strip=1)")
    p.add_argument("--grad-shapes", help="gradient-check shapes as BxCxT[:seg],... (default: three, and "
                                         "2x128x20000:seg, the running norms walked in segments and GLOBAL's "
                                         "default launch, its spans reduced by span_scan)")
    p.add_argument("--fwd-parts", default="ref,stream,dc,big", help="fwdchecks: which of ref, stream, dc, big")
    p.add_argument("--grad-dtypes", default="fp32,bf16", help="gradient-check dtypes")
    p.add_argument("--warm", type=int, default=12, help="processes that compile every row before timing")
    p.add_argument("--table", help="rows-eager.jsonl[,rows-compile.jsonl][,rows-graphs.jsonl]: print the markdown table of "
                                   "earlier runs (no GPU needed) and exit")
    a = p.parse_args()
    if a.table:
        rows = [[json.loads(line) for f in a.table.split(",") if st in os.path.basename(f)
                 for line in open(f)] for st in ("eager", "compile", "graphs")]
        if rows[0]:
            print(table(*rows[:2]) + "\n\n" + targets(*rows[:2]))
        if rows[2]:
            print("\n" + graph_targets(rows[2], rows[1]))
        return 0
    stages = a.stages.split(",")
    assert torch.cuda.is_available(), "gpu_report needs a CUDA GPU"
    head = (f"date {datetime.date.today()}, commit {a.commit}, GPU {torch.cuda.get_device_name()}, "
            f"torch {torch.__version__}, triton {triton.__version__}, python {sys.version.split()[0]}")
    print(head, flush=True)
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    if "checks" in stages or "fwdchecks" in stages:
        forward_checks(a.quick, a.fwd_parts.split(","))
    if "checks" in stages or "opchecks" in stages or ("gradchecks" in stages and not a.grad_shapes):
        op_checks()
    def parse(spec):
        return [tuple(int(v) for v in s.split("x")) for s in spec.split(",")] if spec else None
    if "checks" in stages or "gradchecks" in stages:
        gradient_checks(a.quick, grad_runs(a.grad_shapes), a.grad_dtypes.split(","))
    result = dict(head=head, fails=FAILS)
    shapes = parse(a.shapes)
    norms = a.norms.split(",") if a.norms else None
    jobs = {st: cases(a.quick, st, shapes, norms) for st in ("eager", "compile") if st in stages}
    if a.warm and jobs:
        warm([(st, c) for st, js in jobs.items() for c in js], a.warm)
    for stage in jobs:
        result[stage] = bench(jobs[stage], stage, a.out)
        with open(os.path.join(a.out, f"report-{stage}.json"), "w") as f:
            json.dump(dict(result, rows=result[stage]), f)
    if "graphs" in stages:
        force = {k: int(v) for k, v in (kv.split("=") for kv in a.force.split(","))} if a.force else None
        layouts = tuple({"bct": "b c t", "btc": "b t c"}[v] for v in a.layouts.split(","))
        md = (head + (f", forced {force}" if force else "") + "\n\n"
              + graph_times(shapes or SMALL, norms or NORMS, a.out, a.dtypes.split(","), layouts, force) + "\n")
        with open(os.path.join(a.out, "report-graphs.md"), "w") as f:
            f.write(md)
    if "eager" in stages:
        md = (head + "\n\n" + table(result["eager"], result.get("compile", ())) + "\n\n"
              + targets(result["eager"], result.get("compile", ())) + "\n")
        with open(os.path.join(a.out, "report.md"), "w") as f:
            f.write(md)
        print(md)
    print(f"\n{len(FAILS)} check(s) failed" + "".join(f"\n  {s}" for s in FAILS))
    print(f"total {time.time() - t0:.0f} s")
    return 1 if FAILS else 0


if __name__ == "__main__":
    raise SystemExit(main())
