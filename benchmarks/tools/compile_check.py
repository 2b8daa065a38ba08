"""Compile every specialization of the kernel template that the launchers pick for the benchmark shapes,
for sm_90, without a GPU: catches Triton compiler failures (e.g. version-specific lowering asserts)
before a GPU session is spent on them. Each compile runs in its own process (an assert aborts it).

    PYTHONPATH=. python benchmarks/tools/compile_check.py [--jobs N]

With --resources, it prints each compile's registers, spill stack and static SASS instruction count
(Triton's bundled cuobjdump), and a static bound: the time the busiest pipe alone needs for the whole
input (a GPU-free proxy for a kernel's arithmetic and occupancy), e.g.

    PYTHONPATH=. python benchmarks/tools/compile_check.py --resources --shape 16,512,16000 \
        --match POOL_ALL=False,MODE=1,HAS_W=False,layout=bct

Each tile choice compiles with no options ("plain") and with every one ("full"); ``--flags layer`` compiles
what a layer's training step runs (affine, saved prefixes, weight gradients: the graph stage's step).
``--maxnreg N`` caps the registers of a thread, as ``launch.tile_size(maxnreg=N)`` does on a GPU, to count
what a cap spills before timing it.
"""
from __future__ import annotations

import argparse
import collections
import inspect
import itertools
import math
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from normlib.backends.triton import launch
from normlib.backends.triton.kernels import running_norm_bwd, running_norm_fwd, span_scan, sum_partials

SHAPES = [(16, 512, 16000), (2, 256, 64000), (1, 128, 256000), (4, 512, 4000), (80, 64, 301), (64, 128, 500),
          (3, 50, 1001), (2, 64, 1)]
PTR = {"x_ptr": "X", "y_ptr": "X", "gy_ptr": "X", "gx_ptr": "X", "w_ptr": "*fp32", "b_ptr": "*fp32",
       "len_ptr": "*i64", "sin_ptr": "*fp64", "sout_ptr": "*fp64", "gsout_ptr": "*fp64", "gsin_ptr": "*fp64",
       "pre_ptr": "*fp32", "gwp_ptr": "*fp32", "gbp_ptr": "*fp32", "ws_ptr": "WS", "ctr_ptr": "*i64",
       "p_ptr": "*fp32", "gw_ptr": "*fp32", "gb_ptr": "*fp32"}


# The flag sets compiled per tile choice: "plain" (no options), "layer" (a layer's training step: affine weight
# and bias, the forward's saved prefixes, the weight's gradient partials: what the graph stage's step times)
# and "full" (every option on, and the strip walks of the running modes)
FLAG_SETS = ("plain", "layer", "full")


