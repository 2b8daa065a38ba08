"""The Triton backend's backward (``backend="triton"``) against torch.autograd of the float64 reference.

Every gradient the backward produces (x, weight, bias, and the incoming state's w, m and m2 for the causal
norms, through y and through the returned state) is compared with autograd through
``normlib.reference`` on float64 copies of the same inputs. Without a GPU the kernels run on CPU tensors
in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), which runs Python per program: shapes
are small, tiles are forced small with ``tile_size`` so that a sequence spans several tiles and the reverse
look-back runs, and ``walk=True`` makes it ignore published suffixes but the last tile's, so it walks
across several windows. With a GPU the same tests run on CUDA tensors.

Every buffer the launcher allocates with ``torch.empty``/``empty_like`` (dx, the per-tile weight partials,
the GLOBAL span sums) is filled with NaN first, so an element the kernel forgets to write fails.
"""
import itertools
import math

import pytest
import torch

import normlib
from normlib import backends
from normlib.backends.triton import launch, tile_size
from conftest import (padding_mask, NORMS, SPECS, TOL, assert_rel, assert_state_close, make_affine, make_lengths,
                      make_state, make_x, ref, rel_err, state_shape)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
F32, F16 = torch.float32, torch.float16
DTYPES = {"f32": F32, "f16": F16}
LAYOUTS = {"bct": "b c t", "btc": "b t c"}
RUNNING = ("cln", "ccln", "emaln", "ccemaln")  # the look-back norms (CUMULATIVE and EMA)
CAUSAL = RUNNING + ("frameln",)
GLOBAL = ("gln", "instln")
SD = normlib.NormState.empty((1,)).dtype  # the states' dtype (float64, whatever the input's)
STATE_FIELDS = ("state.w", "state.m", "state.m2")
GRID_EPS = 0.05  # large enough that eps inside / outside the sqrt change the gradients far beyond tolerance

# Relative error against the float64 reference's gradients, by input dtype. Measured over the grid in the
# interpreter: fp32 <= 2.7e-7 for dx, dweight, dbias and <= 6.3e-7 for the state's gradients (float32
# statistics); fp16 <= 3.7e-4 for dx, dweight, dbias (rounded to fp16), <= 2.1e-7 for the state's gradients
# (float64 outputs, computed in float32 from the exact fp16 inputs).
GRAD_TOL = {F32: 1e-5, F16: TOL[F16]}
STATE_GRAD_TOL = {F32: 1e-5, F16: 1e-5}

pytestmark = [pytest.mark.skipif(not backends.triton_usable(torch.zeros(1, device=DEVICE)),
                                 reason="the Triton backend needs a GPU or TRITON_INTERPRET=1"),
              pytest.mark.usefixtures("poisoned_buffers")]


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------
def dev(t):
    return None if t is None else t.to(DEVICE)


def eps_for(name):
    """eps for tests without an incoming state: a per-channel norm's first frame has variance 0 and its
    second one nearly so, where eps=1e-8 makes the gradient ill-conditioned (relative error ~1e-4 in
    float32, for the torch backend as well); 1e-3 keeps it well-conditioned."""
    return 1e-3 if SPECS[name].per_channel else 1e-8


def tdim(layout):
    return 2 if layout == "b c t" else 1


def cotangents(name, x, B, C, with_state, seed=7):
    """Fixed random weights of the loss: one for y (in y's dtype, so both sides see the same values) and,
    where the returned state is in the loss, one per state field (float64)."""
    g = torch.Generator().manual_seed(seed)
    gy = torch.randn(x.shape, generator=g, dtype=torch.float64).to(x.dtype)
    shape = (B, C) if SPECS[name].per_channel else (B,)
    gs = [torch.randn(shape, generator=g, dtype=SD) for _ in STATE_FIELDS] if with_state else None
    return gy, gs


def gradients(name, x, weight=None, bias=None, eps=1e-8, *, state=None, gy, gs=None, oracle=False,
              requires=("x", "weight", "bias", "state"), backend="triton", **kw):
    """{input: dL/dinput} for L = sum(y * gy) (+ sum over the returned state's fields of field * gs[i]).

    The Triton backend's (or ``backend``'s, through the public functional API), or, with ``oracle``, torch.autograd's
    through the float64 reference on float64 copies. ``requires`` names the inputs that require grad;
    an input that got no gradient (None) comes back as zeros. ``kw``: layout, lengths, eps_mode, decay.
    """
    to = (lambda t: t.detach().to(torch.float64).clone()) if oracle else (lambda t: dev(t).detach().clone())
    x = to(x).requires_grad_("x" in requires)
    w = None if weight is None else to(weight).requires_grad_("weight" in requires)
    b = None if bias is None else to(bias).requires_grad_("bias" in requires)
    st = None if state is None else normlib.NormState(*(to(t).requires_grad_("state" in requires) for t in state))
    inputs = {"x": x, "weight": w, "bias": b}
    if st is not None:
        inputs.update(zip(STATE_FIELDS, st))
    inputs = {k: v for k, v in inputs.items() if v is not None and v.requires_grad}
    if SPECS[name].causal:
        kw.update(state=st, return_state=gs is not None)
    if oracle:
        out = ref(name, x, w, b, eps, **kw)
    else:
        kw["lengths"] = dev(kw.get("lengths"))
        out = getattr(normlib.functional, name)(x, w, b, eps, backend=backend, **kw)
    y, s = out if gs is not None else (out, None)
    loss = (y * (gy.to(torch.float64) if oracle else dev(gy))).sum()
    if gs is not None:
        loss = loss + sum((f * (g if oracle else dev(g))).sum() for f, g in zip(s, gs))
    got = torch.autograd.grad(loss, list(inputs.values()), allow_unused=True)
    return {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(inputs.items(), got)}


def check_gradients(got, want, dtype, what="", device=DEVICE):
    """The same inputs got a gradient, on ``device`` (the Triton backend's; the CPU for the PyTorch backend's
    CPU calls), without NaN, within tolerance of the float64 reference (STATE_GRAD_TOL for the state's
    fields, GRAD_TOL for x, weight and bias)."""
    assert set(got) == set(want), f"{what}: gradients for {sorted(got)}, expected {sorted(want)}"
    for k, g in got.items():
        assert g.device.type == device.type, f"{what} grad {k}: on {g.device}"
        assert not torch.isnan(g).any(), f"{what} grad {k}: NaN (an element left unwritten?)"
        tol = STATE_GRAD_TOL[dtype] if k.startswith("state.") else GRAD_TOL[dtype]
        assert_rel(g, want[k], tol, f"{what} grad {k}")


# ---------------------------------------------------------------------------------------------------
# The flag grid: every norm x every flag of the backward, pairwise-covered, against the float64 oracle
# ---------------------------------------------------------------------------------------------------
def pairwise(factors):
    """Rows of ``factors`` (two values each, at most 10 factors) in which every pair of values of every two
    factors appears at least once, in 6 rows: row 0 takes every factor's first value, and factor i takes
    its second value in the rows of the i-th 3-subset of rows 1..5 (two 3-subsets of 5 rows meet, and
    differ both ways)."""
    subsets = list(itertools.combinations(range(1, 6), 3))
    assert all(len(v) == 2 for v in factors.values()) and len(factors) <= len(subsets)
    return [{name: values[r in subsets[i]] for i, (name, values) in enumerate(factors.items())} for r in range(6)]


def test_pairwise_covers_every_pair():
    factors = {f"f{i}": [f"a{i}", f"b{i}"] for i in range(10)}
    rows = pairwise(factors)
    for a, b in itertools.combinations(factors, 2):
        assert {(r[a], r[b]) for r in rows} == set(itertools.product(factors[a], factors[b])), (a, b)


def _grid():
    params = []
    for name in NORMS:
        spec = SPECS[name]
        # weight and bias as two factors: pairwise coverage then holds all four affine combinations
        factors = dict(weight=["w", "now"], bias=["b", "nob"], lengths=["full", "len"],
                       eps_mode=["inside", "outside"], layout=list(LAYOUTS), dtype=list(DTYPES))
        if name in RUNNING:
            factors["tiles"] = ["walk", "strip"]
        if name in GLOBAL:
            factors["tiles"] = ["span2", "strip"]  # spans of 1: the default here, in the other tests
        if spec.causal:
            factors.update(state_in=["nostate", "sin"], state_out=["noret", "sout"])
        if spec.per_channel:
            factors.update(cblocks=["1cb", "2cb"])
        for row in pairwise(factors):
            row = dict(dict(tiles="look", state_in="nostate", state_out="noret", cblocks="1cb"), **row)
            parts = [name, row["layout"], row["weight"], row["bias"], row["lengths"]]
            parts += [row["tiles"]] if name in RUNNING + GLOBAL else []
            parts += [row["cblocks"]] if spec.per_channel else []
            parts += [p for p in (row["state_in"], row["state_out"]) if p not in ("nostate", "noret")]
            parts += [f"eps{row['eps_mode']}", row["dtype"]]
            params.append(pytest.param(name, row, id="-".join(parts)))
    return params


@pytest.mark.parametrize("name, row", _grid())
def test_gradient_grid(name, row):
    """C=5 in tiles of 4 frames: T=13 (4 tiles, the last one frame long) where the look-back walks (windows
    of 2, so the walk crosses windows), T=9 (3 tiles) otherwise, by look-back or one program per sequence
    (strip); per-channel norms in one block of 8
    channels or two of 4 (the second partial); GLOBAL in spans of 2 tiles or one program per sequence. Lengths T, 7 (inside a
    tile) and 0 (B=3), else B=2; an incoming state whose second row is empty (weight 0); a loss on y and
    on all three fields of the returned state."""
    B, C, T = (3 if row["lengths"] == "len" else 2), 5, (13 if row["tiles"] == "walk" else 9)
    dtype, layout = DTYPES[row["dtype"]], LAYOUTS[row["layout"]]
    x = make_x(B, C, T, layout, dtype, offset=0.3)
    w, b = make_affine(C, dtype)
    w = w if row["weight"] == "w" else None
    b = b if row["bias"] == "b" else None
    lengths = torch.tensor([T, 7, 0]) if row["lengths"] == "len" else None
    state = make_state(name, B, C, SD, empty_rows=(1,)) if row["state_in"] == "sin" else None
    gy, gs = cotangents(name, x, B, C, row["state_out"] == "sout")
    kw = dict(state=state, gy=gy, gs=gs, layout=layout, lengths=lengths, eps_mode=row["eps_mode"])
    tiles = dict(block_t=4, window=2, block_c=4 if row["cblocks"] == "2cb" else 8)
    if row["tiles"] == "walk":
        tiles["walk"] = True
    elif row["tiles"] == "strip":  # one program walks each sequence and carries the suffix
        tiles["strip"] = True
    elif row["tiles"].startswith("span"):
        tiles["span"] = int(row["tiles"][4:])

    with tile_size(**tiles):
        got = gradients(name, x, w, b, GRID_EPS, **kw)
    want = gradients(name, x, w, b, GRID_EPS, oracle=True, **kw)

    assert got["x"].dtype == dtype and got["x"].shape == x.shape
    check_gradients(got, want, dtype)
    if lengths is not None:
        pad = padding_mask(lengths, layout, B, C, T)
        assert (got["x"].cpu()[pad] == 0).all(), "padding frames must get exactly zero gradient"


