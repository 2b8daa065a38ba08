"""The GPU-free parts of the benchmark tools, so that a launcher change cannot break them unseen."""
import json

import pytest

import compile_check


def test_compile_check_enumerates_each_kernels_own_tiles():
    """compile_check compiles what the launchers pick: the forward and the backward with their own tiles
    (FRAME's "b c t" fp32 forward in 256 channels, its backward in 128), SEG's span_scan and the walks that
    read its records, and the weight partials' sum."""
    todo = list(compile_check.configs())
    frame = [(k.fn.__name__, c["BLOCK_C"], c["BLOCK_T"]) for k, c, ints, dt, warps, _ in todo
             if (ints["B"], ints["C"], ints["T"]) == (16, 512, 16000) and dt == "fp32" and c["MODE"] == 0
             and c["POOL_ALL"] and ints["sxt"] == 1]
    assert set(frame) == {("running_norm_fwd", 256, 32), ("running_norm_bwd", 128, 32)}
    assert {k.fn.__name__ for k, *_ in todo} == {"running_norm_fwd", "running_norm_bwd", "sum_partials",
                                                  "span_scan"}
    # SEG walks and GLOBAL tiles that read span_scan's records, forward and backward
    scanned = {(k.fn.__name__, c["MODE"]) for k, c, *_ in todo if c.get("SCANNED")}
    assert scanned == {(k, m) for k in ("running_norm_fwd", "running_norm_bwd") for m in (1, 2, 3)}


def test_compile_check_layer_flags_are_a_training_step():
    """--flags layer compiles what a layer's training step runs: affine weight and bias, saved prefixes and
    the weight's gradient partials, without lengths, states or the strip walks that "full" adds."""
    layer = list(compile_check.configs(("layer",)))
    assert layer and all(c["HAS_W"] and not c["HAS_LEN"] and not c.get("HAS_SIN") for k, c, *_ in layer
                         if k.fn.__name__.startswith("running_norm"))
    assert all(c["HAS_B"] and c["STORE_PREFIX"] for k, c, *_ in layer if k.fn.__name__ == "running_norm_fwd")
    assert all(c["STORE_GW"] for k, c, *_ in layer if k.fn.__name__ == "running_norm_bwd")
    full = [c for k, c, *_ in compile_check.configs(("full",)) if k.fn.__name__.startswith("running_norm")]
    assert full and all(c["HAS_W"] and c["HAS_LEN"] for c in full)


def test_ab_runs_each_variant_in_its_own_process_and_compares_bits():
    """ab.py's plumbing, untimed on the CPU (Triton's interpreter): the working tree against a copy of its
    own kernels gives the same bits; a kernels file whose statistics differ is flagged. A streaming case
    (":state") runs too."""
    import os
    import subprocess
    import sys
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(os.path.dirname(os.path.dirname(here)), "normlib", "backends", "triton", "kernels.py")
    with tempfile.TemporaryDirectory() as tmp:
        same = os.path.join(tmp, "same.py")
        other = os.path.join(tmp, "other.py")
        text = open(src).read()
        open(same, "w").write(text)
        shift = "(ks / C).to(tl.float32)"  # _shift's pooled K: the altered file shifts by K + 0.5
        assert text.count(shift) == 1, "_shift's form changed: alter the kernels file another way"
        open(other, "w").write(text.replace(shift, "(ks / C + 0.5).to(tl.float32)"))
        out = subprocess.run([sys.executable, os.path.join(here, "ab.py"), "--dry", "--procs", "1", "--kernels", same,
                              "--kernels", other, "cln:2,5,9:fp32:bct", "ccemaln:2,5,9:fp32:btc:state"],
                             env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True,
                             check=True).stdout
    line, streaming = out.splitlines()
    tree, s, o = line.split(" | ")
    assert line.startswith("cln:2,5,9:fp32:bct: tree:") and "other bits" not in tree + s and "other bits" in o
    tree, s, _o = streaming.split(" | ")
    assert streaming.startswith("ccemaln:2,5,9:fp32:btc:state: tree:") and "other bits" not in tree + s