def configs(flag_sets=("plain", "full"), shapes=SHAPES):
    seen = set()
    for (B, C, T), last, pc, mode, dt, flags in itertools.product(
            shapes, (False, True), (False, True), (0, 1, 2, 3), ("fp32", "bf16"), flag_sets):
        full, layer = flags == "full", flags != "plain"
        es = 4 if dt == "fp32" else 2
        st = dict(b=C * T, c=1 if last else T, t=C if last else 1)
        aligned = all(v == 1 or v * es % 16 == 0 for v in st.values())  # contiguous rows of 16-byte multiples
        bc_f, bt, warps_f, strip_f, hold_f, bc_b, warps_b, hold_b, strip_b = launch.choose_launch(
            B, C, T, pc, last, mode, 132, B * C * T * es, es, aligned)
        causal = mode != 3
        # the strip variant of every running mode, too (SEG's, strip 2, are added below)
        seg = 2 in (strip_f, strip_b)
        strip_f, strip_b = (bool(s) or (mode != 0 and full) for s in (strip_f, strip_b))
        # pipeline depths as the launcher picks them for these walks (its hold: the forward's, before any walk)
        stages_f, stages_b = (launch.stages_for(C, c, bt, pc, last, mode, s, hold_f, es, bwd)
                              for c, s, bwd in ((bc_f, strip_f, False), (bc_b, strip_b, True)))
        walk_f, walk_b = (launch.walk_stages_for(pc, last, mode, s, bwd, c, bt, es)
                          for c, s, bwd in ((bc_f, strip_f, False), (bc_b, strip_b, True)))
        hold_f, hold_b = hold_f or strip_f, hold_b or strip_b  # a strip walk holds its tiles, as the launcher says
        for phase, (kernel, bc, warps, hold, strip, stages, walk) in itertools.product(
                (2,) if mode == 3 and strip_f else (3, 1, 2) if mode == 3 else (0,),  # GLOBAL: one launch, or two
                ((running_norm_fwd, bc_f, warps_f, hold_f, strip_f, stages_f, walk_f),
                 (running_norm_bwd, bc_b, warps_b, hold_b, strip_b, stages_b, walk_b))):
            ints = dict(**{f"s{a}{k}": v for a in "xygd" for k, v in st.items()}, B=B, C=C, T=T,
                        NCB=triton.cdiv(C, bc) if pc else 1, NT=triton.cdiv(T, bt), NSPAN=3)
            common = dict(POOL_ALL=not pc, MODE=mode, PHASE=phase, HAS_W=layer, HAS_LEN=full,
                          HAS_SIN=full and causal and mode != 0, EPS_OUTSIDE=full, BLOCK_C=bc, BLOCK_T=bt,
                          SPAN=1 if strip else 2, WINDOW=launch.window_for(pc, B * ints["NCB"], 132),
                          DETERMINISTIC=full, AGG_ONLY=False, STRIP=bool(strip), HOLD=hold, LONE=pc or C == 1,
                          STAGES=stages, WALK_STAGES=walk, EMA32=launch.ema32_for(pc, mode, math.log2(0.99), bt),
                          CTR_IN_WS=layer and (mode in (1, 2) or phase == 3) and not strip,  # a compiled step
                          **{k: v for k, v in launch.vec_for((B, C, T), ((st["b"], st["c"], st["t"]),)).items()
                             if not (full and k == "WIDE")})  # "full": int64 offsets (WIDE, the default)
            if kernel is running_norm_fwd:
                const = dict(common, HAS_B=layer, STORE_SOUT=full and causal, STORE_PREFIX=layer)
            else:
                const = dict(common, HAS_GSOUT=full and causal, STORE_GW=layer,
                             FLIP=pc and warps == 1 and mode in (1, 2))
            variants = [(const, phase, warps)]
            if mode == 3 and phase == 2 and not strip:  # GLOBAL tiles that read span_scan's totals
                variants.append((dict(const, SCANNED=True), phase, warps))
            if mode in (1, 2) and (seg or flags == "plain"):  # SEG: segment sums, then walks (pooled: on 8 warps),
                # their prefixes combined by the walk or read from span_scan's records
                variants += [(dict(const, STRIP=True, SEG=True, SPAN=1, HOLD=True, SCANNED=sc), ph,
                              warps if pc else 8) for ph, sc in ((1, False), (2, False), (2, True))]
            for const, ph, nw in variants:
                key = (kernel.fn.__name__, tuple(sorted(const.items())), dt, nw, ph,
                       tuple((k, v == 1, v % 16 == 0) for k, v in sorted(ints.items())))
                if key not in seen:
                    seen.add(key)
                    yield kernel, dict(const, PHASE=ph), ints, dt, nw, ph == 1
    for sc, lin, rows, whole in itertools.product((1, 4, 8, 32, 64, 128, 256), (False, True), (64, 512),
                                                  (False, True)):  # SEG's and GLOBAL's span records
        yield (span_scan, dict(SC=sc, BLOCK_R=rows, BLOCK_S=min(sc, 4), LINEAR=lin, ALL=whole),
               dict(NSPAN=528, SPAN_FRAMES=64, B=0, C=0, T=0, sxc=0), "fp32", 4, True)
    for R, C in ((4000, 512), (37, 50)):  # the weight partials' sum: sizes that are multiples of 16, and not
        yield sum_partials, dict(BLOCK_R=512, BLOCK_C=8), dict(R=R, C=C, B=0, T=0, sxc=0), "fp32", 4, False