@pytest.mark.parametrize("name", ["cln", "gln", "emaln", "frameln"])
def test_pooled_backward_chunks_channels_its_own_way(name):
    """A pooled backward may visit a tile's channels in other chunks, on other warps, than its forward
    (it reads only the tiles' prefixes): C=11 in chunks of 4 forward and of 8 backward, 4 tiles of 4
    frames, lengths, an incoming state and a loss on the returned state."""
    B, C, T = 3, 11, 15
    x = make_x(B, C, T, LAYOUTS["bct"], F32, offset=0.3)
    w, b = make_affine(C, F32)
    lengths = torch.tensor([T, 9, 1])
    causal = SPECS[name].causal
    state = make_state(name, B, C, SD, empty_rows=(1,)) if causal else None
    gy, gs = cotangents(name, x, B, C, causal)
    kw = dict(state=state, gy=gy, gs=gs, layout=LAYOUTS["bct"], lengths=lengths)
    with tile_size(block_t=4, window=2, block_c=4, bwd_block_c=8, bwd_warps=2):
        got = gradients(name, x, w, b, eps_for(name), **kw)
    want = gradients(name, x, w, b, eps_for(name), oracle=True, **kw)
    check_gradients(got, want, F32)


def _walk_case(name, layout, dtype=F32):
    """(x, w, b, kw) for gradients(): 3 sequences of 19 frames, 5 channels, lengths (one inside a tile, one
    of 1 frame), an incoming state with an empty row and a loss on the returned state."""
    B, C, T = 3, 5, 19
    x = make_x(B, C, T, LAYOUTS[layout], dtype, offset=0.3)
    w, b = make_affine(C, dtype)
    state = make_state(name, B, C, SD, empty_rows=(1,))
    gy, gs = cotangents(name, x, B, C, True)
    return x, w, b, dict(state=state, gy=gy, gs=gs, layout=LAYOUTS[layout], lengths=torch.tensor([T, 7, 1]))


@pytest.mark.parametrize("name, layout, span, scan", [
    pytest.param(n, lay, sp, sc, id=f"{n}-{lay}-span{sp}" + "-scan" * sc) for n in RUNNING
    for lay, sp, sc in (("bct", 2, False), ("btc", 2, False), ("bct", 9, False), ("btc", 1, True))])
def test_segmented_gradients(name, layout, span, scan, monkeypatch):
    """Forward and backward walked in segments (strip=2: segments of 2 tiles of 4 frames, the last of one,
    whose sums are read in windows of 2; or of one tile, their sums merged first by span_scan in blocks of
    2 segments; or one segment, which needs no sums): lengths (one inside a tile, one of 1 frame), an
    incoming state with an empty row and a loss on the returned state, so that the suffix sums carry
    dstate's terms."""
    scans = []
    if scan:
        monkeypatch.setattr(launch, "SCAN_SPANS", 1)
        monkeypatch.setattr(launch, "SCAN_ROWS", 2)
        real = launch.span_scan

        class Spy:
            def __getitem__(self, grid):
                def run(*a, **k):
                    scans.append((k["NSPAN"], k["LINEAR"]))
                    return real[grid](*a, **k)
                return run
        monkeypatch.setattr(launch, "span_scan", Spy())
    x, w, b, kw = _walk_case(name, layout)
    with tile_size(block_t=4, window=2, block_c=2, strip=2, span=span):
        got = gradients(name, x, w, b, eps_for(name), **kw)
    assert scans == ([(5, False), (5, True)] if scan else [])  # 5 segments: forward, then backward
    want = gradients(name, x, w, b, eps_for(name), oracle=True, **kw)
    check_gradients(got, want, F32)


@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("name", RUNNING)
def test_span_scan_gradients(name, layout, monkeypatch):
    """span_scan, forced from 2 segments in blocks of 2: segments of 3 tiles of 2 frames, the last of one
    (4 segments: blocks of 2 and 1), and of 2 tiles of 1 frame (10 segments: 5 blocks, the last partial), so
    a segment's decay spans several tiles; blocks of 8 channels, which a per-channel scan covers with 2
    programs of 4 statistics, or 8 of one (the launcher's choice where the first leaves SMs idle). Lengths,
    an incoming state and a loss on the returned state, against float64."""
    monkeypatch.setattr(launch, "SCAN_SPANS", 1)
    monkeypatch.setattr(launch, "SCAN_ROWS", 2)
    x, w, b, kw = _walk_case(name, layout)
    want = gradients(name, x, w, b, eps_for(name), oracle=True, **kw)
    for tiles in (dict(block_t=2, span=3), dict(block_t=1, span=2), dict(block_t=1, span=2, scan_block=1),
                  dict(block_t=1, span=2, scan_block=4)):  # 4 forced: a GPU's SMs make the launcher pick 1
        with tile_size(window=2, block_c=8, strip=2, **tiles):
            got = gradients(name, x, w, b, eps_for(name), **kw)
        check_gradients(got, want, F32)


@pytest.mark.parametrize("name", ["ccln"])
def test_forward_and_backward_walk_their_own_segments(name, monkeypatch):
    """ccln "b t c": the forward walks more segments than the backward (SEG_PER_SM[2]), here 3
    segments of one tile of 8 frames forward and 2 (2 tiles and 1) backward; the backward reads only the
    tiles' saved prefixes, so its gradients still match float64."""
    monkeypatch.setattr(launch, "_num_sms", lambda device: 4)  # 3 sequences: 4 and 2 walks
    monkeypatch.setattr(launch, "SEG_PER_SM", launch.SEG_PER_SM[:2] + ((3, 2),))
    monkeypatch.setattr(launch, "SEG_MIN_TILES", 1)
    x, w, b, kw = _walk_case(name, "btc")
    tiles = launch.tiles_for(dev(x).transpose(1, 2), True, SPECS[name].resolve_decay(None))
    assert tiles[1] == 8 and (tiles[4], tiles[13]) == (1, 2)
    launched = _spy_launches(monkeypatch, ("NSPAN",))
    got = gradients(name, x, w, b, eps_for(name), **kw)
    assert sorted({(w_, p, n) for w_, p, *_, n in launched}) == [("bwd", 1, 2), ("bwd", 2, 2), ("fwd", 1, 3),
                                                                  ("fwd", 2, 3)]
    check_gradients(got, gradients(name, x, w, b, eps_for(name), oracle=True, **kw), F32)


@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("name", GLOBAL)
def test_span_scan_global_gradients(name, layout, monkeypatch):
    """GLOBAL's span sums reduced once by span_scan (forced from 2 spans, in blocks of 2), whose totals every
    tile reads: 10 spans of 2 frames (5 blocks, the last partial), blocks of 8 channels (2 scan programs
    per channel block), lengths 19, 7 and 1. Forward and backward each launch it over all the spans."""
    monkeypatch.setattr(launch, "SCAN_SPANS", 1)
    monkeypatch.setattr(launch, "SCAN_ROWS", 2)
    scans, real = [], launch.span_scan

    class Spy:
        def __getitem__(self, grid):
            def run(*a, **k):
                scans.append((k["NSPAN"], k["LINEAR"], k["ALL"]))
                return real[grid](*a, **k)
            return run
    monkeypatch.setattr(launch, "span_scan", Spy())
    B, C, T = 3, 5, 19
    x = make_x(B, C, T, LAYOUTS[layout], F32, offset=0.3)
    w, b = make_affine(C, F32)
    gy, gs = cotangents(name, x, B, C, False)
    kw = dict(gy=gy, gs=gs, layout=LAYOUTS[layout], lengths=torch.tensor([T, 7, 1]))
    with tile_size(block_t=2, span=1, window=2, block_c=8):
        got = gradients(name, x, w, b, eps_for(name), **kw)
    assert scans == [(10, False, True), (10, True, True)]
    check_gradients(got, gradients(name, x, w, b, eps_for(name), oracle=True, **kw), F32)