def test_ab_shows_a_failed_workers_error():
    """A variant whose worker fails (here a kernels file that is not there) stops the run with the worker's own
    error on stderr, not only an exit status."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, os.path.join(here, "ab.py"), "--dry", "--procs", "1", "--kernels",
                           "/nonexistent/k_gone.py", "cln:1,2,3:fp32:bct"],
                          env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True)
    assert done.returncode != 0
    assert "k_gone.py" in done.stderr and "FileNotFoundError" in done.stderr and "exited" in done.stderr


def test_host_ab_runs_each_tree_in_its_own_process():
    """host_ab.py's plumbing on the CPU, untimed: the working tree, another (a link to the same package) and the
    working tree with a forced launch choice each import their own normlib and time every layer; a tree without
    one stops the run with the worker's error."""
    import os
    import subprocess
    import sys
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    with tempfile.TemporaryDirectory() as tmp:
        other = os.path.join(tmp, "other")
        os.makedirs(other)
        os.symlink(os.path.join(root, "normlib"), os.path.join(other, "normlib"))
        cmd = [sys.executable, os.path.join(here, "host_ab.py"), "--dry", "--procs", "1", "--shape", "2,8,30"]
        out = subprocess.run(cmd + ["--tree", other, "--tree", "tree@global_launches=1", "cln,gln"],
                             capture_output=True, text=True, check=True).stdout
        rows = [line for line in out.splitlines() if line.startswith(("cln ", "gln ", "nn.GroupNorm"))]
        assert len(rows) == 6 and all("tree: " in r and "other: " in r and "tree@global_launches=1: " in r
                                      for r in rows), out
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        done = subprocess.run(cmd + ["--tree", empty, "cln"], capture_output=True, text=True)
    assert done.returncode != 0 and "exited" in done.stderr and "imported" in done.stderr


def test_launch_cost_records_a_norms_one_launch():
    """launch_cost.py's recorder on the CPU (Triton's interpreter, in a process of its own): a cln call's one
    launch with its tensors bound (it patched a launch function that no longer existed, and broke)."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import torch, normlib, launch_cost\n"
            "kernel, grid, kw = launch_cost.single_launch(normlib.get('cln').spec, torch.randn(2, 8, 30))\n"
            "print(getattr(kernel, 'fn', kernel).__name__, grid, type(kw['x_ptr']).__name__, kw['T'])")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([here, os.path.dirname(os.path.dirname(here))]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "running_norm_fwd" and "Tensor 30" in out, out


def test_ab_cases_end_in_a_layout_or_state():
    import ab

    assert ab.parse_case("cln:1,2,3:bf16:btc:state") == ("cln", (1, 2, 3), "bf16", "b t c", True)
    assert ab.parse_case("cln:1,2,3:bf16:bct")[4] is False
    with pytest.raises(ValueError, match="a case ends in its layout or in :state"):
        ab.parse_case("cln:1,2,3:bf16:bct:stat")


def test_ab_variant_forces_tiles():
    """A variant's @ part is what launch.tile_size takes; 'tree' keeps the working tree's kernels."""
    import ab
    from normlib.backends.triton import launch

    fwd = launch.running_norm_fwd
    assert ab.use_variant("tree@block_c=64,block_t=32") == {"block_c": 64, "block_t": 32}
    assert ab.use_variant("tree") == {} and launch.running_norm_fwd is fwd


def test_forward_l2_hints_in_its_ptx():
    """The CUMULATIVE forwards at (16, 512, 16000) fp32 "b c t", compiled for sm_90. cln's pooled tiles
    keep the chunks they read again (evict_last) and stream their other reads and y (evict_first): without
    the hints ncu counted x read 1.39 times from DRAM. ccln's per-channel tiles, untimed with hints, go
    without."""
    import re

    def vector_ops(pooled):
        (args,) = [a for a in compile_check.configs()
                   if a[0].fn.__name__ == "running_norm_fwd" and a[3] == "fp32" and a[1]["MODE"] == 1
                   and a[1]["POOL_ALL"] == pooled and a[2]["sxt"] == 1
                   and (a[2]["B"], a[2]["C"], a[2]["T"]) == (16, 512, 16000)][:1]
        ptx = compile_check.compile_one(args).asm["ptx"]
        return set(re.findall(r"\b(?:ld|st)\.global[\w:.]*\.v\d", ptx))  # the tile's vector loads and stores

    assert vector_ops(True) == {"ld.global.L1::evict_last.L2::cache_hint.v4",
                                "ld.global.L1::evict_first.L2::cache_hint.v4",
                                "st.global.L1::evict_first.L2::cache_hint.v4"}
    assert vector_ops(False) == {"ld.global.v4", "st.global.v4"}


def test_compile_check_caps_registers():
    """--maxnreg reaches the compiler: the PTX of the pooled "b t c" forward with a layer's flags (141 registers
    at (16, 512, 16000) fp32 under Triton 3.6) carries the cap, which ptxas must keep."""
    import re
    (args,) = [a for a in compile_check.configs(("layer",))
               if a[0].fn.__name__ == "running_norm_fwd" and a[3] == "fp32" and a[1]["MODE"] == 1
               and a[1]["POOL_ALL"] and a[2]["sxc"] == 1 and not a[1]["STRIP"]
               and (a[2]["B"], a[2]["C"], a[2]["T"]) == (16, 512, 16000)][:1]
    assert ".maxnreg" not in compile_check.compile_one(args).asm["ptx"]
    assert re.search(r"\.maxnreg\s+128\b", compile_check.compile_one(args, 128).asm["ptx"])


def test_gpu_report_grad_shapes_select_segmented_rows():
    """--grad-shapes takes BxCxT, or BxCxT:seg for the running norms walked in segments, so one device call
    can run just the rows a former call's time limit cut."""
    import pytest

    from gpu_report import grad_runs
    assert grad_runs("3x50x1001,2x128x20000:seg") == [((3, 50, 1001), None), ((2, 128, 20000), 2)]
    assert grad_runs(None) is None
    for bad in ("2x128x20000:strip", "3x50", "3x50x1001,"):
        with pytest.raises(ValueError, match="grad-shapes"):
            grad_runs(bad)