def compile_one(args, maxnreg=0):
    """Compile one specialization for sm_90 (``maxnreg``: cap the registers of a thread, as the launcher's
    forced ``maxnreg`` does)."""
    kernel, const, ints, dt, warps, phase1 = args
    params = inspect.signature(kernel.fn).parameters
    names = list(params)
    sig, c, attrs = {}, dict(const), {}
    for i, n in enumerate(names):
        if n not in c and params[n].default is not inspect.Parameter.empty:
            c[n] = params[n].default  # a constexpr the launcher left at its default
        if n in c:
            sig[n] = "constexpr"
        elif n in PTR:
            t = PTR[n]
            sig[n] = {"X": f"*{dt}", "WS": "*fp32" if phase1 or const.get("PHASE") == 2 else "*i64"}.get(t, t)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in ("log2d", "eps", "log2d_span", "log2d_lo"):
            sig[n] = "fp32"
        elif ints[n] == 1:
            sig[n], c[n] = "constexpr", 1
        else:
            sig[n] = "i32"
            if ints[n] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=sig, constexprs=c, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})})
    return k


# H200 pipes, warp-instructions per clock per SM: issue 4, shuffles 1 (32 lanes), FP64 2 (64 lanes; the
# float32 <-> float64 conversions F2F run there too), MUFU 0.5 (16 lanes)
SMS, GHZ = 132, 1.98
FP64_OPS = ("DADD", "DFMA", "DMUL", "DSETP", "F2F")


def _sass(k) -> tuple[str, str]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    return res, sass