@pytest.mark.parametrize("name", ["cln", "emaln", "gln"])
def test_a_pooled_backward_on_rows_not_16_byte_aligned_takes_smaller_tiles(name):
    """Rows that are not 16-byte aligned load one element at a time: a pooled "b c t" backward tile takes 64
    channels there (128 spilled on the H100); aligned rows and "b t c" keep 128. Its gradients at such a shape
    (200 channels: 4 chunks, the last partial) against the float64 oracle."""
    decay = {"cln": 1.0, "emaln": 0.9, "gln": None}[name]
    bwd_c = lambda x: launch._tiles_for(x, False, decay)[9]  # noqa: E731
    for T, want in ((3999, launch.UNALIGNED_BWD_C), (4002, launch.UNALIGNED_BWD_C), (4000, 128)):
        assert bwd_c(torch.empty(4, 512, T)) == want, T
        assert bwd_c(torch.empty(4, T, 512).transpose(1, 2)) == 128, T
    assert bwd_c(torch.empty(4, 512, 4001, dtype=torch.bfloat16)) == launch.UNALIGNED_BWD_C
    assert bwd_c(torch.empty(4, 512, 4008, dtype=torch.bfloat16)) == 128
    g = torch.Generator().manual_seed(5)
    x = make_x(2, 200, 37, generator=g)
    w, b = make_affine(200, F32, generator=g)
    gy = torch.randn(x.shape, generator=g)
    kw = dict(gy=gy, **({"decay": decay} if name == "emaln" else {}))
    check_gradients(gradients(name, x, w, b, **kw), gradients(name, x, w, b, oracle=True, **kw), F32, name)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_instln_rows_walk_one_channel_a_program(dtype, monkeypatch):
    """Long per-channel GLOBAL "b c t" inputs with many short rows (row_walk): [1, ROW_WALK_T] tiles, one program
    a channel walking its row twice, forward and backward; "b t c", long rows, few rows or a small x keep
    their launches. Run at a small size with the thresholds lowered: 4 tiles a row (the last partial), lengths
    29, 0 and 11, against the float64 reference."""
    sizes = lambda B, C, T, last=False, es=4: launch.choose_launch(  # noqa: E731
        B, C, T, True, last, launch.GLOBAL, 132, B * C * T * es, es)
    assert sizes(16, 512, 16000)[:4] == (1, 2048, 4, 1) and sizes(16, 512, 16000)[8] == 1
    assert sizes(16, 512, 16000, es=2)[:4] == (1, 2048, 4, 1)
    assert sizes(16, 512, 16000, last=True)[0] > 1 and sizes(2, 256, 64000)[0] > 1  # "b t c"; 256 KB rows
    assert sizes(1, 256, 16000)[0] > 1 and sizes(4, 512, 4000)[0] > 1  # 256 rows on 132 SMs; 33 MB
    monkeypatch.setattr(launch, "GLOBAL_STRIP_BYTES", 0)
    monkeypatch.setattr(launch, "ROW_WALK_T", 8)
    monkeypatch.setattr(launch, "ROW_WALKS_PER_SM", 0)
    launched = _spy_launches(monkeypatch, extra=("BLOCK_C", "BLOCK_T"))
    B, C, T = 3, 5, 29
    dt = DTYPES[dtype]
    x = make_x(B, C, T, "b c t", dt, offset=2.0)
    w, b = make_affine(C, dt)
    gy, _ = cotangents("instln", x, B, C, False)
    kw = dict(gy=gy, layout="b c t", lengths=torch.tensor([T, 0, 11]))
    got = gradients("instln", x, w, b, eps_for("instln"), **kw)
    assert sorted(set(launched)) == [("bwd", 2, False, True, False, 1, 8), ("fwd", 2, False, True, False, 1, 8)]
    check_gradients(got, gradients("instln", x, w, b, eps_for("instln"), oracle=True, **kw), dt)
    y = normlib.functional.instln(dev(x), dev(w), dev(b), eps_for("instln"), lengths=dev(kw["lengths"]),
                                  backend="triton")
    assert_rel(y, ref("instln", x, w, b, eps_for("instln"), lengths=kw["lengths"]), TOL[dt], "y")


def _spy_launches(monkeypatch, extra=()):
    """Record (forward or backward, PHASE, SEG, STRIP, FLIP, the ``extra`` arguments, False where not
    passed) of every launch of the template's kernels."""
    launched = []

    class Spy:
        def __init__(self, kernel, which):
            self.kernel, self.which = kernel, which

        def __getitem__(self, grid):
            def run(**k):
                launched.append((self.which, k["PHASE"], k.get("SEG", False), k["STRIP"], k.get("FLIP", False))
                                + tuple(k.get(e, False) for e in extra))
                return self.kernel[grid](**k)
            return run
    monkeypatch.setattr(launch, "running_norm_fwd", Spy(launch.running_norm_fwd, "fwd"))
    monkeypatch.setattr(launch, "running_norm_bwd", Spy(launch.running_norm_bwd, "bwd"))
    return launched


@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("name", ["cln", "emaln", "gln", "frameln"])
def test_pooled_forward_with_full_chunks_of_channels(name, layout):
    """C a multiple of the pooled chunk (8 channels in chunks of 4) and not (7): masked values then sit
    only in masked frames, so a frame statistic that skipped the mask would still pass C = 8 but not 7.
    Look-back tiles and strip walks, lengths (one inside a tile, one of 1 frame), tiles past T; y against
    float64, and the gradients, which read the prefixes the forward saved."""
    B, T = 3, 19
    for C, strip in itertools.product((8, 7), (0, 1)):
        x = make_x(B, C, T, LAYOUTS[layout], F32, offset=0.3)
        w, b = make_affine(C, F32)
        gy, _gs = cotangents(name, x, B, C, False)
        lengths = torch.tensor([T, 7, 1])
        kw = dict(gy=gy, layout=LAYOUTS[layout], lengths=lengths)
        with tile_size(block_t=4, block_c=4, window=2, strip=strip):
            y = getattr(normlib.functional, name)(dev(x), dev(w), dev(b), eps_for(name), backend="triton",
                                                  layout=LAYOUTS[layout], lengths=dev(lengths))
            got = gradients(name, x, w, b, eps_for(name), **kw)
        assert_rel(y, ref(name, x, w, b, eps_for(name), layout=LAYOUTS[layout], lengths=lengths), TOL[F32],
                   f"y C={C} strip={strip}")
        check_gradients(got, gradients(name, x, w, b, eps_for(name), oracle=True, **kw), F32, f"C={C} strip={strip}")


@pytest.mark.parametrize("name", ["cln", "emaln"])
def test_segmented_forward_then_look_back_backward(name, monkeypatch):
    """Pooled "b t c" forwards walk segments by default on few long sequences, and their backward runs the
    look-back (bwd_strip): the backward reads only the tiles' prefixes that the forward saved, whichever
    way it walked. Lengths, an incoming state and a loss on the returned state, against float64."""
    x, w, b, kw = _walk_case(name, "btc")
    launched = _spy_launches(monkeypatch)
    with tile_size(block_t=4, window=2, strip=2, span=2, bwd_strip=0):
        got = gradients(name, x, w, b, eps_for(name), **kw)
    assert sorted(set(launched)) == [("bwd", 0, False, False, False), ("fwd", 1, True, True, False),
                                     ("fwd", 2, True, True, False)]
    check_gradients(got, gradients(name, x, w, b, eps_for(name), oracle=True, **kw), F32)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", ["ccln", "ccemaln"])
def test_per_channel_one_warp_tiles_take_suffix_sums_by_flips(name, dtype, monkeypatch):
    """Per-channel backwards on one-warp tiles (the "b t c" default) take their suffix sums as flip, forward
    scan, flip (FLIP: a lane holds its channels' frames, where a reverse scan would exchange values across
    lanes); multi-warp tiles (the "b c t" default) scan in reverse. Default tiles ("b t c": [8, 8] on one
    warp; 16-bit tiles of 128 channels or more take 4 frames, so also forced to 4), "b c t" in 4 frames,
    and those forced onto one warp, in segments of 2 tiles, against float64."""
    launched = _spy_launches(monkeypatch)
    for layout, force, flip in (("btc", {}, True), ("btc", dict(block_t=4, warps=1), True),
                                ("bct", dict(block_t=4), False), ("bct", dict(block_t=4, warps=1), True)):
        x, w, b, kw = _walk_case(name, layout, dtype)
        launched.clear()
        with tile_size(span=2, **force):
            got = gradients(name, x, w, b, eps_for(name), **kw)
        assert {f for which, *_, f in launched if which == "bwd"} == {flip}, (layout, force)
        check_gradients(got, gradients(name, x, w, b, eps_for(name), oracle=True, **kw), dtype)


@pytest.mark.parametrize("name, layout", [pytest.param(n, lay, id=f"{n}-{lay}") for n, lay in [
    ("cln", "bct"), ("cln", "btc"), ("emaln", "btc"), ("frameln", "bct"), ("frameln", "btc"), ("gln", "bct")]])
def test_pooled_tiles_hold_or_read_again_their_first_chunk(name, layout, monkeypatch, deterministic):
    """A pooled look-back tile either holds its first chunk of channels through the look-back or reads it
    again to write it (the launcher picks per shape, forward and backward apart; FRAME's tiles, with no
    look-back, read it again by default; GLOBAL's forward tiles hold it, its backward's read it again; either
    may be forced). Both give the float64 reference's y and gradients, and the same bits as each other: only
    where x comes from differs. C=11 in chunks of 4, 4 tiles of 4 frames, lengths, an incoming state, a loss
    on the returned state."""
    B, C, T = 3, 11, 15
    layout = LAYOUTS[layout]
    x = make_x(B, C, T, layout, F32, offset=0.3)
    w, b = make_affine(C, F32)
    lengths = torch.tensor([T, 9, 1])
    causal = SPECS[name].causal  # GLOBAL (gln) has no state
    state = make_state(name, B, C, SD, empty_rows=(1,)) if causal else None
    gy, gs = cotangents(name, x, B, C, causal)
    kw = dict(state=state, gy=gy, gs=gs, layout=layout, lengths=lengths)
    want = gradients(name, x, w, b, eps_for(name), oracle=True, **kw)
    fn = getattr(normlib.functional, name)
    launched = _spy_launches(monkeypatch, ("HOLD",))  # the choice must reach the kernels
    got = {}
    for hold in (True, False):
        launched.clear()
        with tile_size(block_t=4, window=2, block_c=4, hold=hold, bwd_hold=not hold):
            out = fn(dev(x), dev(w), dev(b), eps_for(name), backend="triton", layout=layout, lengths=dev(lengths),
                     state=None if state is None else state.to(DEVICE), return_state=causal)
            y = out[0] if causal else out
            got[hold] = dict(gradients(name, x, w, b, eps_for(name), **kw), y=y)
        assert {(which, h) for which, *_, h in launched} == {("fwd", hold), ("bwd", not hold)}, launched
        check_gradients({k: v for k, v in got[hold].items() if k != "y"}, want, F32, f"hold={hold}")
    y_ref = ref(name, x, w, b, eps_for(name), layout=layout, lengths=lengths, state=state, return_state=causal)
    assert_rel(got[True]["y"], y_ref[0] if causal else y_ref, TOL[F32], "y")
    for k, v in got[True].items():
        assert torch.equal(v, got[False][k]), f"{k}: holding the first chunk and reading it again differ"