def test_gpu_report_targets_in_device_time():
    """--table with a graphs file: each target over its rows in device time, the backward as the step less the
    forward, torch.compile compared on the large shapes only (its small rows time the host)."""
    from gpu_report import graph_targets

    def row(norm, shape, fwd, step, copy=1.0, dtype="fp32", layout="b c t"):
        B, C, T = shape
        return dict(norm=norm, B=B, C=C, T=T, dtype=dtype, layout=layout, graph_fwd=fwd, graph_step=step,
                    graph_copy=copy)
    big, small = (16, 512, 16000), (80, 64, 301)
    rows = [row("cln", big, 1.0, 2.5), row("gln", big, 2.0, 6.0), row("frameln", big, 1.1, 3.0),
            row("ccln", small, 1.4, 5.0), row("ccln", (64, 128, 500), 3.0, 9.0)]
    compiled = [dict(norm="cln", B=16, C=512, T=16000, dtype="fp32", cmp_fwd=2.0, cmp_step=4.0),
                dict(norm="ccln", B=80, C=64, T=301, dtype="fp32", cmp_fwd=9.0, cmp_step=90.0)]
    lines = {ln.split(" | ")[0][2:]: ln.split(" | ")[1:] for ln in graph_targets(rows, compiled).splitlines()[2:]}
    pooled = lines["forward ≥ 0.85 of a copy: pooled, fp32 'b c t'"]
    assert pooled[:2] == ["2 / 3", "0.91"] and pooled[2].startswith("0.50 gln") and pooled[3].startswith("1.00 cln")
    assert lines["backward ≥ 0.75 of a copy: pooled, large"][:2] == ["2 / 3", "0.79"]  # 1.5 / (step - fwd)
    assert lines["forward ≤ 1.5 × a copy's time: small (figure: times a copy's)"][:2] == ["1 / 2", "2.20"]
    assert lines["forward ≥ 1.5 × faster than torch.compile: large"][:2] == ["1 / 1", "2.00"]
    assert lines["step ≥ 2 × faster than torch.compile: large"][:2] == ["0 / 1", "1.60"]
    assert "forward ≥ 0.75 of a copy: ccln" not in lines and "forward ≥ 0.85 of a copy: pooled, bf16 'b c t'" not in lines


def test_stream_table_times_each_causal_norm_beside_groupnorm(tmp_path, monkeypatch):
    """stream_table.py's rows and table, untimed: one cell of each causal norm streams through its layer, and
    the merged table keeps the best of the runs, over GroupNorm's time of the same run."""
    import stream_table
    monkeypatch.setattr(stream_table, "CHANNELS", (8,))
    monkeypatch.setattr(stream_table, "FRAMES", (3,))
    monkeypatch.setattr(stream_table, "best_us", lambda fn: (fn(), 2.0)[1])
    rows = list(stream_table.rows())
    assert [r["norm"] for r in rows] == ["GroupNorm", *stream_table.NORMS]
    runs = []
    for k, scale in enumerate((1.0, 0.5)):
        runs.append(tmp_path / f"run{k}.jsonl")
        runs[-1].write_text("".join(json.dumps(dict(r, us=r["us"] * (scale if r["norm"] == "cln" else 1.0))) + "\n"
                                    for r in rows))
    line = stream_table.table([str(p) for p in runs]).splitlines()[2]
    assert line.startswith("| 8, 3 | 2.0 | 1.0 (0.5 ×) | 2.0 (1.0 ×)")