def _opcodes(sass, hot_loop):
    """Opcode counts of the whole kernel, or of its longest loop (a strip's walk over its tiles)."""
    ins = [m.groups() for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    ins = [(int(a, 16), t.split()) for a, t in ins if t.strip()]
    if hot_loop:
        loops = [(int(b.group(1), 16), a) for a, t in ins
                 for b in [re.search(r"(0x[0-9a-f]+)", " ".join(t))] if "BRA" in " ".join(t) and b
                 and int(b.group(1), 16) < a]
        if loops:
            lo, hi = max(loops, key=lambda l: l[1] - l[0])
            ins = [(a, t) for a, t in ins if lo <= a <= hi]
    return collections.Counter((t[1] if t[0].startswith("@") else t[0]).split(".")[0] for _, t in ins)


def resources(k, const=None, ints=None, warps=4) -> str:
    """Registers, spill stack and SASS instruction count (the 6 most frequent opcodes) of a compile. Given
    the compile's constants and sizes, also a static cost: warp-instructions per element of one tile (for a
    strip, of its walk's loop; otherwise of the whole kernel, each loop counted once) and the time that
    the busiest pipe alone would take over the whole input on an H200. A GPU-free proxy: a kernel whose
    bound exceeds the copy's time cannot reach it whatever its memory access."""
    res, sass = _sass(k)
    usage = " ".join(w for line in res.splitlines() if "REG:" in line for w in line.split()
                     if w.startswith(("REG:", "STACK:")))
    ops = _opcodes(sass, False)
    out = f"{usage} SMEM:{k.metadata.shared} LDGSTS:{ops['LDGSTS']} SASS:{sum(ops.values())} " + " ".join(f"{n}:{c}" for n, c in ops.most_common(6))
    if const is None:
        return out
    hot = _opcodes(sass, const["STRIP"])
    per = warps / (const["BLOCK_C"] * const["BLOCK_T"])  # one pass of the code per tile
    n, shfl, f64, mufu = (sum(hot.values()), hot["SHFL"], sum(hot[o] for o in FP64_OPS), hot["MUFU"])
    clk = max(n / 4, shfl, f64 / 2, mufu * 2) * per  # per element, per SM
    us = clk * ints["B"] * ints["C"] * ints["T"] / SMS / (GHZ * 1e3)
    return out + (f" | {n * per:.2f} warp-inst/elem (SHFL {shfl * per:.2f}, FP64 {f64 * per:.2f}), "
                  f"pipe bound {us:.0f} µs")


def _child(args, q, report, maxnreg=0):
    try:
        k = compile_one(args, maxnreg)
        kernel, const, ints, dt, warps, _ = args
        per_tile = (const, ints, warps) if "STRIP" in const else ()  # the template's kernels: a cost per element
        q.put(("ok", resources(k, *per_tile) if report else ""))
    except Exception as e:  # noqa: BLE001
        q.put(("error", str(e).splitlines()[-1][:200]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--limit", type=int, default=0, help="compile only every n-th specialization")
    p.add_argument("--resources", action="store_true", help="print registers and SASS counts")
    p.add_argument("--shape", help="B,C,T: only this shape (any, not only the benchmark shapes)")
    p.add_argument("--match", default="", help="NAME=VALUE,...: constexpr values (and layout=bct|btc) to keep")
    p.add_argument("--flags", default="plain,full", help=f"flag sets, of {', '.join(FLAG_SETS)}")
    p.add_argument("--set", default="", help="NAME=INT,...: compile the kept specializations with these "
                   "constexprs instead (e.g. STAGES=3)")
    p.add_argument("--maxnreg", type=int, default=0,
                   help="cap the registers of a thread (0: the compiler's choice)")
    a = p.parse_args()
    flag_sets = a.flags.split(",")
    if not set(flag_sets) <= set(FLAG_SETS):
        p.error(f"--flags: expected some of {', '.join(FLAG_SETS)}, got {a.flags!r}")
    shape = tuple(int(v) for v in a.shape.split(",")) if a.shape else None
    todo = list(configs(flag_sets, [shape] if shape else SHAPES))
    for cond in filter(None, a.match.split(",")):
        key, val = cond.split("=")
        if key == "layout":
            todo = [t for t in todo if (t[2]["sxc"] == 1) == (val == "btc")]
        else:
            todo = [t for t in todo if str(t[1].get(key)) == val]
    if a.limit:
        todo = todo[::a.limit]
    forced = dict((k, int(v)) for k, v in (c.split("=") for c in filter(None, a.set.split(","))))
    todo = [(t[0], dict(t[1], **forced), *t[2:]) if "STRIP" in t[1] else t for t in todo]
    print(f"triton {triton.__version__}: {len(todo)} specializations", flush=True)
    bad = 0
    ctx = mp.get_context("fork")
    for i in range(0, len(todo), a.jobs):
        procs = []
        for args in todo[i:i + a.jobs]:
            q = ctx.Queue()
            pr = ctx.Process(target=_child, args=(args, q, a.resources, a.maxnreg))
            pr.start()
            procs.append((args, pr, q))
        for args, pr, q in procs:
            pr.join()
            res = q.get() if pr.exitcode == 0 else ("crash", f"exit code {pr.exitcode}")
            if res[0] == "ok" and a.resources:
                kernel, const, ints, dt, warps, _ = args
                print(kernel.fn.__name__, dt, "btc" if ints["sxc"] == 1 else "bct", f"warps={warps}",
                      {k: const.get(k) for k in ("POOL_ALL", "MODE", "PHASE", "BLOCK_C", "BLOCK_T", "STRIP",
                                                 "HOLD", "HAS_W", "HAS_LEN", "VEC_T", "VEC_C") if k in const},
                      res[1], flush=True)
            if res[0] != "ok":
                bad += 1
                kernel, const, ints, dt, warps, _ = args
                print("FAIL", kernel.fn.__name__, res, dt, warps, {k: const.get(k) for k in ("POOL_ALL", "MODE", "PHASE",
                                                                           "BLOCK_C", "BLOCK_T", "HAS_SIN")},
                      "channels-last" if ints["sxc"] == 1 else "b c t", flush=True)
    print(f"{bad} of {len(todo)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