@pytest.mark.parametrize("name, walk", [("frameln", 1), ("gln", 1), ("gln", 2), ("cln", 2)])
def test_a_forced_backward_walk_is_one_the_mode_has(name, walk):
    """``bwd_strip`` is bounded by the mode as ``strip`` is: FRAME never walks (a walk of FRAME's tiles read
    tile 0's data for every tile), GLOBAL walks whole sequences; the gradients are the reference's."""
    B, C, T = 2, 5, 15
    x = make_x(B, C, T, LAYOUTS["bct"], F32)
    w, b = make_affine(C, F32)
    gy, _gs = cotangents(name, x, B, C, False)
    with tile_size(block_t=4, window=2, bwd_strip=walk):
        got = gradients(name, x, w, b, eps_for(name), gy=gy)
        tiles = launch.tiles_for(dev(x), SPECS[name].per_channel, SPECS[name].resolve_decay(None))
    assert tiles[12] == {"frameln": 0, "gln": 1}.get(name, walk)
    check_gradients(got, gradients(name, x, w, b, eps_for(name), gy=gy, oracle=True), F32)


@pytest.mark.parametrize("eps_mode", ["outside", "inside"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("name, C", [("ccln", 4), ("ccemaln", 4), ("instln", 4), ("cln", 1), ("frameln", 1),
                                     ("gln", 1)])
def test_a_statistic_of_one_value_keeps_float32_gradients(name, C, backend, eps_mode):
    """A value that is its statistic's only one (frame 0 per channel, or over one channel; a row of length 1
    in GLOBAL) normalizes to exactly 0. Its rstd (1/sqrt(eps)) once scaled backward terms that cancelled in
    float32: ccln's dx with eps outside was 20 % off float64. Float32 gradients against float64 autograd of
    the reference, several tiles, lengths (a row of length 1)."""
    B, T = 2, 20
    x = make_x(B, C, T, LAYOUTS["bct"], F32, offset=0.0)
    gy, _gs = cotangents(name, x, B, C, False)
    kw = dict(gy=gy, lengths=torch.tensor([T, 1]), eps_mode=eps_mode, requires=("x",))
    want = gradients(name, x, None, None, 1e-8, oracle=True, **kw)
    if backend == "triton":
        with tile_size(block_t=4, window=2, block_c=4):
            got = gradients(name, x, None, None, 1e-8, **kw)
    else:
        xt = x.clone().requires_grad_()
        y = getattr(normlib.functional, name)(xt, None, None, 1e-8, backend="torch", eps_mode=eps_mode,
                                              lengths=kw["lengths"])
        got = dict(x=torch.autograd.grad(y, xt, gy)[0])
    assert_rel(got["x"], want["x"], TOL[F32], f"{name} {backend} dx")


@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("name", ["ccln", "ccemaln"])
def test_frame_0_of_a_per_channel_norm_keeps_its_gradient_at_any_scale(name, layout):
    """Per channel, frame 0 holds all its weight (W = 1), so its own term of U, -g r, cancels g r exactly: the
    kernel leaves both out there. Added apart they cancelled only to g r's rounding, and at values of 1e16 (eps
    0: the norm is scale-free) frame 0's dx, 1e-32 of g r, was noise (scale x dx 0.11 from the reference's).
    Several tiles; against the reference of x / scale."""
    B, C, T, scale = 2, 4, 20, 1e16
    x = make_x(B, C, T, "b c t", torch.float64, offset=0.0)
    gy = torch.randn(B, C, T, dtype=torch.float64)
    perm = (lambda t: t) if layout == "bct" else (lambda t: t.transpose(1, 2).contiguous())
    xs = dev(perm((x * scale).float())).requires_grad_()
    with tile_size(block_t=4, window=2, block_c=4):
        y = getattr(normlib.functional, name)(xs, None, None, 0.0, backend="triton", layout=LAYOUTS[layout])
        gx, = torch.autograd.grad(y, xs, dev(perm(gy.float())))
    gx = gx.cpu().double() if layout == "bct" else gx.cpu().double().transpose(1, 2)
    xr = ((x * scale).float().double() / scale).requires_grad_()
    gr, = torch.autograd.grad(normlib.reference.REFERENCES[name](xr, eps=0.0), xr, gy)
    assert_rel(gx * scale, gr, TOL[F32], f"{name} dx x scale")


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("name, C", [("ccln", 4), ("ccemaln", 4), ("cln", 1), ("emaln", 1), ("cln", 5)])
def test_an_empty_incoming_state_is_no_state(name, C, backend):
    """A stream started from NormState.empty (or after a row with lengths 0) gives what no state gives: y
    (0 at a statistic of one value, not NaN, with eps = 0) and dx within float32 of float64 (with r =
    1/sqrt(eps) the 1e8 terms cancelled: 100 % off with eps outside). The state's weight, a count, gets no
    gradient on either backend, nor in the reference; its mean and M2 do."""
    B, T = 2, 20
    x = make_x(B, C, T, LAYOUTS["bct"], F32, offset=1.0)
    gy, gs = cotangents(name, x, B, C, True)
    empty = normlib.NormState.empty(state_shape(name, B, C), SD)
    kw = dict(gy=gy, gs=gs, eps_mode="outside", requires=("x", "state"))
    want = gradients(name, x, None, None, 1e-8, oracle=True, state=empty, **kw)
    if backend == "triton":
        with tile_size(block_t=4, window=2, block_c=4):
            got = gradients(name, x, None, None, 1e-8, state=empty, **kw)
            y0 = tri_or_torch(name, dev(x), 0.0, empty.to(DEVICE), backend)
    else:
        got = _torch_gradients(name, x, empty, gy, gs)
        y0 = tri_or_torch(name, x, 0.0, empty, backend)
    assert torch.isfinite(y0).all(), y0
    assert_rel(y0.cpu(), tri_or_torch(name, x, 0.0, None, "torch"), TOL[F32], f"{name} eps=0 y")
    assert not got["state.w"].any() and not want["state.w"].any()
    check_gradients(got, want, F32, f"{name} {backend}", DEVICE if backend == "triton" else torch.device("cpu"))


def tri_or_torch(name, x, eps, state, backend):
    return getattr(normlib.functional, name)(x, None, None, eps, backend=backend, state=state)


def _torch_gradients(name, x, state, gy, gs):
    """gradients() through the PyTorch backend, on the CPU."""
    xt = x.clone().requires_grad_()
    st = normlib.NormState(*(t.clone().requires_grad_() for t in state))
    y, s = getattr(normlib.functional, name)(xt, None, None, 1e-8, backend="torch", state=st, eps_mode="outside",
                                             return_state=True)
    loss = (y * gy).sum() + sum((f * g).sum() for f, g in zip(s, gs))
    got = torch.autograd.grad(loss, [xt, *st], allow_unused=True)
    names = ["x"] + [f"state.{f}" for f in ("w", "m", "m2")]
    ins = [xt, *st]
    return {k: torch.zeros_like(v) if g is None else g for k, v, g in zip(names, ins, got)}


def test_eps_0_with_padding_keeps_weight_gradients_finite():
    """eps = 0 at padding frames (a row of length 0 has no variance at all): the PyTorch backend once made
    weight.grad NaN there (0 / 0, masked in the forward, 0 * NaN in the backward)."""
    x = make_x(2, 4, 6, LAYOUTS["bct"], F32)
    for backend in ("torch", "triton"):
        for name in ("cln", "emaln", "frameln", "gln", "instln"):
            w = torch.ones(4, requires_grad=True)
            xx = dev(x) if backend == "triton" else x
            y = getattr(normlib.functional, name)(xx, dev(w) if backend == "triton" else w, None, 0.0,
                                                  backend=backend, lengths=[6, 0])
            (gw,) = torch.autograd.grad(y.sum(), w)
            assert torch.isfinite(gw).all(), (name, backend, gw)


def test_forced_register_caps_reach_their_launches(monkeypatch, deterministic):
    """``tile_size(maxnreg=..., bwd_maxnreg=...)`` (for timing more programs per SM) reaches the forward's and
    the backward's launches apart, and by default neither is passed; the result is the same bits."""
    B, C, T = 2, 11, 15
    x = make_x(B, C, T, LAYOUTS["bct"], F32)
    w, b = make_affine(C, F32)
    gy, _gs = cotangents("cln", x, B, C, False)
    launched = _spy_launches(monkeypatch, ("maxnreg",))
    got = []
    for caps in ({}, dict(maxnreg=96, bwd_maxnreg=128)):
        launched.clear()
        with tile_size(block_t=4, window=2, block_c=4, **caps):
            got.append(gradients("cln", x, w, b, eps_for("cln"), gy=gy))
        want = {("fwd", caps.get("maxnreg", False)), ("bwd", caps.get("bwd_maxnreg", False))}
        assert {(which, m) for which, *_, m in launched} == want, launched
    for k, v in got[0].items():
        assert torch.equal(v, got[1][k]), k


def _forced_depths_give_the_same_bits(monkeypatch, name, layout, C, T, arg, depths, **tiles):
    """Gradients under each (forward, backward) pair of ``depths``, forced as ``tile_size(arg=, bwd_arg=)``: each
    launch gets its pass's depth as the kernel's constexpr, and the results agree with the reference. Run in
    deterministic mode (a fixed look-back grouping), so that on a GPU every depth must give the same bits; the
    interpreter ignores the depth."""
    B = 2
    layout = LAYOUTS[layout]
    x = make_x(B, C, T, layout, F32)
    w, b = make_affine(C, F32)
    gy, _gs = cotangents(name, x, B, C, False)
    launched = _spy_launches(monkeypatch, (arg.upper(),))
    got = []
    for fwd, bwd in depths:
        launched.clear()
        with tile_size(**tiles, **{arg: fwd, f"bwd_{arg}": bwd}):
            got.append(gradients(name, x, w, b, eps_for(name), gy=gy, layout=layout))
        assert {(which, s) for which, *_, s in launched} == {("fwd", fwd), ("bwd", bwd)}
    for k, v in got[0].items():
        assert torch.equal(v, got[1][k]), k
    check_gradients(got[1], gradients(name, x, w, b, eps_for(name), gy=gy, layout=layout, oracle=True), F32)


@pytest.mark.parametrize("name, layout", [("cln", "btc"), ("emaln", "bct"), ("gln", "btc"), ("frameln", "btc")])
def test_pipelined_chunk_loops_give_the_same_bits(monkeypatch, deterministic, name, layout):
    """A pooled tile's loops over its chunks of channels (5 here), pipelined or not."""
    _forced_depths_give_the_same_bits(monkeypatch, name, layout, 19, 15, "stages", ((1, 1), (2, 3)), block_t=4,
                                      window=2, block_c=4)


@pytest.mark.parametrize("layout, want", [("btc", 2), ("bct", 1)])
def test_launches_pipeline_as_stages_for_says(monkeypatch, layout, want):
    """By default the launcher passes stages_for's depth: a pooled "b t c" look-back tile of 5 chunks pipelines
    its loops, forward and backward; in "b c t" it does not."""
    B, C, T = 2, 19, 15
    x = make_x(B, C, T, LAYOUTS[layout], F32)
    gy, _gs = cotangents("cln", x, B, C, False)
    launched = _spy_launches(monkeypatch, ("STAGES", "STRIP"))
    with tile_size(block_t=4, window=2, block_c=4):
        gradients("cln", x, None, None, eps_for("cln"), gy=gy, layout=LAYOUTS[layout])
    assert {(which, s, strip) for which, *_, s, strip in launched} == {("fwd", want, False), ("bwd", want, False)}


@pytest.mark.parametrize("name, layout, strip", [("ccln", "btc", 2), ("ccemaln", "bct", 1), ("cln", "btc", 1),
                                                 ("cln", "bct", 2)])
def test_pipelined_walks_give_the_same_bits(monkeypatch, deterministic, name, layout, strip):
    """A walk's loop over its tiles (strips; SEG, whose sums' launch gets the depth too), pipelined or not."""
    _forced_depths_give_the_same_bits(monkeypatch, name, layout, 6, 37, "walk_stages", ((1, 1), (3, 2)), block_t=4,
                                      block_c=4, strip=strip, span=3)


@pytest.mark.parametrize("deterministic", [False, True])
def test_launch_choices_keep_their_places(deterministic):
    """Each choice in its place of tiles_for's list: the look-back's test switch (AGG_ONLY, index 5) is on only
    when forced outside deterministic mode (on there, a deterministic look-back waited forever), whatever the
    pipeline depths at 17 to 20."""
    x = make_x(2, 19, 15, LAYOUTS["btc"], F32)
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with tile_size(block_t=4, block_c=4, walk_stages=3, bwd_walk_stages=2, stages=2, bwd_stages=3):
            tiles = launch.tiles_for(x, False, 1.0)
        with tile_size(block_t=4, block_c=4, walk=True):
            walked = launch.tiles_for(x, False, 1.0)
    finally:
        torch.use_deterministic_algorithms(old)
    assert (tiles[5], tiles[6], tiles[17:]) == (0, int(deterministic), [2, 3, 3, 2])
    assert walked[5] == int(not deterministic)


@pytest.mark.parametrize("per_channel, last, mode, strip, backward, want", [
    (True, True, launch.CUMULATIVE, 2, False, 3), (True, True, launch.CUMULATIVE, 2, True, 3),
    (True, True, launch.EMA, 1, True, 3), (True, False, launch.EMA, 2, False, 3),
    (True, False, launch.EMA, 2, True, 1), (True, False, launch.CUMULATIVE, 2, False, 1),
    (True, True, launch.CUMULATIVE, 0, False, 1), (True, True, launch.GLOBAL, 1, False, 1),
    (False, True, launch.CUMULATIVE, 2, False, 1), (False, True, launch.CUMULATIVE, 1, True, 1),
])
def test_which_walks_pipeline(per_channel, last, mode, strip, backward, want):
    """walk_stages_for: only the walks the H200 timed faster (see its docstring) pipeline."""
    assert launch.walk_stages_for(per_channel, last, mode, strip, backward) == want


@pytest.mark.parametrize("C, per_channel, last, mode, strip, hold, es, want", [
    (512, False, True, launch.CUMULATIVE, 0, True, 4, 2),  # fp32 "b t c" look-back tiles of 4 chunks
    (512, False, True, launch.EMA, 0, True, 4, 2),
    (512, False, True, launch.CUMULATIVE, 0, False, 2, 2),  # 16 bits, lean
    (512, False, True, launch.CUMULATIVE, 0, True, 2, 1),  # 16 bits, held
    (384, False, True, launch.CUMULATIVE, 0, True, 4, 1),  # 3 chunks
    (512, False, False, launch.CUMULATIVE, 0, True, 4, 1),  # "b c t"
    (512, False, True, launch.CUMULATIVE, 2, True, 4, 1),  # SEG walks
    (512, False, True, launch.CUMULATIVE, 1, True, 4, 1),  # strips
    (512, False, True, launch.GLOBAL, 0, True, 4, 1),
    (512, False, True, launch.FRAME, 0, True, 4, 1),
    (512, True, True, launch.CUMULATIVE, 0, True, 4, 1),  # per channel: one chunk a tile
])
def test_which_tiles_pipeline_their_chunk_loops(C, per_channel, last, mode, strip, hold, es, want):
    """stages_for: only the rows the H200 timed faster (see its docstring) pipeline."""
    assert launch.stages_for(C, 128, 32, per_channel, last, mode, strip, hold, es) == want
    assert launch.stages_for(C, 128, 32, per_channel, last, mode, strip, hold, es, True) == want


@pytest.mark.parametrize("block_t, es, backward, smem, want", [
    (128, 4, True, launch.H200_SMEM, 2), (128, 4, True, 99 << 10, 1),  # x and dy: 128 KB, over an RTX 4090's 99
    (128, 4, False, 99 << 10, 2), (128, 4, False, 48 << 10, 1), (32, 4, True, 48 << 10, 2)])
def test_pipelined_loops_fit_the_devices_shared_memory(block_t, es, backward, smem, want):
    """A pipelined loop buffers a chunk of x (and of dy) a stage in shared memory: only where the device has it
    (a launch over it fails with Triton's out-of-resources error)."""
    assert launch.stages_for(512, 128, block_t, False, True, launch.CUMULATIVE, 0, True, es, backward, smem) == want


@pytest.mark.parametrize("backward, smem, want", [(False, 48 << 10, 3), (True, 48 << 10, 3), (False, 12 << 10, 1),
                                                  (True, 20 << 10, 1)])
def test_pipelined_walks_fit_the_devices_shared_memory(backward, smem, want):
    """A walk 3 deep buffers two [128, 8] fp32 tiles of x (and of dy): 8 KB (16 KB), and up to 8 KB of scratch."""
    assert launch.walk_stages_for(True, True, launch.CUMULATIVE, 2, backward, 128, 8, 4, smem) == want


@pytest.mark.parametrize("name, C, forced, lone", [("cln", 11, None, False), ("cln", 1, None, True),
                                                   ("ccln", 11, None, True), ("frameln", 11, 1, True),
                                                   ("ccemaln", 11, 0, True)])
def test_the_one_value_check_is_compiled_where_a_statistic_can_hold_one(monkeypatch, name, C, forced, lone):
    """LONE (the check for a statistic of one value) is on for per-channel norms and C = 1, off for pooled
    tiles of more channels (it cost a pooled bf16 "b t c" forward 20 registers); ``tile_size(lone=1)`` turns it
    on for timing, and nothing turns it off where it is needed. Forward and backward agree, and so do the
    gradients, whichever it is."""
    B, T = 2, 15
    x = make_x(B, C, T, LAYOUTS["bct"], F32)
    gy, _gs = cotangents(name, x, B, C, False)
    launched = _spy_launches(monkeypatch, ("LONE",))
    with tile_size(block_t=4, window=2, block_c=4, **({} if forced is None else dict(lone=forced))):
        got = gradients(name, x, None, None, eps_for(name), gy=gy)
    assert {(which, m) for which, *_, m in launched} == {("fwd", lone), ("bwd", lone)}, launched
    want = gradients(name, x, None, None, eps_for(name), gy=gy, oracle=True)
    check_gradients(got, want, F32)

# ---------------------------------------------------------------------------------------------------
# Padding frames get exactly zero gradient, whatever dL/dy holds there
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, layout", [pytest.param(n, lay, id=f"{n}-{lay}") for n, lay in [
    ("cln", "bct"), ("gln", "btc"), ("frameln", "btc"), ("ccemaln", "btc")]])
def test_padding_frames_get_zero_gradient(name, layout):
    """y is 0 at padding frames whatever x holds, so dL/dx is exactly 0 there, even where dL/dy is NaN
    or inf (the kernel must not read dL/dy at padding); the valid frames match the oracle. Random lengths
    (one full, one short, one on a tile edge), the returned state in the loss."""
    B, C, T = 3, 5, 11
    layout = LAYOUTS[layout]
    eps = eps_for(name)
    g = torch.Generator().manual_seed(3)
    x = make_x(B, C, T, layout, F32, offset=-0.4)
    w, b = make_affine(C, F32)
    lengths = make_lengths(B, T, generator=g)
    lengths[2] = 4  # a tile edge
    pad = padding_mask(lengths, layout, B, C, T)
    gy, gs = cotangents(name, x, B, C, SPECS[name].causal)
    gy[pad] = torch.tensor([math.nan, math.inf, -math.inf]).repeat(pad.sum().item())[: pad.sum()]
    kw = dict(gy=gy, gs=gs, layout=layout, lengths=lengths)

    with tile_size(block_t=4, window=2, block_c=8):
        got = gradients(name, x, w, b, eps, **kw)
    want = gradients(name, x, w, b, eps, oracle=True, **kw)

    assert (got["x"].cpu()[pad] == 0).all(), "padding frames must get exactly zero gradient"
    assert_rel(got["x"].cpu()[~pad], want["x"][~pad], GRAD_TOL[F32], "grad x at valid frames")
    check_gradients({k: v for k, v in got.items() if k != "x"}, {k: v for k, v in want.items() if k != "x"}, F32)


# ---------------------------------------------------------------------------------------------------
# Chunked training: threading the state without detaching gives the whole sequence's gradients
# ---------------------------------------------------------------------------------------------------
def chunked_gradients(name, x, w, b, state, sizes, gy, gs, layout, lengths=None, oracle=False):
    """Run x in chunks of ``sizes`` frames, each chunk's incoming state the previous chunk's outgoing one
    (not detached), L = sum over chunks of sum(y_chunk * gy_chunk) + the final state's fields * gs.

    Returns ({x (the chunks' gradients concatenated), weight, bias, state.*: gradient}, [per boundary:
    the gradients of L with respect to that boundary's state fields])."""
    to = (lambda t: t.detach().to(torch.float64).clone()) if oracle else (lambda t: dev(t).detach().clone())
    xs = [to(c).requires_grad_() for c in x.split(sizes, dim=tdim(layout))]
    wb = [to(t).requires_grad_() for t in (w, b)]
    st = normlib.NormState(*(to(t).requires_grad_() for t in state))
    loss, s, boundaries, t0 = 0, st, [], 0
    for xc, gyc in zip(xs, gy.split(sizes, dim=tdim(layout))):
        n = xc.shape[tdim(layout)]
        lc = None if lengths is None else (lengths - t0).clamp(0, n)
        lc = lc if oracle else dev(lc)
        if oracle:
            y, s = ref(name, xc, *wb, layout=layout, lengths=lc, state=s, return_state=True)
        else:
            y, s = getattr(normlib.functional, name)(xc, *wb, layout=layout, lengths=lc, state=s,
                                                      return_state=True, backend="triton")
        loss = loss + (y * (gyc.double() if oracle else dev(gyc))).sum()
        boundaries.append(s)
        t0 += n
    loss = loss + sum((f * (g if oracle else dev(g))).sum() for f, g in zip(s, gs))
    inner = [f for s_ in boundaries[:-1] for f in s_]
    wrt = xs + wb + list(st) + inner
    live = [t for t in wrt if t.requires_grad]  # a state's weight, a count, is off the graph (the reference's)
    found = iter(torch.autograd.grad(loss, live, allow_unused=True))
    got = [next(found) if t.requires_grad else None for t in wrt]
    got = [torch.zeros_like(t) if g is None else g for t, g in zip(wrt, got)]
    n = len(xs)
    grads = dict(x=torch.cat(got[:n], dim=tdim(layout)), weight=got[n], bias=got[n + 1],
                 **dict(zip(STATE_FIELDS, got[n + 2: n + 5])))
    return grads, [got[n + 5 + 3 * i: n + 8 + 3 * i] for i in range(len(boundaries) - 1)]


def _chunk_cases():
    cases = [("cln", "bct", [5, 0, 7, 4], True), ("ccln", "btc", [8, 1, 7], False),
             ("emaln", "btc", [3, 9, 0, 4], False), ("frameln", "bct", [6, 1, 9], True),
             ("ccemaln", "bct", [1, 6, 0, 9], True)]
    return [pytest.param(name, layout, sizes, with_len, id=f"{name}-{layout}-chunks-{'-'.join(map(str, sizes))}"
                         + ("-len" if with_len else "")) for name, layout, sizes, with_len in cases]


@pytest.mark.parametrize("name, layout, sizes, with_lengths", _chunk_cases())
def test_chunked_training_equals_whole_sequence(name, layout, sizes, with_lengths):
    """T=16 in chunks (chunks of 0 and 1 frames, chunk edges inside tiles of 4, chunks of several tiles),
    lengths 16 and 11 (inside a chunk) or none, an incoming state requiring grad: the gradients of x,
    weight, bias and the incoming state equal those of one call on the whole sequence and those of the
    float64 reference, and the gradient into each chunk boundary's state equals the reference's."""
    B, C, T = 2, 5, 16
    layout = LAYOUTS[layout]
    x = make_x(B, C, T, layout, F32, offset=0.2)
    w, b = make_affine(C, F32)
    state = make_state(name, B, C, SD)
    lengths = torch.tensor([T, 11]) if with_lengths else None  # 11: inside the third chunk
    gy, gs = cotangents(name, x, B, C, True)

    with tile_size(block_t=4, window=2, block_c=8):
        chunked, bounds = chunked_gradients(name, x, w, b, state, sizes, gy, gs, layout, lengths)
        whole = gradients(name, x, w, b, state=state, gy=gy, gs=gs, layout=layout, lengths=lengths)
    want, want_bounds = chunked_gradients(name, x, w, b, state, sizes, gy, gs, layout, lengths, oracle=True)
    want_whole = gradients(name, x, w, b, state=state, gy=gy, gs=gs, layout=layout, lengths=lengths,
                           oracle=True)

    for k in want_whole:  # the oracle agrees with itself (a sanity check of the test)
        assert_rel(want[k], want_whole[k], 1e-10, f"oracle chunked vs whole {k}")
    check_gradients(chunked, want, F32, "chunked")
    for k in whole:
        tol = STATE_GRAD_TOL[F32] if k.startswith("state.") else GRAD_TOL[F32]
        assert_rel(chunked[k], whole[k], tol, f"chunked vs whole grad {k}")
    for i, (got_b, want_b) in enumerate(zip(bounds, want_bounds)):
        for field, g, e in zip(STATE_FIELDS, got_b, want_b):
            assert not torch.isnan(g).any()
            assert_rel(g, e, STATE_GRAD_TOL[F32], f"boundary {i} grad {field}")


@pytest.mark.parametrize("name", ["emaln", "ccln"])
def test_state_gradient_across_a_chunk_boundary(name):
    """The second chunk alone, its incoming state the first chunk's outgoing state taken as a leaf: the
    gradients into that state (through y and the returned state) equal the float64 reference's; the
    boundary falls inside a tile of the whole sequence and the chunk spans several tiles (walking)."""
    B, C, T = 2, 5, 18
    x = make_x(B, C, T, "b c t", F32, offset=-0.3)
    first, second = x[..., :5], x[..., 5:]
    _, s = ref(name, first, state=make_state(name, B, C, SD), return_state=True)
    s = normlib.NormState(*(t.detach() for t in s))
    w, b = make_affine(C, F32)
    lengths = torch.tensor([13, 6])
    gy, gs = cotangents(name, second, B, C, True)
    kw = dict(state=s, gy=gy, gs=gs, lengths=lengths)
    with tile_size(block_t=4, window=2, block_c=8, walk=True):
        got = gradients(name, second, w, b, **kw)
    check_gradients(got, gradients(name, second, w, b, oracle=True, **kw), F32)


# ---------------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------------
class _Spy:
    """Wraps a kernel in launch.py and records the keyword arguments of each launch."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def call(*a, **k):
            self.calls.append(k)
            return self.kernel[grid](*a, **k)
        return call


def test_rows_load_as_vectors_where_lengths_and_strides_allow():
    """VEC_T (VEC_C): the largest of 8, 4, 2 dividing the rows' dim and every other stride of each tensor, and
    only where Triton cannot see a multiple of 16 itself. Both kernels get it, and with it lengths such as 22
    and 24, a sliced input and "b t c" rows of 12 channels give the reference's output and gradients, in
    look-back tiles and in strip walks."""
    vf = lambda shape, strides: {k: v for k, v in launch.vec_for(shape, tuple(strides)).items()  # noqa: E731
                                 if k != "WIDE"}
    assert vf((64, 128, 500), [(64000, 500, 1)] * 2) == {"VEC_T": 4}
    assert vf((2, 3, 22), [(66, 22, 1)]) == {"VEC_T": 2}
    assert vf((2, 3, 24), [(72, 24, 1)]) == {"VEC_T": 8}
    assert vf((64, 128, 512), [(65536, 512, 1)]) == vf((80, 64, 301), [(19264, 301, 1)]) == {}
    assert vf((2, 12, 30), [(360, 1, 12)]) == {"VEC_C": 4}
    assert vf((2, 128, 500), [(64000, 500, 1), (64000, 1, 128)]) == {}  # rows along different dims
    assert vf((2, 3, 20), [(90, 30, 1), (60, 20, 1)]) == {"VEC_T": 2}  # x: frames 0..19 of 30
    cases = [("b c t", (2, 3, 22), slice(None), {"VEC_T": 2}), ("b c t", (2, 3, 24), slice(None), {"VEC_T": 8}),
             ("b c t", (2, 3, 30), slice(0, 20), {"VEC_T": 2}), ("b t c", (2, 12, 30), slice(None), {"VEC_C": 4})]
    for name, (layout, shape, frames, vec), strip in itertools.product(("cln", "ccln", "frameln", "gln"), cases,
                                                                      (0, 1)):
        base, gy = make_x(*shape, layout), make_x(*shape, layout)
        view = (lambda t: t[..., frames]) if layout == "b c t" else (lambda t: t[:, frames])  # noqa: E731
        w, b = make_affine(shape[1], F32)
        spies = {k: _Spy(getattr(launch, k)) for k in ("running_norm_fwd", "running_norm_bwd")}
        grads = {}
        for oracle in (False, True):
            to = (lambda t: t.double()) if oracle else dev  # noqa: E731
            xg, wg, bg = (to(t).detach().requires_grad_() for t in (base, w, b))
            with pytest.MonkeyPatch.context() as mp, tile_size(block_t=8, strip=strip):
                for k, spy in spies.items():
                    mp.setattr(launch, k, spy)
                if oracle:
                    y = ref(name, view(xg), wg, bg, eps_for(name), layout=layout)
                else:
                    y = getattr(normlib.functional, name)(view(xg), wg, bg, eps_for(name), backend="triton",
                                                          layout=layout)
                grads[oracle] = (y,) + torch.autograd.grad((y * to(view(gy))).sum(), [xg, wg, bg])
        what = f"{name} {layout} {shape} {frames} strip={strip}"
        assert all(spy.calls for spy in spies.values()), what
        assert all({k: c.get(k, 1) for k in vec} == vec for spy in spies.values() for c in spy.calls), what
        for got, want, tol in zip(grads[False], grads[True], (TOL[F32],) + (GRAD_TOL[F32],) * 3):
            assert_rel(got, want, tol, what)


def test_offsets_widen_to_int64_only_where_a_sequence_reaches_past_int32(monkeypatch):
    """WIDE: a sequence whose offsets (its masked tile lanes' too) reach 2^31 elements takes int64 offsets, the
    kernels' default; others int32. Both give the reference's output and gradients; the narrow launch is asked
    for wherever it fits, and the wide one where the launcher's reach is made to exceed int32."""
    vf = launch.vec_for
    assert vf((4, 512, 3999), ((512 * 3999, 3999, 1),)) == {"WIDE": False}
    assert vf((4, 512, 4000), ((512 * 4000, 1, 512),) * 2) == {"WIDE": False}
    assert "WIDE" not in vf((1, 2**20, 2048), ((2**31, 2048, 1),))  # one sequence of 2^31 elements
    assert "WIDE" not in vf((1, 3, 10), ((2**32, 2**30, 1),))  # a view of three channels 2^30 apart
    assert vf((1, 3, 16), ((2**32, 2**30 // 8192, 1),)) == {"WIDE": False}
    x, gy = make_x(2, 6, 37), make_x(2, 6, 37)
    w, b = make_affine(6, F32)
    for name, wide in itertools.product(("cln", "ccln", "gln"), (False, True)):
        spies = {k: _Spy(getattr(launch, k)) for k in ("running_norm_fwd", "running_norm_bwd")}
        grads = {}
        with pytest.MonkeyPatch.context() as mp, tile_size(block_t=8):
            for k, spy in spies.items():
                mp.setattr(launch, k, spy)
            if wide:
                mp.setattr(launch, "MAX_TILE_C", 2**31)
            launch._vec_for_cached.cache_clear()
            for oracle in (False, True):
                to = (lambda t: t.double()) if oracle else dev  # noqa: E731
                xg, wg, bg = (to(t).detach().requires_grad_() for t in (x, w, b))
                y = (ref(name, xg, wg, bg, eps_for(name)) if oracle
                     else getattr(normlib.functional, name)(xg, wg, bg, eps_for(name), backend="triton"))
                grads[oracle] = (y,) + torch.autograd.grad((y * to(gy)).sum(), [xg, wg, bg])
        launch._vec_for_cached.cache_clear()
        assert all(spy.calls for spy in spies.values())
        assert all(c.get("WIDE", True) == wide for spy in spies.values() for c in spy.calls), (name, wide)
        for got, want, tol in zip(grads[False], grads[True], (TOL[F32],) + (GRAD_TOL[F32],) * 3):
            assert_rel(got, want, tol, f"{name} wide={wide}")


@pytest.mark.parametrize("name", ["cln", "ccemaln", "gln"])
def test_deterministic_mode_is_bitwise_repeatable(name, deterministic, monkeypatch):
    """Under torch.use_deterministic_algorithms(True): the backward launches in deterministic mode, and two
    runs give bit-identical dx, dweight, dbias (and state gradients), which match the oracle. (In the
    interpreter, which runs programs in order, two runs are bit-identical in any mode: there this checks the
    flag and the oracle; the grouping it fixes needs a GPU.)"""
    B, C, T = 1, 5, 17  # 5 tiles of 4: in deterministic mode tile 4 takes tile 2's prefix, not tile 3's
    x = make_x(B, C, T, offset=0.1)
    w, b = make_affine(C, F32)
    state = make_state(name, B, C, SD) if SPECS[name].causal else None
    gy, gs = cotangents(name, x, B, C, SPECS[name].causal)
    kw = dict(state=state, gy=gy, gs=gs)
    spy = _Spy(launch.running_norm_bwd)
    monkeypatch.setattr(launch, "running_norm_bwd", spy)
    with tile_size(block_t=4, window=2, block_c=8, span=2):
        first = gradients(name, x, w, b, eps_for(name), **kw)
        second = gradients(name, x, w, b, eps_for(name), **kw)
    assert spy.calls and all(k["DETERMINISTIC"] for k in spy.calls)
    for k in first:
        assert torch.equal(first[k], second[k]), f"grad {k} differs between two runs"
    check_gradients(first, gradients(name, x, w, b, eps_for(name), oracle=True, **kw), F32)
    assert torch.are_deterministic_algorithms_enabled()


def test_weight_partials_are_summed_in_a_fixed_order():
    """dweight and dbias come from (2, rows, C) per-tile partials: rows beyond one block of 512 and a last,
    partial block of channels are all summed; the same partials give the same bits."""
    gen = torch.Generator().manual_seed(3)
    R, C = 1100, 37
    parts = dev(torch.randn(2, R, C, generator=gen))
    (gw, gb), again = launch.weight_grads(parts), launch.weight_grads(parts)
    want = parts.double().sum(dim=1)
    assert_rel(gw, want[0], 1e-6, "dweight")
    assert_rel(gb, want[1], 1e-6, "dbias")
    assert torch.equal(gw, again[0]) and torch.equal(gb, again[1])


def test_deterministic_flag_is_restored():
    """The fixture above restores the flag (this test runs after it in file order)."""
    assert not torch.are_deterministic_algorithms_enabled()


# ---------------------------------------------------------------------------------------------------
# What requires grad: weight without bias, bias without weight, only x, only the parameters
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, affine", [
    pytest.param("cln", "w-only", id="cln-w-only"), pytest.param("ccemaln", "w-only", id="ccemaln-w-only"),
    pytest.param("gln", "b-only", id="gln-b-only"), pytest.param("emaln", "b-only", id="emaln-b-only"),
])
def test_one_affine_parameter(name, affine):
    """weight requires grad and bias is None (or the reverse): the given one's gradient is right."""
    B, C, T = 2, 5, 13
    x = make_x(B, C, T, "b t c", F32)
    w, b = make_affine(C, F32)
    w, b = (w, None) if affine == "w-only" else (None, b)
    gy, _ = cotangents(name, x, B, C, False)
    kw = dict(gy=gy, layout="b t c", lengths=torch.tensor([T, 9]))
    with tile_size(block_t=4, window=2, block_c=8):
        got = gradients(name, x, w, b, eps_for(name), **kw)
    assert set(got) == {"x", "weight" if w is not None else "bias"}
    check_gradients(got, gradients(name, x, w, b, eps_for(name), oracle=True, **kw), F32)


@pytest.mark.parametrize("name", ["cln", "frameln"])
def test_only_x_requires_grad(name, monkeypatch):
    """weight and bias given but not requiring grad: no parameter gradient is computed (the kernel stores
    no per-tile partials) and dx is right; the reverse (only the parameters) gives the right dweight, dbias."""
    B, C, T = 2, 5, 13
    x = make_x(B, C, T)
    w, b = make_affine(C, F32)
    gy, _ = cotangents(name, x, B, C, False)
    kw = dict(gy=gy, lengths=torch.tensor([T, 10]))
    spy = _Spy(launch.running_norm_bwd)
    monkeypatch.setattr(launch, "running_norm_bwd", spy)
    with tile_size(block_t=4, window=2):
        got = gradients(name, x, w, b, requires=("x",), **kw)
        assert spy.calls and not any(k["STORE_GW"] for k in spy.calls)
        spy.calls.clear()
        got_params = gradients(name, x, w, b, requires=("weight", "bias"), **kw)
        assert spy.calls and all(k["STORE_GW"] for k in spy.calls)
    assert set(got) == {"x"} and set(got_params) == {"weight", "bias"}
    check_gradients(got, gradients(name, x, w, b, requires=("x",), oracle=True, **kw), F32)
    check_gradients(got_params, gradients(name, x, w, b, requires=("weight", "bias"), oracle=True, **kw), F32)


@pytest.mark.parametrize("name", ["ccemaln"])
def test_only_the_state_requires_grad(name):
    """x and the parameters constant, the incoming state requiring grad (the first chunk of a truncated
    BPTT with frozen inputs): the state's gradients are right."""
    B, C, T = 2, 5, 13
    x = make_x(B, C, T)
    w, b = make_affine(C, F32)
    state = make_state(name, B, C, SD)
    gy, gs = cotangents(name, x, B, C, True)
    kw = dict(state=state, gy=gy, gs=gs, lengths=torch.tensor([9, 0]), requires=("state",))
    with tile_size(block_t=4, window=2, block_c=8):
        got = gradients(name, x, w, b, **kw)
    assert set(got) == set(STATE_FIELDS)
    check_gradients(got, gradients(name, x, w, b, oracle=True, **kw), F32)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", ["cln", "ccemaln"])
def test_with_only_the_affine_to_train_the_state_out_is_constant(name, backend):
    """The returned state depends on x and the incoming state only: a layer whose weights alone require grad
    returns a state with no graph on both backends (Triton's once held its whole call alive, chunk after chunk,
    and a state made to require grad from it got no gradient)."""
    to = dev if backend == "triton" else (lambda t: t)
    layer = normlib.create(name, 4, backend=backend).to(DEVICE if backend == "triton" else "cpu")
    x = to(make_x(2, 4, 9))
    for call in (layer, torch.compile(layer, fullgraph=True, backend="aot_eager")):  # the op's autograd too
        _, s = call(x, return_state=True)
        assert not any(t.requires_grad or t.grad_fn is not None for t in s)
    m = s.m.clone().requires_grad_()
    y, s2 = layer(x, state=normlib.NormState(s.w, m, s.m2), return_state=True)
    (gm,) = torch.autograd.grad(y.square().sum() + s2.m2.sum(), m)
    assert gm.abs().sum() > 0
    xg = x.clone().requires_grad_()  # with x to train, the state is on its graph
    (gx,) = torch.autograd.grad(layer(xg, return_state=True)[1].m.sum(), xg)
    assert gx.abs().sum() > 0


@pytest.mark.parametrize("strip", [False, True], ids=["lookback", "strip"])
@pytest.mark.parametrize("name", ["cln", "ccln", "emaln", "ccemaln"])
def test_a_heavy_incoming_state_gets_its_gradients(name, strip):
    """A long stream's state (w_in up to 1e6 frames' worth) keeps the running means near its own, and
    dL/dm_in is w_in times their small distance from it: with the means taken relative to frame 0's, their
    float32 rounding times w_in put ccln's 2 % off (and ccemaln's sign wrong). The kernels shift by the state's
    mean where it outweighs the sequence to its end. Rows: heavy; heavy and 300 away from the data; light and
    300 away (frame 0's shift)."""
    B, C, T = 3, 6, 21
    g = torch.Generator().manual_seed(11)
    x = make_x(B, C, T, generator=g)
    state = make_state(name, B, C, generator=g)
    scale = torch.tensor([1e3, 1e6, 2.0], dtype=SD).view(-1, *([1] * (state.w.dim() - 1)))
    far = torch.tensor([0.0, 300.0, 300.0], dtype=SD).view_as(scale)
    state = normlib.NormState(state.w * scale, state.m + far, state.m2 * scale)
    gy, gs = cotangents(name, x, B, C, True)
    kw = dict(state=state, gy=gy, gs=gs, layout="b c t")
    with tile_size(block_t=4, window=2, block_c=8, strip=strip, bwd_strip=strip):
        got = gradients(name, x, **kw)
    check_gradients(got, gradients(name, x, oracle=True, **kw), F32, name)


@pytest.mark.parametrize("name", ["cln", "emaln", "gln"])
def test_a_backward_that_chunks_channels_otherwise_keeps_the_forwards_shift(name):
    """The backward recomputes the shift K (frame 0's mean) in its own chunks of channels; summed in float32,
    its rounding changed with BLOCK_C, and under a DC offset of 1e5 dx was 4e-4 off when the two differed."""
    B, C, T = 2, 40, 24
    x = make_x(B, C, T, generator=torch.Generator().manual_seed(0), offset=1e5)
    gy, _ = cotangents(name, x, B, C, False)
    want = gradients(name, x, gy=gy, requires=("x",), oracle=True)
    for bc, bwd_bc in ((4, 32), (32, 4)):
        with tile_size(block_t=8, window=2, block_c=bc, bwd_block_c=bwd_bc):
            check_gradients(gradients(name, x, gy=gy, requires=("x",)), want, F32, f"{name} {bc}/{bwd_bc}")


@pytest.mark.parametrize("strip", [0, 1, 2, None], ids=["lookback", "strip", "seg", "default"])
def test_a_light_incoming_state_far_from_the_data(strip):
    """ccln's walks and backward tiles shift their float32 sums by the prefix's mean, and the first tile's
    prefix is the incoming state: a light one 1e3 from the data cost up to 17 bits of S2 - S1^2 / W (w_in =
    1e-3: y, dx and dL/dm_in 1e-2 off; w_in = 0.5: 3e-5). Rows: w_in 1e-3, 0.5 and 40 (outweighs a tile)."""
    B, C, T = 3, 5, 32 if strip is not None else 200  # default tiles: longer than 16 frames
    g = torch.Generator().manual_seed(4)
    x = make_x(B, C, T, generator=g)
    w_in = torch.tensor([1e-3, 0.5, 40.0], dtype=SD)[:, None].expand(B, C).clone()
    state = normlib.NormState(w_in, 1e3 + torch.randn(B, C, generator=g, dtype=SD), w_in * 2)
    gy, gs = cotangents("ccln", x, B, C, True)
    kw = dict(state=state, gy=gy, gs=gs)
    forced = dict(block_t=16, window=2, block_c=4, strip=strip, bwd_strip=strip, span=1)
    with tile_size(**(forced if strip is not None else {})):
        y, s = normlib.functional.ccln(dev(x), state=normlib.NormState(*map(dev, state)), return_state=True,
                                       backend="triton")
        got = gradients("ccln", x, requires=("x", "state"), **kw)
    y_ref, s_ref = ref("ccln", x, state=state, return_state=True)
    assert_rel(y, y_ref, TOL[F32], "y")
    assert_state_close(s, s_ref, TOL[F32])
    check_gradients(got, gradients("ccln", x, requires=("x", "state"), oracle=True, **kw), F32, "ccln")


@pytest.mark.parametrize("name", ["emaln", "ccemaln"])
def test_a_heavy_state_that_fades_keeps_frame_0s_shift(name):
    """An EMA state heavy at the start fades over a sequence much longer than 1/(1 - d): the means go to the
    data, 1e4 away from the state. Shifted by the state's mean, x - K carried that distance and y was 1e-5
    off (2.6e-4 on the later frames); the kernels keep frame 0's shift unless the state still outweighs the
    frames at the sequence's last frame."""
    B, C, T, decay = 2, 4, 64, 0.9
    g = torch.Generator().manual_seed(5)
    x = make_x(B, C, T, generator=g, offset=1e4)
    n0 = 1 if SPECS[name].per_channel else C
    shape = state_shape(name, B, C)
    w_in = torch.full(shape, 1.1 * n0 / (1 - decay) / decay, dtype=SD)  # outweighs frame 0 ... for a while
    state = normlib.NormState(w_in, torch.zeros(shape, dtype=SD), w_in.clone())
    gy, gs = cotangents(name, x, B, C, True)
    kw = dict(state=state, gy=gy, gs=gs, decay=decay)
    with tile_size(block_t=8, window=2, block_c=8):
        y = getattr(normlib.functional, name)(dev(x), state=normlib.NormState(*map(dev, state)), decay=decay,
                                               backend="triton")
        got = gradients(name, x, requires=("x", "state"), **kw)
    assert_rel(y, ref(name, x, state=state, decay=decay), TOL[F32], name)
    check_gradients(got, gradients(name, x, requires=("x", "state"), oracle=True, **kw), F32, name)


@pytest.mark.parametrize("decay, tol", [(1.0, 2e-3), (0.8, 1e-5)], ids=["ccln", "ccemaln-ema32"])
def test_a_strip_walk_under_a_heavy_far_state_saves_the_frames_own_prefixes(decay, tol):
    """The forward saves each tile's prefix of the frames alone (the backward merges the state in; the outgoing
    state is that prefix merged with the state in float64). A per-channel strip walk summed each tile shifted
    by the merged prefix's mean, which a heavy state holds 1e4 from the data: the saved M2 was 34 to 47 times
    its size off (dx 5e-5 off on the H100, the test below). Summed near the frames' own mean, the strip walk
    saves what the look-back saves. ccln's bound is the float32 frames' own: the state outweighs every frame,
    so frames are shifted by its mean (x - 1e4 keeps 1e-3 of a unit variance)."""
    B, C, T, bt = 2, 3, 120, 4
    g = torch.Generator().manual_seed(9)
    x = make_x(B, C, T, generator=g)
    w_in = torch.full((B, C), 6e6, dtype=SD)
    sin = dev(torch.stack([w_in, 1e4 + torch.randn((B, C), generator=g, dtype=SD), w_in * 1e-2]))
    t = torch.arange(T, dtype=SD)
    for strip in (False, True):
        with tile_size(block_t=bt, window=2, block_c=4, strip=strip, bwd_strip=strip):
            tiles = launch.tiles_for(dev(x), True, decay)
            assert decay == 1.0 or launch.ema32_for(True, 2, math.log2(decay), bt), "the case under test: EMA32"
            pre = launch.forward(dev(x), None, None, None, sin, per_channel=True, decay=decay, eps=1e-8,
                                 eps_outside=False, return_state=True, save=True, tiles=tiles)[2]
        pre = pre.double().cpu().reshape(B, T // bt, 3, -1)[..., :C]
        for it in range(1, T // bt):  # the prefix of tile it: frames 0 .. t0 - 1, seen from frame t0 - 1
            t0 = it * bt
            wt = decay ** (t0 - 1 - t[:t0])
            xs = x[..., :t0].double()
            w = wt.sum().expand(B, C)
            m2 = (wt * (xs - (xs * wt).sum(-1, keepdim=True) / wt.sum()) ** 2).sum(-1)
            assert_rel(pre[:, it, 0], w, 1e-6, f"strip={strip} tile {it}: the frames' weight")
            assert_rel(pre[:, it, 2], m2, tol, f"strip={strip} tile {it}: the frames' M2")


@pytest.mark.parametrize("name, decay, T, bt", [
    pytest.param("emaln", 0.3, 40, 8, id="emaln-d0.3"), pytest.param("ccemaln", 0.3, 40, 8, id="ccemaln-d0.3"),
    pytest.param("ccemaln", 0.8, 120, 4, id="ccemaln-d0.8-ema32")])
def test_a_heavy_far_state_that_fades_within_the_chunk_gets_its_mean_gradient(name, decay, T, bt, monkeypatch):
    """An EMA state of millions of frames' weight, 1e4 from the data, that fades within the chunk: frame 0's
    shift stays, and early frames' means sit near the state's mean. dL/dm_in weighs each frame's m_in - mu_t
    by w_in d^(t+1); taken from two float32 means near 1e4 apart, it was 37 times its size off (emaln) and
    33 % (ccemaln). The backward now takes m_in - mu_t from the frames' own prefix (saved without the state)
    and sums. dL/dm_in is a sum that cancels, so the bound is the PyTorch backend's own float32 error: its
    general path's, which it takes with lengths (without them a per-channel call runs in float64: 3e-4 -> 1e-6 here).
    Float64 sums (d = 0.3) and EMA32's float32 ones (d = 0.8), look-back tiles and strips."""
    B, C = 2, 3
    g = torch.Generator().manual_seed(9)
    x = make_x(B, C, T, generator=g)
    shape = state_shape(name, B, C)
    n0 = 1 if SPECS[name].per_channel else C
    w_in = torch.full(shape, 6e6 * n0, dtype=SD)
    state = normlib.NormState(w_in, 1e4 + torch.randn(shape, generator=g, dtype=SD), w_in * 1e-2)
    gy, gs = cotangents(name, x, B, C, True)
    kw = dict(state=state, gy=gy, gs=gs, decay=decay, requires=("x", "state"))
    want = gradients(name, x, oracle=True, **kw)
    # full lengths: the PyTorch backend's float32 general path (without them a per-channel norm runs in float64)
    full = torch.full((B,), T, dtype=torch.int64)
    on_torch = rel_err(gradients(name, x, backend="torch", lengths=full, **kw)["state.m"], want["state.m"])
    for strip in (False, True):
        with tile_size(block_t=bt, window=2, block_c=4, strip=strip, bwd_strip=strip):
            got = gradients(name, x, **kw)
        err = rel_err(got["state.m"], want["state.m"])
        assert err <= max(4 * on_torch, 1e-5), f"{name} strip={strip}: dL/dm_in {err:.1e}, torch {on_torch:.1e}"
        del got["state.m"]
        check_gradients(got, {k: v for k, v in want.items() if k != "state.m"}, F32, f"{name} {strip}")
