"""The Triton backend's forward (``backend="triton"``) against the float64 reference and the torch backend.

Without a GPU the kernels run on CPU tensors in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), which runs Python per program: shapes are small, and tiles are forced small with
``normlib.backends.triton.tile_size`` so that a sequence spans several tiles and the decoupled look-back
runs (``walk=True`` makes it ignore published prefixes but tile 0's, so it walks across several windows).
With a GPU the same tests run on CUDA tensors.

Every output buffer the launcher allocates is filled with NaN first (``_poison_buffers``), so an element
the kernel forgets to write fails the comparison.
"""
import itertools

import math

import pytest
import torch

import normlib
from normlib import backends
from normlib.backends.triton import launch, tile_size
from conftest import (padding_mask, DC_OFFSET_TOL, NORMS, SPECS, TOL, assert_rel, assert_state_close, make_affine,
                      make_state, make_x, ref, run, state_shape)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
F32, F16 = torch.float32, torch.float16
DTYPES = {"f32": F32, "f16": F16}
LAYOUTS = {"bct": "b c t", "btc": "b t c"}
RUNNING = ("cln", "ccln", "emaln", "ccemaln")  # the look-back norms (CUMULATIVE and EMA)
CAUSAL = RUNNING + ("frameln",)
GLOBAL = ("gln", "instln")
SD = normlib.NormState.empty((1,)).dtype  # the states' dtype (the library's contract, whatever the input's)
STATE_TOL = 1e-5  # states are computed in float32 at least, whatever the input dtype
GRID_EPS = 0.05  # large enough that eps inside / outside the sqrt differ by far more than the tolerance

pytestmark = [pytest.mark.skipif(not backends.triton_usable(torch.zeros(1, device=DEVICE)),
                                 reason="the Triton backend needs a GPU or TRITON_INTERPRET=1"),
              pytest.mark.usefixtures("poisoned_buffers")]


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------
def dev(t):
    return None if t is None else t.to(DEVICE)


def dev_state(s):
    return None if s is None else s.to(DEVICE)


def tri(name, x, weight=None, bias=None, eps=1e-8, **kw):
    """The Triton backend through the public functional API."""
    return getattr(normlib.functional, name)(x, weight, bias, eps, backend="triton", **kw)


def time_cat(chunks, layout):
    return torch.cat(chunks, dim=2 if layout == "b c t" else 1)


def time_split(x, sizes, layout):
    return x.split(sizes, dim=2 if layout == "b c t" else 1)


def check_output(y, x, expected, dtype, what):
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device, what
    assert not torch.isnan(y).any(), f"{what}: NaN in the output (an element left unwritten?)"
    assert_rel(y, expected, TOL[dtype], what)


def test_poison_reaches_the_output(monkeypatch):
    """The NaN poison must reach y: with a kernel that writes nothing, every element comes back NaN."""

    class NoKernel:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    monkeypatch.setattr(launch, "running_norm_fwd", NoKernel())
    for name in ("cln", "gln", "frameln"):
        assert torch.isnan(tri(name, dev(make_x(2, 5, 9)))).all(), name


# ---------------------------------------------------------------------------------------------------
# The flag grid: every norm x every flag of the kernel template, pairwise-covered.
# ---------------------------------------------------------------------------------------------------
def pairwise(factors):
    """A deterministic greedy covering array: rows of ``factors`` in which every pair of values of every
    two factors appears at least once (about 10 rows instead of the full product's hundreds)."""
    names = list(factors)
    pairs = list(itertools.combinations(names, 2))
    todo = {((a, va), (b, vb)) for a, b in pairs for va in factors[a] for vb in factors[b]}
    candidates = [dict(zip(names, values)) for values in itertools.product(*factors.values())]
    rows = []
    while todo:
        best = max(candidates, key=lambda r: sum(((a, r[a]), (b, r[b])) in todo for a, b in pairs))
        rows.append(best)
        todo -= {((a, best[a]), (b, best[b])) for a, b in pairs}
    return rows


def _grid():
    params = []
    for name in NORMS:
        factors = dict(affine=["none", "w", "b", "wb"], lengths=["full", "len"], eps_mode=["inside", "outside"],
                       layout=list(LAYOUTS), dtype=list(DTYPES))
        if SPECS[name].causal:
            factors.update(state_in=["nostate", "sin"], state_out=["noret", "sout"])
        if SPECS[name].per_channel:
            factors.update(cblocks=["1cb", "2cb"])
        if name in RUNNING + GLOBAL:  # GLOBAL: two launches, or one program per sequence reading it twice
            factors.update(tiles=["look", "strip"] + (["seg"] if name in RUNNING else []))
        for row in pairwise(factors):
            row = dict(dict(state_in="nostate", state_out="noret", cblocks="1cb", tiles="look"), **row)
            parts = [name, row["layout"], row["affine"], row["lengths"]]
            parts += [row["tiles"]] if name in RUNNING + GLOBAL else []
            parts += [row["cblocks"]] if SPECS[name].per_channel else []
            parts += [p for p in (row["state_in"], row["state_out"]) if p not in ("nostate", "noret")]
            parts += [f"eps{row['eps_mode']}", row["dtype"]]
            params.append(pytest.param(name, row, id="-".join(parts)))
    return params


@pytest.mark.parametrize("name, row", _grid())
def test_flag_grid(name, row):
    """Tiles of 8 frames over T=29 (4 tiles, the last one partial, look-back windows of 2), per-channel
    norms in one block of 8 channels or two blocks of 4 over C=5; lengths T, 0 and 19; an incoming state
    with an empty row (weight 0)."""
    B, C, T = 3, 5, 29
    dtype, layout = DTYPES[row["dtype"]], LAYOUTS[row["layout"]]
    x = make_x(B, C, T, layout, dtype, offset=0.3)
    w, b = make_affine(C, dtype)
    w = w if "w" in row["affine"] else None
    b = b if "b" in row["affine"] else None
    lengths = torch.tensor([T, 0, 19]) if row["lengths"] == "len" else None
    state = make_state(name, B, C, SD, empty_rows=(2,)) if row["state_in"] == "sin" else None
    sout = row["state_out"] == "sout"
    kw = dict(eps_mode=row["eps_mode"], layout=layout, lengths=lengths)
    if SPECS[name].causal:
        kw.update(state=state, return_state=sout)

    strip = dict(look=0, strip=1, seg=2)[row["tiles"]]  # seg: two segments of two tiles
    with tile_size(block_t=8, window=2, block_c=4 if row["cblocks"] == "2cb" else 8, strip=strip,
                   span=2 if strip == 2 else None):
        out = tri(name, dev(x), dev(w), dev(b), GRID_EPS, **dict(kw, lengths=dev(lengths), state=dev_state(state)))
    expected = ref(name, x, w, b, GRID_EPS, **kw)
    y, s = out if sout else (out, None)
    y_ref, s_ref = expected if sout else (expected, None)

    check_output(y, dev(x), y_ref, dtype, "y vs float64 reference")
    y_torch = run(name, x, w, b, GRID_EPS, **kw)
    assert_rel(y, y_torch[0] if sout else y_torch, TOL[dtype], "y vs torch backend")
    if lengths is not None:
        pad = padding_mask(lengths, layout, B, C, T)
        assert (y.cpu()[pad] == 0).all(), "padding frames must be exactly 0 (bias not added)"
    if sout:
        assert all(t.dtype == SD and t.device == y.device for t in s)
        assert_state_close(s, s_ref, STATE_TOL, "outgoing state")
        if lengths is not None and state is not None:  # length 0 hands the incoming state through
            for got, given in zip(s, state):
                assert torch.equal(got[1].cpu(), given[1])


# ---------------------------------------------------------------------------------------------------
# Tiles: several tiles per sequence, look-back walks across windows, several channel blocks, spans
# ---------------------------------------------------------------------------------------------------
def _tile_cases():
    p = []
    for name in RUNNING:
        pc = SPECS[name].per_channel
        p += [
            pytest.param(name, (2, 5, 37), dict(block_t=4, window=2, walk=True), "bct",
                         id=f"{name}-bt4-win2-walk"),
            pytest.param(name, (1, 5, 50), dict(block_t=4, window=4, walk=True), "btc",
                         id=f"{name}-bt4-win4-walk-btc"),
            pytest.param(name, (3, 5, 37), dict(block_t=4, block_c=2, strip=True), "bct", id=f"{name}-bt4-strip"),
            # segments of 3 tiles, the last of one; their sums read in windows of 2
            pytest.param(name, (2, 5, 37), dict(block_t=4, block_c=2, strip=2, span=3, window=2), "btc",
                         id=f"{name}-bt4-seg3-btc"),
            pytest.param(name, (1, 33, 50), dict(block_t=8, strip=2, span=1, window=2), "bct",
                         id=f"{name}-C33-bt8-seg1"),
            pytest.param(name, (2, 5, 37), dict(block_t=4, strip=2, span=100), "bct",  # one segment: no sums
                         id=f"{name}-bt4-seg-whole"),
        ]
        if not pc:
            p.append(pytest.param(name, (2, 33, 50), dict(block_t=16, window=2), "bct", id=f"{name}-C33-T50-bt16"))
        else:
            p += [
                pytest.param(name, (2, 5, 37), dict(block_t=8, window=2, block_c=2, walk=True), "btc",
                             id=f"{name}-bc2-bt8-walk-btc"),
                pytest.param(name, (1, 33, 20), dict(block_t=8, window=2, block_c=8), "btc",
                             id=f"{name}-C33-bc8-bt8-btc"),
            ]
    p += [
        pytest.param("frameln", (2, 5, 37), dict(block_t=8), "btc", id="frameln-bt8-btc"),
        pytest.param("frameln", (2, 33, 50), dict(block_t=16), "bct", id="frameln-C33-T50-bt16"),
    ]
    for name in GLOBAL:
        pc = SPECS[name].per_channel
        p += [
            pytest.param(name, (1, 5, 50), dict(block_t=4, span=1, window=4), "btc", id=f"{name}-bt4-span1-win4"),
            pytest.param(name, (2, 5, 50), dict(block_t=4, span=2, window=2), "bct", id=f"{name}-bt4-span2-win2"),
            pytest.param(name, (1, 5, 50), dict(block_t=4, span=3, window=2), "btc", id=f"{name}-bt4-span3-win2"),
            pytest.param(name, (1, 33, 50), dict(block_t=8, span=2, window=2, block_c=16), "bct",
                         id=f"{name}-C33-T50-bt8-span2" + ("-bc16" if pc else "")),
        ]
    return p


@pytest.mark.parametrize("name, shape, tiles, layout", _tile_cases())
def test_tiles(name, shape, tiles, layout):
    """Lengths (full, odd, and 0 where B > 2), an incoming state and the outgoing one where causal."""
    B, C, T = shape
    layout = LAYOUTS[layout]
    x = make_x(B, C, T, layout, F32, offset=-0.7)
    w, b = make_affine(C, F32)
    lengths = torch.tensor([T, T // 2 + 1, 0][:B]) if B > 1 else None
    kw = dict(layout=layout, lengths=lengths)
    causal = SPECS[name].causal
    if causal:
        kw.update(state=make_state(name, B, C, SD), return_state=True)
    with tile_size(**tiles):
        out = tri(name, dev(x), dev(w), dev(b), **dict(kw, lengths=dev(lengths), state=dev_state(kw.get("state"))))
    expected = ref(name, x, w, b, **kw)
    y, s = out if causal else (out, None)
    y_ref, s_ref = expected if causal else (expected, None)
    check_output(y, dev(x), y_ref, F32, "y")
    if causal:
        assert_state_close(s, s_ref, STATE_TOL)
    if lengths is not None:
        assert (y.cpu()[padding_mask(lengths, layout, B, C, T)] == 0).all()


def test_block_c_splits_per_channel_norms():
    """Sanity of the test hook itself: block_c=2 over C=5 really gives three channel blocks."""
    seen = {}
    real = launch.running_norm_fwd

    class Spy:
        def __getitem__(self, grid):
            def call(*a, **k):
                seen.update(grid=grid, BLOCK_C=k["BLOCK_C"], NCB=k["NCB"], NT=k["NT"])
                return real[grid](*a, **k)
            return call

    x = dev(make_x(2, 5, 37))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "running_norm_fwd", Spy())
        with tile_size(block_t=8, block_c=2, window=2):
            tri("ccln", x)
    assert seen == dict(grid=(2 * 3 * 5, 1, 1), BLOCK_C=2, NCB=3, NT=5)


@pytest.mark.parametrize("name", ["cln", "ccemaln"])
def test_segmented_walks_sum_then_walk_each_segment(name):
    """strip=2 (SEG): forward and backward each launch segment sums, then walks, each of B * NCB * NSPAN
    programs. Both against the float64 reference: a walk that started from the wrong carry (say, its own
    segment's sum) would fail."""
    launches = []

    class Spy:
        def __init__(self, real):
            self.real = real

        def __getitem__(self, grid):
            def call(*a, **k):
                launches.append((grid, k["PHASE"], k.get("SEG", False), k["NSPAN"]))
                return self.real[grid](*a, **k)
            return call

    B, C, T = 2, 5, 37  # 10 tiles of 4 frames: segments of 3, 3, 3 and 1
    x = make_x(B, C, T, offset=2.0)
    w, b = make_affine(C, F32)
    ncb = 3 if SPECS[name].per_channel else 1
    xg = dev(x).clone().requires_grad_()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "running_norm_fwd", Spy(launch.running_norm_fwd))
        mp.setattr(launch, "running_norm_bwd", Spy(launch.running_norm_bwd))
        with tile_size(block_t=4, block_c=2, strip=2, span=3, window=2):
            y = tri(name, xg, dev(w), dev(b))
            (gx,) = torch.autograd.grad((y * dev(x).cos()).sum(), xg)
    assert launches == [((B * ncb * 4, 1, 1), 1, True, 4), ((B * ncb * 4, 1, 1), 2, True, 4)] * 2
    xr = x.double().requires_grad_()
    y_ref = ref(name, xr, w, b)
    check_output(y, dev(x), y_ref.detach(), F32, "y")
    (gx_ref,) = torch.autograd.grad((y_ref * x.double().cos()).sum(), xr)
    assert_rel(gx, gx_ref, 1e-4, "dx")


# ---------------------------------------------------------------------------------------------------
# Chunked streaming: any chunking threads the state to the same output as the whole sequence
# ---------------------------------------------------------------------------------------------------
CHUNKINGS = {
    "a": [1, 7, 13, 9, 15],  # T = 45
    "b": [16, 0, 4, 24, 1],  # a chunk of 0 frames, chunks on tile edges
    "c": [20, 25],
}


def _stream_cases():
    p = []
    for name in CAUSAL:
        cases = [("bct", "a", "nostate", "f32"), ("btc", "b", "sin", "f32")]
        if name == "cln":
            cases += [("bct", "c", "sin", "f16"), ("btc", "random", "sin", "f32")]
        if name == "ccemaln":
            cases += [("bct", "random", "sin", "f32")]
        for layout, chunks, start, dtype in cases:
            p.append(pytest.param(name, layout, chunks, start, dtype,
                                  id=f"{name}-{layout}-chunks-{chunks}-{start}-{dtype}"))
    return p


@pytest.mark.parametrize("name, layout, chunking, start, dtype", _stream_cases())
def test_chunked_streaming(name, layout, chunking, start, dtype):
    B, C, T = 2, 5, 45
    layout, dtype = LAYOUTS[layout], DTYPES[dtype]
    if chunking == "random":
        g = torch.Generator().manual_seed(1234)
        sizes = []
        while sum(sizes) < T:
            sizes.append(min(int(torch.randint(0, 17, (1,), generator=g)), T - sum(sizes)))
    else:
        sizes = CHUNKINGS[chunking]
    assert sum(sizes) == T
    x = make_x(B, C, T, layout, dtype, offset=0.4)
    w, b = make_affine(C, dtype)
    state0 = make_state(name, B, C, SD, empty_rows=(1,)) if start == "sin" else None
    # the random chunking's chunks hold up to 4 tiles of 4 frames: the look-back crosses several tiles
    tiles = dict(block_t=4, window=2) if chunking == "random" else dict(block_t=8, window=2)

    with tile_size(**tiles):
        y_whole, s_whole = tri(name, dev(x), dev(w), dev(b), layout=layout, state=dev_state(state0),
                               return_state=True)
        ys, state = [], dev_state(state0)
        for chunk in time_split(dev(x), sizes, layout):
            y, state = tri(name, chunk, dev(w), dev(b), layout=layout, state=state, return_state=True)
            ys.append(y)
    y_chunks = time_cat(ys, layout)
    y_ref, s_ref = ref(name, x, w, b, layout=layout, state=state0, return_state=True)

    check_output(y_chunks, dev(x), y_ref, dtype, "chunked vs float64 reference")
    check_output(y_whole, dev(x), y_ref, dtype, "whole vs float64 reference")
    assert_rel(y_chunks, y_whole, TOL[dtype], "chunked vs whole")
    assert_state_close(state, s_ref, STATE_TOL, "chunked state vs reference")
    assert_state_close(state, s_whole, STATE_TOL, "chunked state vs whole")


@pytest.mark.parametrize("T", [1, 12], ids=["frame", "3tiles"])
@pytest.mark.parametrize("strip", [0, 1, 2], ids=["lookback", "strip", "seg"])
@pytest.mark.parametrize("name", RUNNING)
def test_the_outgoing_state_merges_in_float64(name, strip, T):
    """The outgoing state is the incoming one merged in float64 with the summary of the chunk's own frames (the
    tiles' prefixes leave the state out; each tile merges it in for its output). A float32 merge rounded a
    heavy state by 2^-24 each call, and an EMA keeps each rounding for about 1 / (1 - d) calls: emaln at
    d = 0.999 streamed one frame a call drifted to 1e-5 of the reference."""
    B, C = 2, 3
    x = make_x(B, C, T, offset=5.0, scale=2.0)
    s0 = make_state(name, B, C, SD)
    s0 = normlib.NormState(s0.w * 1e6, s0.m, s0.m2 * 1e6)  # a million frames' weight
    kw = {"decay": 0.999} if name in ("emaln", "ccemaln") else {}
    _, s_ref = ref(name, x, state=s0, return_state=True, **kw)
    with tile_size(block_t=4, window=2, strip=strip):
        _, s = tri(name, dev(x), state=dev_state(s0), return_state=True, **kw)
    assert_state_close(s.to("cpu"), s_ref, 1e-10, "outgoing state")


# ---------------------------------------------------------------------------------------------------
# DC offsets: float32 statistics must not cancel (DESIGN.md section 1)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("offset", [1e2, 1e4], ids=["dc1e2", "dc1e4"])
@pytest.mark.parametrize("name", NORMS)
def test_dc_offset(name, offset):
    B, C, T = 2, 5, 37
    x = make_x(B, C, T, "b c t", F32, offset=offset)
    lengths = torch.tensor([T, 23])
    with tile_size(block_t=16, window=2, block_c=4, span=2):
        y = tri(name, dev(x), lengths=dev(lengths))
    assert torch.isfinite(y).all()
    assert_rel(y, ref(name, x, lengths=lengths), DC_OFFSET_TOL[offset], f"offset {offset:g}")


@pytest.mark.parametrize("state_kind", ["near", "empty"])
@pytest.mark.parametrize("name", RUNNING)
def test_dc_offset_with_state(name, state_kind):
    """An incoming state whose mean sits at the offset, or an empty one (weight 0, mean 0)."""
    B, C, T = 2, 5, 37
    offset = 1e4
    x = make_x(B, C, T, "b c t", F32, offset=offset)
    state = make_state(name, B, C, torch.float64)
    if state_kind == "near":
        state = normlib.NormState(state.w, state.m + offset, state.m2).to(SD)
    else:
        state = normlib.NormState.empty(state.w.shape)
    with tile_size(block_t=8, window=2):
        y, s = tri(name, dev(x), state=dev_state(state), return_state=True)
    y_ref, s_ref = ref(name, x, state=state, return_state=True)
    assert torch.isfinite(y).all()
    assert_rel(y, y_ref, DC_OFFSET_TOL[offset], "y")
    assert_rel(s.m, s_ref.m, 1e-6, "state.m")
    assert_rel(s.m2, s_ref.m2, DC_OFFSET_TOL[offset], "state.m2")


@pytest.mark.parametrize("name, decay", [
    pytest.param("emaln", 1e-3, id="emaln-decay1e-3"),  # a tile's decay (1e-24) all but underflows
    pytest.param("emaln", 0.5, id="emaln-decay0.5"),
    pytest.param("emaln", 1.0, id="emaln-decay1"),  # CUMULATIVE
    pytest.param("ccemaln", 0.1, id="ccemaln-decay0.1"),  # (a per-channel EMA with a tiny decay is the
    pytest.param("ccemaln", 0.9999, id="ccemaln-decay0.9999"),  # degenerate per-channel FRAME norm:
    pytest.param("ccemaln", 1.0, id="ccemaln-decay1"),  # ill-conditioned, no test at tolerance)
])
def test_ema_decays(name, decay):
    """EMA decays from strong to 1 (CUMULATIVE), across tiles and look-back windows."""
    B, C, T = 2, 5, 37
    x = make_x(B, C, T, offset=0.3)
    state = make_state(name, B, C, SD)
    lengths = torch.tensor([T, 21])
    kw = dict(decay=decay, lengths=lengths, state=state, return_state=True)
    with tile_size(block_t=8, window=2, walk=True):
        y, s = tri(name, dev(x), **dict(kw, lengths=dev(lengths), state=dev_state(state)))
    y_ref, s_ref = ref(name, x, **kw)
    check_output(y, dev(x), y_ref, F32, "y")
    assert_state_close(s, s_ref, STATE_TOL)


def test_emaln_decay_0_is_frameln():
    x = dev(make_x(2, 5, 37))
    with tile_size(block_t=8, window=2):
        assert_rel(tri("emaln", x, decay=0.0), tri("frameln", x), 1e-6, "emaln(decay=0) vs frameln")


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["frameln", "emaln"])
def test_frame_statistics_keep_a_small_spread_far_from_frame_0(name, backend, layout):
    """Frames drifting by ~1 with a spread of 1e-3: a shift by frame 0 (not by each frame's own value)
    rounds x - K to ~6e-8 absolute, 1e-4 of the spread (found by hypothesis: emaln decay 0, C = 2)."""
    B, C, T = 2, 6, 19
    g = torch.Generator().manual_seed(5)
    drift = torch.randn(B, 1, T, dtype=torch.float64, generator=g).cumsum(-1)
    x = (drift + 1e-3 * torch.randn(B, C, T, dtype=torch.float64, generator=g)).to(F32)
    if layout == "btc":
        x = x.transpose(1, 2).contiguous()
    kw = dict(layout=LAYOUTS[layout], **({"decay": 0.0} if name == "emaln" else {}))
    xd = dev(x).detach().clone().requires_grad_()
    gy = torch.randn(x.shape, dtype=torch.float64, generator=g)
    ys, state = [], None
    with tile_size(block_t=8, block_c=4):
        for chunk in xd.split([7, 1, 11], dim=2 if layout == "bct" else 1):
            y, state = getattr(normlib.functional, name)(chunk, None, None, 1e-8, backend=backend, state=state,
                                                         return_state=True, **kw)
            ys.append(y)
        y = time_cat(ys, LAYOUTS[layout])
        (y.double() * dev(gy)).sum().backward()
    x64 = x.detach().double().requires_grad_()
    y_ref, s_ref = ref(name, x64, return_state=True, **kw)
    (y_ref * gy).sum().backward()
    assert_rel(y, y_ref, TOL[F32], "y")
    assert_rel(state.m, s_ref.m, STATE_TOL, "state.m")
    assert_rel(state.m2, s_ref.m2, 1e-4, "state.m2")  # a sum of squares of 1e-3 spreads, in float32
    assert_rel(xd.grad, x64.grad, 1e-4, "dx")  # dx of a 1e-3 spread is ~1e3 dy: conditioned to match


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_per_channel_sums_shifted_by_a_tile_value_stay_accurate(layout):
    """ccln's in-tile sums are float32 sums of x - L, L the tile's first value: the worst case is a tile
    whose first value sits far from the rest (a step, under a DC offset), where sum (x - L)^2 is up to
    BLOCK_T times M2. Against float64, with the state, gradients and a prefix from earlier tiles."""
    B, C, T = 2, 3, 70
    g = torch.Generator().manual_seed(7)
    x = 1e3 + 1e-2 * torch.randn(B, C, T, dtype=torch.float64, generator=g)
    x[..., ::32] += 1.0  # each tile's first frame (block_t=32) stands out by 100 of the spread
    x = x.to(F32)
    if layout == "btc":
        x = x.transpose(1, 2).contiguous()
    xd = dev(x).detach().clone().requires_grad_()
    gy = torch.randn(x.shape, dtype=torch.float64, generator=g)
    with tile_size(block_t=32, window=2):
        y, s = tri("ccln", xd, layout=LAYOUTS[layout], return_state=True)
        (y.double() * dev(gy)).sum().backward()
    x64 = x.detach().double().requires_grad_()
    y_ref, s_ref = ref("ccln", x64, layout=LAYOUTS[layout], return_state=True)
    (y_ref * gy).sum().backward()
    assert_rel(y, y_ref, TOL[F32], "y")
    assert_rel(s.m2, s_ref.m2, STATE_TOL, "state.m2")
    assert_rel(xd.grad, x64.grad, 1e-4, "dx")


@pytest.mark.parametrize("strip", [0, 1, 2], ids=["lookback", "strip", "seg"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_per_channel_sums_shifted_by_the_prefix_mean_stay_accurate(layout, strip):
    """A walk (strip, SEG) and the backward shift ccln's in-tile sums by the prefix's mean (_chan_frames):
    the worst case is a light prefix far from the tile's values, here an incoming state of weight 1 whose
    mean sits 100 spreads below the data, then a step of 100 spreads mid-tile, under a DC offset of 1e3.
    Look-back tiles (strip 0) shift by the tile's first value. Against float64: y, the state, dx."""
    B, C, T = 2, 3, 70
    g = torch.Generator().manual_seed(11)
    x = 1e3 + 1e-2 * torch.randn(B, C, T, dtype=torch.float64, generator=g)
    x[..., 40:] += 1.0
    full = lambda v: torch.full((B, C), v, dtype=torch.float64)  # noqa: E731
    state = normlib.NormState(full(1.0), full(999.0), full(1e-4)).to(SD)
    x = x.to(F32)
    if layout == "btc":
        x = x.transpose(1, 2).contiguous()
    xd = dev(x).detach().clone().requires_grad_()
    gy = torch.randn(x.shape, dtype=torch.float64, generator=g)
    with tile_size(block_t=32, window=2, strip=strip, span=1):
        y, s = tri("ccln", xd, layout=LAYOUTS[layout], state=dev_state(state), return_state=True)
        (y.double() * dev(gy)).sum().backward()
    x64 = x.detach().double().requires_grad_()
    y_ref, s_ref = ref("ccln", x64, layout=LAYOUTS[layout], state=state, return_state=True)
    (y_ref * gy).sum().backward()
    assert_rel(y, y_ref, TOL[F32], "y")
    assert_rel(s.m2, s_ref.m2, STATE_TOL, "state.m2")
    assert_rel(xd.grad, x64.grad, 1e-4, "dx")


@pytest.mark.parametrize("decay", [0.96, 0.99])
@pytest.mark.parametrize("strip", [1, 2], ids=["strip", "seg"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_per_channel_ema_float32_sums_stay_accurate(layout, strip, decay):
    """ccemaln's walks and backward take float32 sums shifted by the prefix's mean (EMA32) where a tile decays by
    no more than 2^-EMA32_SPAN: 0.96 on 32 frames (0.27) is near that edge. The worst cases of the ccln test
    above (a light state 100 spreads below the data, a step mid-tile, DC 1e3) with lengths that end inside a
    tile (its frames' weights are taken whole: only padding follows). Against float64: y, the state, dx,
    dweight; the launcher must have chosen the float32 sums, and they must agree with the float64 ones."""
    B, C, T = 2, 3, 70
    assert launch.ema32_for(True, launch.EMA, math.log2(decay), 32)
    g = torch.Generator().manual_seed(13)
    x = 1e3 + 1e-2 * torch.randn(B, C, T, dtype=torch.float64, generator=g)
    x[..., 40:] += 1.0
    full = lambda v: torch.full((B, C), v, dtype=torch.float64)  # noqa: E731
    state = normlib.NormState(full(1.0), full(999.0), full(1e-4)).to(SD)
    lengths = torch.tensor([70, 45])
    weight, bias = make_affine(C, torch.float64, g)
    x = x.to(F32)
    if layout == "btc":
        x = x.transpose(1, 2).contiguous()
    gy = torch.randn(x.shape, dtype=torch.float64, generator=g)
    outs = []
    for ema32 in (True, False):
        xd = dev(x).detach().clone().requires_grad_()
        wd = dev(weight.to(F32)).requires_grad_()
        with tile_size(block_t=32, window=2, strip=strip, span=1, ema32=ema32):
            y, s = tri("ccemaln", xd, wd, dev(bias.to(F32)), layout=LAYOUTS[layout], decay=decay,
                       state=dev_state(state), lengths=dev(lengths), return_state=True)
            (y.double() * dev(gy)).sum().backward()
        outs.append((y, s, xd.grad, wd.grad))
    x64 = x.detach().double().requires_grad_()
    w64 = weight.clone().requires_grad_()
    y_ref, s_ref = ref("ccemaln", x64, w64, bias, layout=LAYOUTS[layout], decay=decay, state=state,
                       lengths=lengths, return_state=True)
    (y_ref * gy).sum().backward()
    for (y, s, gx, gw), what in zip(outs, ("float32 sums", "float64 sums")):
        assert_rel(y, y_ref, TOL[F32], f"y, {what}")
        assert_rel(s.m2, s_ref.m2, STATE_TOL, f"state.m2, {what}")
        assert_rel(gx, x64.grad, 1e-4, f"dx, {what}")
        assert_rel(gw, w64.grad, 1e-4, f"dweight, {what}")
    assert_rel(outs[0][0], outs[1][0], TOL[F32], "y, float32 against float64 sums")


def test_per_channel_ema_takes_float32_sums_only_where_a_tile_keeps_a_quarter_of_its_prefix():
    """EMA32: d^BLOCK_T >= 1/4 (ccemaln's default 0.99 on its [4, 128] "b c t" tiles), per channel, EMA only."""
    assert launch.ema32_for(True, launch.EMA, math.log2(0.99), 128)
    assert not launch.ema32_for(True, launch.EMA, math.log2(0.98), 128)
    assert launch.ema32_for(True, launch.EMA, math.log2(0.9), 8)
    assert not launch.ema32_for(True, launch.EMA, math.log2(0.1), 8)
    assert not launch.ema32_for(False, launch.EMA, math.log2(0.99), 128)  # emaln: pooled
    assert not launch.ema32_for(True, launch.CUMULATIVE, 0.0, 128)  # ccln has its own float32 sums
    with tile_size(ema32=False):
        assert not launch.ema32_for(True, launch.EMA, math.log2(0.99), 128)


# ---------------------------------------------------------------------------------------------------
# Gradients: the Triton path's backward against the torch backend's autograd
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", NORMS)
def test_gradients_match_torch_backend(name, layout):
    """Gradients into x, weight, bias and the incoming state (through y and the outgoing state); lengths
    T, 11 and 0; "b t c" with the look-back walking."""
    B, C, T = 3, 5, 19
    layout = LAYOUTS[layout]
    causal = SPECS[name].causal
    x0 = make_x(B, C, T, layout, F32, offset=0.2)
    w0, b0 = make_affine(C, F32)
    lengths = torch.tensor([T, 11, 0])
    s0 = make_state(name, B, C, SD) if causal else None
    g = torch.Generator().manual_seed(7)
    gy = torch.randn(x0.shape, generator=g)
    gs = [torch.randn(s0.w.shape, generator=g, dtype=SD) for _ in range(3)] if causal else None

    def grads(backend):
        x, w, b = (dev(t).requires_grad_() for t in (x0, w0, b0))
        kw = dict(layout=layout, lengths=dev(lengths), backend=backend)
        inputs = [x, w, b]
        if causal:
            state = normlib.NormState(*(dev(t).requires_grad_() for t in s0))
            inputs += list(state)
            y, s = getattr(normlib.functional, name)(x, w, b, state=state, return_state=True, **kw)
            loss = (y * dev(gy)).sum() + sum((t * dev(gt)).sum() for t, gt in zip(s, gs))
        else:
            y = getattr(normlib.functional, name)(x, w, b, **kw)
            loss = (y * dev(gy)).sum()
        got = torch.autograd.grad(loss, inputs, allow_unused=True)
        return [torch.zeros_like(t) if gt is None else gt for t, gt in zip(inputs, got)]

    with tile_size(block_t=8, window=2, block_c=4, walk=layout == "b t c"):
        got = grads("triton")
    want = grads("torch")
    for what, a, e in zip(["x", "weight", "bias", "state.w", "state.m", "state.m2"], got, want):
        assert torch.isfinite(a).all(), what
        assert_rel(a, e, 1e-5, f"grad {what}")


def test_frameln_state_gradient_through_a_row_of_length_0():
    """FRAME ignores the incoming state's statistics, but a row of length 0 hands the state through: its m
    and m2 get the gradient of the returned ones there; its weight, a count, gets none on either backend."""
    x = dev(make_x(2, 3, 5))
    grads = {}
    for backend in ("torch", "triton"):
        state = normlib.NormState(*(dev(t).requires_grad_() for t in make_state("frameln", 2, 3, SD)))
        _, s = normlib.functional.frameln(x, state=state, lengths=dev(torch.tensor([5, 0])), return_state=True,
                                          backend=backend)
        loss = (s.m.sum() + s.m2.sum()) + (s.w.sum() if s.w.requires_grad else 0)
        grads[backend] = torch.autograd.grad(loss, list(state), allow_unused=True)
    for g in (grads["torch"][0], grads["triton"][0]):
        assert g is None or not g.any()
    for g_torch, g_triton in zip(grads["torch"][1:], grads["triton"][1:]):
        assert g_torch is not None and g_triton is not None and torch.equal(g_triton, g_torch)
        assert torch.equal(g_torch.cpu(), torch.tensor([0.0, 1.0], dtype=SD))  # row 1 (length 0) only


@pytest.mark.parametrize("name", ["cln", "ccemaln"])
def test_gradient_of_the_returned_state_alone(name):
    """y unused: eager backward then gets no dy (unused gradients are not zero-filled) and must still run."""
    x = dev(make_x(2, 5, 37))
    grads = {}
    for backend in ("torch", "triton"):
        xg = (x.double() if backend == "torch" else x).requires_grad_()
        _, s = getattr(normlib.functional, name)(xg, return_state=True, backend=backend)
        (grads[backend],) = torch.autograd.grad(s.m.sum() + s.m2.sum(), [xg])
    assert_rel(grads["triton"], grads["torch"], 1e-5, "grad x")


def test_gradient_flows_only_into_what_requires_it(monkeypatch):
    """weight and bias given but not trained: dx is the torch backend's, and the backward stores no weight
    gradients' partials (STORE_GW off)."""
    stored, real = [], launch.running_norm_bwd

    class Spy:
        def __getitem__(self, grid):
            def run(**k):
                stored.append(k["STORE_GW"])
                return real[grid](**k)
            return run

    monkeypatch.setattr(launch, "running_norm_bwd", Spy())
    x = dev(make_x(2, 5, 21))
    w, b = (dev(t) for t in make_affine(5, F32))
    grads = {}
    for backend in ("torch", "triton"):
        xb = x.clone().requires_grad_()
        y = normlib.functional.cln(xb, w, b, backend=backend)
        (grads[backend],) = torch.autograd.grad(y.square().sum(), [xb])
    assert stored == [False]
    assert_rel(grads["triton"], grads["torch"], 1e-5, "grad x")


# ---------------------------------------------------------------------------------------------------
# Dispatch, dtypes, odd inputs
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NORMS)
def test_float64_with_triton_raises(name):
    x = dev(make_x(2, 3, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32"):
        tri(name, x)


def test_auto_on_cpu_is_torch(monkeypatch):
    x = make_x(2, 5, 9)
    assert backends.resolve("auto", x) is backends.BACKENDS["torch"]
    assert backends.resolve("auto", x.double()) is backends.BACKENDS["torch"]

    def refuse(*a, **k):
        raise AssertionError("backend='auto' on a CPU tensor must not use the Triton backend")

    monkeypatch.setitem(backends.BACKENDS, "triton", refuse)
    for name in NORMS:
        assert torch.equal(getattr(normlib.functional, name)(x), run(name, x))


def test_auto_under_compile_keeps_the_triton_ops(monkeypatch):
    """Traced by torch.compile, backend="auto" gives a CUDA tensor the Triton ops, as eager calls get (Inductor
    launches their kernels itself); float64 takes the PyTorch backend either way."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(2, 5, 9, device="cuda")
    monkeypatch.setattr(backends, "triton_usable", lambda t: True)
    tri_fwd, torch_fwd = backends.BACKENDS["triton"], backends.BACKENDS["torch"]
    for compiling in (False, True):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
        assert backends.resolve("auto", x) is tri_fwd
        assert backends.resolve("auto", x.double()) is torch_fwd
        assert backends.resolve("torch", x) is torch_fwd


def test_default_tiles_match_the_torch_backend_and_the_reference():
    """No tile override: the launcher's own tile choice (one tile per sequence at this size)."""
    x = make_x(2, 5, 37, offset=1.0)
    for name in NORMS:
        y = tri(name, dev(x))
        check_output(y, dev(x), ref(name, x), F32, name)
        assert_rel(y, run(name, x), TOL[F32], name)


def test_launcher_walks_sequences_in_one_program_only_when_there_are_enough():
    """Strip (one program per sequence) for CUMULATIVE and EMA once there are STRIP_PER_SM sequences (or
    STRIP_PER_SM_CH channel blocks) per SM; below that, look-back, or segmented walks (SEG) for per-channel
    "b c t" and always for per-channel "b t c", SEG_PER_SM of them per SM; for GLOBAL on small inputs; never for FRAME. A per-channel "b c t"
    forward walks whole sequences through SEG's code (one segment), its backward as a strip. All give the
    reference."""
    sms = launch._num_sms(torch.device(DEVICE))
    need = launch.STRIP_PER_SM * sms
    few, many = make_x(2, 3, 20), make_x(need, 3, 20)

    def walks(x, per_channel, decay):  # (forward, backward, segments)
        tiles = launch.tiles_for(dev(x), per_channel, decay)
        return tiles[7], tiles[12], launch.plan(x.shape, per_channel, decay, tiles).nspan
    assert walks(few, False, 1.0)[:2] == (0, 0) and walks(many, False, 1.0) == (1, 1, 1)
    assert walks(few, True, 0.5)[:2] == (2, 2) and walks(many, True, 0.5) == (2, 1, 1)
    ncb = -(-3 // launch.choose_tiles(3, 20, True, False, torch.device(DEVICE))[0])
    enough = math.ceil(launch.STRIP_PER_SM_CH * sms / ncb)
    assert walks(make_x(enough, 3, 20), True, 1.0)[:2] == (2, 1)
    assert walks(make_x(enough - 1, 3, 20), True, 1.0)[:2] == (2, 2)
    # pooled "b t c" forwards walk segments of 8 tiles or more on one or two sequences; their backward does not
    seg = lambda B, T, last=True: launch.choose_launch(B, 128, T, False, last, launch.CUMULATIVE, 132, 0)  # noqa: E731
    assert [seg(1, 256000)[i] for i in (3, 8)] == [2, 0] and seg(2, 64000)[3] == 2
    assert seg(4, 64000)[3] == seg(2, 4000)[3] == seg(1, 256000, last=False)[3] == 0
    assert seg(1, 256000)[2] == 8 and seg(1, 256000)[6] == 4  # the forward walks on 8 warps, the look-back on 4
    long = make_x(2, 3, 4000)
    tiles = launch.tiles_for(dev(long), True, 1.0)
    p = launch.plan(long.shape, True, 1.0, tiles)
    assert tiles[7] == 2 and tiles[4] == -(-p.nt // (launch.SEG_PER_SM[1][0] * sms // (2 * p.ncb))) and p.nspan > 1
    assert launch.tiles_for(dev(many), False, 0.0)[7] == 0  # FRAME: nothing to carry
    # GLOBAL: one launch that reads x twice (from L2) when x is small and has 32 sequences or more
    assert launch.tiles_for(dev(make_x(32, 3, 20)), False, None)[7] == 1
    assert launch.tiles_for(dev(make_x(31, 3, 20)), False, None)[7] == 0
    assert launch.strip_for(launch.GLOBAL, 64, 1, False, False, sms, launch.GLOBAL_STRIP_BYTES + 1) == (0, 0)
    # ... and fewer sequences than SMs strip only when they are short: each program walks its sequence twice
    assert launch.strip_for(launch.GLOBAL, 64, 63, True, True, 132, 1 << 20) == (0, 0)
    assert launch.strip_for(launch.GLOBAL, 64, 8, True, True, 132, 1 << 20) == (1, 1)
    assert launch.strip_for(launch.GLOBAL, 132, 63, True, True, 132, 1 << 20) == (1, 1)
    with tile_size(block_t=8):
        for name in ("cln", "ccemaln", "gln", "instln"):
            check_output(tri(name, dev(many)), dev(many), ref(name, many), F32, name)
    # per-channel "b t c" running norms always walk segments, SEG_PER_SM[2] per SM, of one-warp [128, 8] tiles;
    # ccln's forward more of them, where they stay SEG_MIN_TILES long (ccemaln's as many as its backward)
    btc = lambda n, C=3, T=20: make_x(n, C, T).transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
    for n, C, T in ((2, 3, 20), (need, 3, 20), (2, 200, 300), (1, 3, 8 * 8 * 12 * sms + 1)):
        x = dev(btc(n, C, T))
        ema = launch.tiles_for(x, True, 0.5)
        assert ema[4] == ema[13] and (ema[7], ema[12]) == (2, 2)
        tiles = launch.tiles_for(x, True, 1.0)
        span_f, span_b = (-(-(-(-T // 8)) // max(1, k * sms // (n * -(-C // 128)))) for k in launch.SEG_PER_SM[2])
        assert tiles[:3] == [min(128, 1 << (C - 1).bit_length()), 8, 1] and (tiles[7], tiles[12]) == (2, 2)
        assert (tiles[4], tiles[13]) == (span_f if span_f >= launch.SEG_MIN_TILES else span_b, span_b)
        assert launch.backward_tiles(tiles)[4] == span_b
    assert tiles[4] == launch.SEG_MIN_TILES + 1 and tiles[13] > tiles[4]  # the last row: the forward's own span
    assert launch.tiles_for(dev(btc(2)), True, None)[:3] == [4, 32, 4]  # instln keeps its look-back-free tiles
    assert launch.tiles_for(dev(btc(2, 300, 20)).half(), True, None)[:3] == [64, 32, 4]  # rows of 128 bytes
    # 16-bit inputs of the same shape get their own tiles (the cache is keyed by dtype too)
    assert launch.tiles_for(dev(btc(2, 300, 20)), True, 1.0)[:3] == [128, 8, 1]
    assert launch.tiles_for(dev(btc(2, 300, 20)).half(), True, 1.0)[:3] == [256, 4, 1]
    assert launch.tiles_for(dev(btc(2, 100, 20)).half(), True, 1.0)[:3] == [128, 4, 1]
    assert launch.tiles_for(dev(btc(2, 60, 20)).half(), True, 1.0)[:3] == [64, 8, 1]  # 4 frames: one a lane
    with tile_size(block_c=32, block_t=16):  # forced tiles take the warps of their size, unless forced too
        assert launch.tiles_for(dev(btc(2, 300, 20)), True, 1.0)[:3] == [32, 16, 4]
    x = make_x(2, 200, 300, "b t c", offset=1.0)  # (B, T, C): 38 tiles in segments of 5
    assert launch.plan((2, 200, 300), True, 1.0, launch.tiles_for(dev(x).transpose(1, 2), True, 1.0)).nspan > 1
    for name in ("ccln", "ccemaln"):
        check_output(tri(name, dev(x), layout="b t c"), dev(x), ref(name, x, layout="b t c"), F32, name)


def test_a_backward_alone_walking_segments_sizes_them_for_its_layout():
    """Each pass's segments come from its own SEG_PER_SM entry: a forced per-channel "b c t" backward that walks
    segments behind a forward that walks whole sequences takes 16 walks per SM, not the pooled 4."""
    B, C, T = 2, 8, 4000
    x = dev(make_x(B, C, T))
    with tile_size(strip=1, bwd_strip=2):
        tiles = launch.tiles_for(x, True, 1.0)
    nt, ncb, sms = -(-T // tiles[1]), -(-C // tiles[0]), launch._num_sms(x.device)
    assert (tiles[7], tiles[12]) == (1, 2)
    assert tiles[13] == -(-nt // max(1, launch.SEG_PER_SM[1][1] * sms // (B * ncb)))


def test_pooled_strip_walks_run_on_8_warps():
    """A pooled strip walk holds two tiles (it prefetches), so its tiles run on 8 warps, where the
    look-back's 4 would spill; forward and backward still agree with the reference on that tiling."""
    x = make_x(64, 130, 70)  # 2.3 MB: GLOBAL walks it in strips
    tiles = launch.tiles_for(dev(x), False, None)
    assert tiles[7] == 1 and tiles[:3] == [128, 64, 8] and launch.backward_tiles(tiles)[:3] == [128, 64, 8]
    assert launch.tiles_for(dev(x[:2]), False, None)[:3] == [128, 64, 4]  # look-back
    check_output(tri("gln", dev(x)), dev(x), ref("gln", x), F32, "gln")
    gy = make_x(64, 130, 70)
    xg, xr = dev(x).requires_grad_(), x.double().requires_grad_()
    (got,) = torch.autograd.grad(tri("gln", xg), [xg], dev(gy))
    (want,) = torch.autograd.grad(normlib.functional.gln(xr, backend="torch"), [xr], gy.double())
    assert_rel(got, want, 1e-5, "gln dx")


def test_per_channel_global_tiles_are_larger():
    """instln's "b c t" tiles wait for no look-back, so they are larger (their setup is paid per tile), and
    they still give the reference with several channel blocks and tiles per sequence."""
    ct = launch.choose_tiles
    assert ct(512, 16000, True, False, None, launch.GLOBAL) == (8, 256, 4)
    assert ct(512, 16000, True, False, None, launch.CUMULATIVE) == (4, 128, 4)
    assert ct(512, 16000, True, True, None, launch.GLOBAL) == ct(512, 16000, True, True, None, launch.FRAME) == (32, 64, 4)
    assert ct(512, 16000, True, True, None) == (128, 8, 1)  # running modes walk segments (strip_for), each lane
    assert ct(512, 16000, True, True, None, launch.EMA, 2) == (256, 4, 1)  # holding 16 bytes of channels
    x = make_x(2, 19, 600)
    check_output(tri("instln", dev(x)), dev(x), ref("instln", x), F32, "instln")


def test_frame_rows_are_128_bytes_in_any_dtype():
    """FRAME's pooled "b c t" tiles read 128-byte rows: 32 frames of fp32, 64 of bf16 (a 16-bit tile of 32
    frames half-filled its cache lines); "b t c" rows are channels, long enough already. The forward's tiles
    span more channels than the backward's."""
    ct = launch.choose_tiles
    assert ct(512, 16000, False, False, None, launch.FRAME, 4) == (128, 32, 4)
    assert ct(512, 16000, False, False, None, launch.FRAME, 2) == (128, 64, 4)
    assert ct(512, 16000, False, True, None, launch.FRAME, 2) == (128, 32, 4)
    # the forward's tiles hold 8192 values: 256 channels of fp32; the backward keeps 128
    fwd_bwd = lambda es: [launch.choose_launch(16, 512, 16000, False, False, launch.FRAME, 132, 1 << 29, es)[i]  # noqa: E731
                          for i in (0, 1, 5)]
    assert fwd_bwd(4) == [256, 32, 128] and fwd_bwd(2) == [128, 64, 128]
    x = make_x(2, 7, 150).to(F16)
    with tile_size(block_c=4):
        check_output(tri("frameln", dev(x)), dev(x), ref("frameln", x), F16, "frameln fp16")


def test_pooled_channels_last_tiles_are_longer_on_short_sequences():
    """Pooled "b t c" running and GLOBAL tiles span 128 frames up to 512, 64 up to 4096, then 32; FRAME's
    stay at 32. Default tiles of 128 frames, several per sequence, give the reference and its gradient."""
    frames = lambda T, mode=launch.CUMULATIVE: launch.choose_tiles(512, T, False, True, None, mode)[1]  # noqa: E731
    assert [frames(T) for T in (301, 512, 513, 4096, 4097, 16000)] == [128, 128, 64, 64, 32, 32]
    assert frames(500, launch.GLOBAL) == frames(500, launch.EMA) == 128 and frames(500, launch.FRAME) == 32
    assert launch.choose_tiles(512, 500, False, False, None)[1] == 64  # "b c t" keeps its rows
    x, gy = make_x(2, 5, 300, "b t c", offset=1.0), make_x(2, 5, 300, "b t c")
    assert launch.tiles_for(dev(x).transpose(1, 2), False, 1.0)[1] == 128
    for name in ("cln", "gln", "emaln"):
        check_output(tri(name, dev(x), layout="b t c"), dev(x), ref(name, x, layout="b t c"), F32, name)
        xg, xr = dev(x).requires_grad_(), x.double().requires_grad_()
        (got,) = torch.autograd.grad(tri(name, xg, layout="b t c"), [xg], dev(gy))
        (want,) = torch.autograd.grad(ref(name, xr, layout="b t c"), [xr], gy.double())
        assert_rel(got, want, 1e-5, name + " dx")


def test_pooled_lookback_forward_reads_its_first_chunk_again_when_its_tiles_fit_l2():
    """The forward's hold flag (index 4), from the bytes of the tiles in flight on 132 SMs; no pooled backward
    tile holds (index 7) but a strip's; FRAME's pooled tiles hold only in a "b c t" forward of one wave
    (nothing to hold through: held, the backward spilled); per-channel tiles and GLOBAL's forward tiles
    always hold, so that they compile one kernel."""
    def hold(B, C, T, last, es, pc=False, mode=launch.CUMULATIVE):
        f = launch.choose_launch(B, C, T, pc, last, mode, 132, B * C * T * es, es)
        return f[4], f[7]
    assert hold(16, 512, 16000, False, 4) == (True, False)  # 69 MB in flight
    assert hold(16, 512, 16000, False, 2) == (False, False)  # 35 MB
    assert hold(16, 512, 16000, True, 4) == (True, False)  # 43 MB
    assert hold(16, 512, 16000, True, 2) == (True, False)  # 22 MB: 16-bit "b t c" holds from 18 MB
    assert hold(4, 512, 4000, True, 2) == (False, False)  # 17 MB
    assert hold(1, 128, 256000, False, 4) == (False, False)  # 17 MB
    assert hold(4, 256, 16000, True, 4, mode=launch.EMA) == (False, False)  # 22 MB
    assert hold(16, 256, 16000, False, 4) == (True, False)  # 35 MB: fp32 holds, 16-bit reads again
    for kw in (dict(pc=True), dict(pc=True, mode=launch.FRAME)):
        assert hold(1, 128, 256000, False, 4, **kw) == (True, True), kw
    for last, es in ((False, 4), (True, 2)):  # GLOBAL: the forward holds, the backward reads again
        assert hold(16, 512, 16000, last, es, mode=launch.GLOBAL) == (True, False)
    assert hold(256, 64, 300, False, 4, mode=launch.GLOBAL) == (True, True)  # strips (x read twice from L2)
    for last, es in ((False, 4), (True, 2)):
        assert hold(16, 512, 16000, last, es, mode=launch.FRAME) == (False, False)
    # FRAME "b c t" holds where its tiles run in one wave and take more than hold_for's bytes (33 MB in fp32)
    assert hold(4, 512, 4000, False, 4, mode=launch.FRAME) == (True, False)
    assert hold(8, 512, 2000, False, 4, mode=launch.FRAME) == (True, False)
    assert hold(4, 512, 4000, False, 2, mode=launch.FRAME) == (False, False)  # 16 MB
    assert hold(4, 512, 4000, True, 4, mode=launch.FRAME) == (False, False)  # "b t c"
    assert hold(2, 256, 6400, False, 4, mode=launch.FRAME) == (False, False)  # 13 MB
    assert hold(16, 256, 2000, False, 4, mode=launch.FRAME) == (False, False)  # 1008 tiles: two waves
    assert hold(600, 64, 300, False, 4) == (True, True)  # a strip walk


def test_look_back_window_covers_one_sequences_tiles_in_flight():
    """Few pooled sequences: a tile's in-flight predecessors are many, so the window widens (to 128) and one
    poll reaches a published prefix; many sequences keep the polls small. Per-channel windows stay at 4
    (measured faster). A 256-record window over a short sequence still gives the reference."""
    w = launch.window_for
    assert [w(False, n, 132) for n in (1, 2, 4, 16, 1000)] == [128, 128, 128, 32, 32]
    assert [w(True, n, 132) for n in (1, 32, 128, 1000)] == [4, 4, 4, 4]
    x = make_x(1, 5, 40)
    with tile_size(block_t=4, window=256):
        for name in ("cln", "emaln"):
            check_output(tri(name, dev(x)), dev(x), ref(name, x), F32, name)


def test_launch_choices_follow_the_launchers_names_when_they_change(monkeypatch):
    """tiles_for caches its choices by input; assigning a name of the launcher (a threshold, a helper, as an A/B
    run or a test does) drops them, so the next call chooses again. Here the SM count sets one sequence's
    look-back window: 32 records on 4 SMs, 128 on 132."""
    x = dev(make_x(1, 8, 50))
    monkeypatch.setattr(launch, "_num_sms", lambda device: 4)
    assert launch.tiles_for(x, False, 1.0)[3] == launch.tiles_for(x, False, 1.0)[3] == 32
    monkeypatch.setattr(launch, "_num_sms", lambda device: 132)
    assert launch.tiles_for(x, False, 1.0)[3] == 128


@pytest.mark.parametrize("name", ["cln", "ccln", "gln", "instln", "frameln"])
def test_more_programs_than_a_grid_holds_are_refused_before_launch(name, monkeypatch):
    """A CUDA grid holds 2^31 - 1 programs: an input needing more (2^31 sequences of a few values) gets an
    error naming the limit and the way out, not a failed launch. The limit is lowered here to 3."""
    monkeypatch.setattr(launch, "MAX_PROGRAMS", 3)
    monkeypatch.setattr(launch, "running_norm_fwd", None)  # nothing may launch
    with tile_size(block_t=4, strip=False), pytest.raises(ValueError, match=r"2\^31 - 1.*backend='torch'"):
        tri(name, dev(make_x(2, 3, 9)))


@pytest.mark.parametrize("name, case", [(n, c) for n in NORMS for c in ("nan-x", "inf-x", "nan-state")
                                         if c != "nan-state" or SPECS[n].causal])
def test_nan_and_inf_reach_the_output_as_on_the_torch_backend(name, case):
    """A NaN or an infinity in x, or a NaN in the incoming state, makes the statistics it enters NaN on both
    backends: the same outputs, states and gradients are non-finite, and the rest agree (frameln reads no
    state's statistics). A max that drops NaN, as PTX's does, gave a variance of 0: finite garbage, and a
    state's M2 of 0."""
    spec = SPECS[name]
    x = make_x(2, 4, 11)
    x[0, 1, 3] = float("nan") if case == "nan-x" else x[0, 1, 3]
    x[1, 2, 5] = float("inf") if case == "inf-x" else x[1, 2, 5]
    kw = dict(return_state=True) if spec.causal else {}
    if case == "nan-state":
        shp = state_shape(name, 2, 4)
        kw["state"] = normlib.NormState(torch.full(shp, 4.0, dtype=SD), torch.zeros(shp, dtype=SD),
                                        torch.full(shp, float("nan"), dtype=SD))
    gy, affine = make_x(2, 4, 11), make_affine(4, F32)
    got = {}
    for backend in ("torch", "triton"):
        xb, w, b = (dev(t).clone().requires_grad_() for t in (x, *affine))
        with tile_size(block_t=4):
            out = getattr(normlib.functional, name)(xb, w, b, backend=backend,
                                                    **{k: v.to(DEVICE) if k == "state" else v for k, v in kw.items()})
            y, st = out if spec.causal else (out, None)
            (y * dev(gy)).sum().backward()
        got[backend] = [y.detach(), xb.grad, w.grad, b.grad] + (list(st) if st is not None else [])
    for a, b in zip(got["torch"], got["triton"]):
        a, b = a.cpu().double(), b.cpu().double()
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        assert torch.isfinite(got["torch"][0]).all() == (name == "frameln" and case == "nan-state")
        fin = torch.isfinite(a)
        torch.testing.assert_close(b[fin], a[fin], rtol=1e-4, atol=1e-4)


EDGE_SHAPES = [
    pytest.param((1, 1, 1), id="B1-C1-T1"),
    pytest.param((2, 1, 17), id="B2-C1-T17"),
    pytest.param((2, 5, 1), id="B2-C5-T1"),
    pytest.param((1, 3, 8), id="B1-C3-T8-one-full-tile"),
    pytest.param((1, 3, 9), id="B1-C3-T9-one-frame-over"),
]


@pytest.mark.parametrize("shape", EDGE_SHAPES)
@pytest.mark.parametrize("name", NORMS)
def test_edge_shapes(name, shape):
    B, C, T = shape
    x = make_x(B, C, T, offset=0.5)
    w, b = make_affine(C, F32)
    kw = dict(return_state=True) if SPECS[name].causal else {}
    with tile_size(block_t=8, window=2):
        out = tri(name, dev(x), dev(w), dev(b), eps_mode="outside", **kw)
    expected = ref(name, x, w, b, eps_mode="outside", **kw)
    y, y_ref = (out[0], expected[0]) if kw else (out, expected)
    check_output(y, dev(x), y_ref, F32, "y")
    if kw:
        assert_state_close(out[1], expected[1], STATE_TOL)


@pytest.mark.parametrize("name", CAUSAL)
def test_empty_time_hands_the_state_through(name):
    """T = 0: no kernel runs, the output is empty and the outgoing state is the incoming one."""
    x = dev(torch.zeros(2, 5, 0))
    state = make_state(name, 2, 5, SD)
    y, s = tri(name, x, state=dev_state(state), return_state=True)
    assert y.shape == (2, 5, 0)
    for got, given in zip(s, state):
        assert torch.equal(got.cpu(), given)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", NORMS)
def test_empty_batch(name, layout):
    """B = 0: an empty output and an empty gradient, as the PyTorch backend gives (the launcher once divided
    by the number of sequences)."""
    shape = (0, 5, 20) if layout == "b c t" else (0, 20, 5)
    x = dev(torch.zeros(shape)).requires_grad_()
    y = tri(name, x, layout=layout)
    want = getattr(normlib.functional, name)(x.detach().cpu(), None, None, 1e-8, backend="torch", layout=layout)
    assert y.shape == want.shape == shape
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert gx.shape == shape


@pytest.mark.parametrize("view", ["time-strided", "bct-channels-last", "btc-time-major"])
@pytest.mark.parametrize("name", ["cln", "ccln", "gln"])
def test_non_contiguous_inputs(name, view):
    """Strides are read in place: a time-strided slice, and the two layouts in the other memory order."""
    B, C, T = 2, 5, 21
    if view == "time-strided":
        layout, x = "b c t", make_x(B, C, 2 * T)[..., ::2]
    elif view == "bct-channels-last":
        layout, x = "b c t", make_x(B, C, T, "b t c").transpose(1, 2)
    else:
        layout, x = "b t c", make_x(B, C, T, "b c t").transpose(1, 2)
    assert not x.is_contiguous()
    with tile_size(block_t=8, window=2, block_c=4):
        y = tri(name, dev(x), layout=layout)
    check_output(y, dev(x), ref(name, x, layout=layout), F32, view)


# ---------------------------------------------------------------------------------------------------
# The look-back's bookkeeping: stale and garbage records, the ticket counter, repeatability
# ---------------------------------------------------------------------------------------------------
def _lookback_buffers():
    """The look-back records and the ticket counter the launcher keeps for the current stream (after a
    look-back launch)."""
    device = dev(torch.empty(0)).device  # "cuda:0", as the launcher sees it, not "cuda"
    key = (device, launch._stream_key(device))
    ws, ctr = launch._WORKSPACES.get(key), launch._WORKSPACES.get(key + ("ctr",))
    assert ws is not None and ctr is not None, "no look-back workspace found in launch._WORKSPACES"
    return ws, ctr


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
def test_sequences_past_int32_frame_indices_are_refused(layout):
    """Frame indices are int32 in the kernels: T near 2^31 wrapped them negative, past the masks (reads and
    writes before x's start). An expanded x of 2^31 frames costs no memory."""
    shape = (1, 1, 2**31) if layout == "b c t" else (1, 2**31, 1)
    x = dev(torch.zeros(1, dtype=torch.float16)).expand(*shape)
    with pytest.raises(ValueError, match=r"fewer than 2\^31 - 2\^12 frames, got T=2147483648"):
        tri("cln", x, layout=layout)


def test_launches_go_to_the_device_of_x(monkeypatch):
    """Triton launches on the current CUDA device: with x on another one (a model split over GPUs) the
    launcher makes x's device current for the launch, and otherwise adds nothing. Faked devices: the CPU
    has none."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    guard = launch._device_guard(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    for same in (torch.device("cuda", 0), torch.device("cpu")):
        assert launch._device_guard(same) is None


def test_each_stream_has_its_own_look_back_workspace(monkeypatch, deterministic):
    """Launches on two CUDA streams may run at once: they must not share the look-back's records or its
    ticket counter (they did: one per device). Streams are faked here, as the CPU has none."""
    x = make_x(2, 5, 29)
    with tile_size(block_t=4, window=2):
        want = tri("cln", dev(x))
        seen = {}
        for stream in (101, 202, 101):
            monkeypatch.setattr(launch, "_stream_key", lambda device, s=stream: s)
            seen.setdefault(stream, []).append(launch._workspace(dev(x).device, 64))
            assert torch.equal(tri("cln", dev(x)), want)
    (ws1, ctr1), (ws1b, ctr1b) = seen[101]
    ((ws2, ctr2),) = seen[202]
    assert ws1 is ws1b and ctr1 is ctr1b  # one stream keeps its own
    assert ws1.data_ptr() != ws2.data_ptr() and ctr1.data_ptr() != ctr2.data_ptr()


@pytest.mark.parametrize("name, tiles", [("ccln", dict(block_t=4, block_c=2, strip=2, span=3, window=2)),
                                         ("gln", dict(block_t=4, strip=False, span=2))])
def test_span_records_are_kept_per_stream_and_written_before_read(name, tiles):
    """SEG and GLOBAL's two launches keep their span records per stream, as the look-back keeps its records: no
    allocation a call. Every record a call reads is one it wrote: poisoned_buffers fills them with NaN before
    each call, so a read of an earlier call's record (right values, from the same shape) fails here."""
    x = make_x(2, 5, 37, offset=2.0)
    xg = dev(x).clone().requires_grad_()
    key = (xg.device, launch._stream_key(xg.device), "span")
    with tile_size(**tiles):
        outs, kept = [], []
        for _ in range(2):
            y = tri(name, xg)
            (gx,) = torch.autograd.grad((y * dev(x).cos()).sum(), xg)
            outs.append((y, gx))
            kept.append(launch._WORKSPACES.get(key))
    assert kept[0] is not None and kept[1] is kept[0], "the span records must be kept between calls"
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    xr = x.double().requires_grad_()
    y_ref = ref(name, xr)
    check_output(outs[1][0], dev(x), y_ref.detach(), F32, "y")
    (gx_ref,) = torch.autograd.grad((y_ref * x.double().cos()).sum(), xr)
    assert_rel(outs[1][1], gx_ref, 1e-4, "dx")


@pytest.mark.parametrize("name", ["cln", "ccemaln"])
def test_garbage_in_the_workspace_is_ignored(name):
    """Records of random garbage left in the workspace are not read as this launch's. The interpreter runs
    programs one at a time in ticket order, so there no tile meets a record before its predecessor has
    rewritten it: this checks that the tags and epochs let a launch finish with the reference's output; the
    race they guard against needs a GPU."""
    x = make_x(1, 5, 29)
    with tile_size(block_t=4, window=2, walk=True):
        tri(name, dev(x))  # grow the workspace to this launch's size
        ws, ctr = _lookback_buffers()
        ws.random_(0, 1 << 62)  # random tags (a match with this launch's tag is a 2**-30 chance)
        y = tri(name, dev(x))
    check_output(y, dev(x), ref(name, x), F32, "y")
    assert int(ctr) & 0xFFFFFFFF == 0, "every launch must consume its tickets and reset the ticket count"


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
@pytest.mark.parametrize("name, T, span, window", [("gln", 45, 3, None), ("instln", 45, 3, None),
                                                   ("gln", 150, 1, 64)])
def test_global_in_one_launch_reads_only_its_own_spans(name, T, span, window, layout, monkeypatch):
    """GLOBAL's one launch: its first programs publish a summary per span into the look-back's records, tagged,
    and the tiles wait for their sequence's (both passes), up to a window of them (38 spans: more than span_scan's
    32, as gln's one-tile spans on a GPU). Records of random garbage left there are not read as this launch's,
    every launch resets the ticket count, and y and dx are the reference's and those of the two launches. (The
    interpreter runs programs in ticket order, so no tile waits here; the GPU runs the race.)"""
    x = make_x(2, 6, T, layout, offset=3.0)
    gy = torch.randn_like(x)
    outs = {}
    phases = []
    real = launch._Step.__call__

    def spy(step, *args):
        phases.append(step.kw.get("PHASE"))
        return real(step, *args)

    monkeypatch.setattr(launch._Step, "__call__", spy)
    for launches in (2, 1):
        phases.clear()
        with tile_size(block_t=4, block_c=4, span=span, window=window, strip=False, global_launches=launches):
            if launches == 1:
                tri(name, dev(x), layout=layout)  # grow the workspace to this launch's size
                ws, ctr = _lookback_buffers()
                ws.random_(0, 1 << 62)
            xg = dev(x).clone().requires_grad_()
            y = tri(name, xg, layout=layout)
            (gx,) = torch.autograd.grad(y, xg, dev(gy))
        outs[launches] = y, gx
        assert phases[-2:] == [3, 3] if launches == 1 else 3 not in phases, phases
    assert int(ctr) & 0xFFFFFFFF == 0, "every launch must consume its tickets and reset the ticket count"
    xr = x.double().requires_grad_()
    y_ref = ref(name, xr, layout=layout)
    (gx_ref,) = torch.autograd.grad(y_ref, xr, gy.double())
    check_output(outs[1][0], dev(x), y_ref.detach(), F32, "y")
    assert_rel(outs[1][1], gx_ref, 1e-5, "dx")
    assert torch.allclose(outs[1][0], outs[2][0], rtol=0, atol=1e-6)
    assert torch.allclose(outs[1][1], outs[2][1], rtol=0, atol=1e-6)


def test_stale_records_of_an_earlier_launch_are_not_read():
    """Same shape twice with different data: the second launch must see only its own records. The
    interpreter runs programs one at a time in ticket order, so there no tile meets a record before its
    predecessor has rewritten it: this checks that the tags and epochs let a launch finish with the
    reference's output; the race they guard against needs a GPU."""
    x1, x2 = make_x(1, 5, 37, offset=50.0), make_x(1, 5, 37, offset=-3.0)
    with tile_size(block_t=4, window=2):
        tri("cln", dev(x1))
        y2 = tri("cln", dev(x2))
    check_output(y2, dev(x2), ref("cln", x2), F32, "second launch")


def test_ticket_epoch_wraps():
    """The tag lives in 30 bits of the counter's upper word; crossing the wrap must not break the scan.
    The interpreter runs programs one at a time in ticket order, so there no tile meets a record before its
    predecessor has rewritten it: this checks that the tags and epochs let a launch finish with the
    reference's output; the race they guard against needs a GPU."""
    x = make_x(1, 5, 37)
    tri("cln", dev(x))
    _, ctr = _lookback_buffers()
    saved = ctr.clone()
    try:
        ctr.fill_(((1 << 30) - 2) << 32)  # two launches before the tag wraps
        with tile_size(block_t=8, window=2, walk=True):
            for _ in range(3):
                check_output(tri("cln", dev(x)), dev(x), ref("cln", x), F32, f"epoch {int(ctr) >> 32}")
    finally:
        ctr.copy_(saved)


@pytest.mark.parametrize("name", ["emaln", "ccln", "instln"])
def test_repeatable(name):
    """The same launch twice. On a GPU a tile takes its prefix from whichever predecessors have published
    by then, so the rounding (not the result) may differ from run to run; the interpreter runs programs in
    order, so there it is bitwise the same."""
    x = dev(make_x(1, 5, 37))
    with tile_size(block_t=8, window=2, block_c=4, span=2):
        a, b = tri(name, x), tri(name, x)
    if x.is_cuda:
        assert_rel(a, b, 1e-6, "run to run")
    else:
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------
# Regressions: zero variance with eps = 0, empty states under DC offsets, block_c on pooled norms
# ---------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy: divide by zero
@pytest.mark.parametrize("name", ["cln", "frameln", "gln"])
def test_zero_variance_with_eps_0_outside_gives_0(name):
    x = make_x(2, 1, 9) if name == "cln" else torch.ones(2, 4, 9)  # cln over one channel: frame 0 has var 0
    y = tri(name, dev(x), eps=0.0, eps_mode="outside")
    expected = ref(name, x, eps=0.0, eps_mode="outside")
    assert not torch.isnan(y).any()
    assert_rel(y, expected, TOL[F32], name)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", NORMS)
def test_no_channels_give_an_empty_y_and_pass_the_state_through(name, backend):
    """C = 0: no value is seen, so y is empty (and on x's graph) and the returned state is the incoming one,
    or the empty one. The PyTorch backend once gave NaN pooled states and raised IndexError in frameln."""
    to = dev if backend == "triton" else (lambda t: t)
    x = to(torch.randn(2, 0, 5)).requires_grad_()
    kw = dict(backend=backend)
    if not SPECS[name].causal:
        y = getattr(normlib.functional, name)(x, **kw)
    else:
        shape = state_shape(name, 2, 0)
        incoming = normlib.NormState(*(to(torch.full(shape, v, dtype=SD)) for v in (3.0, 0.5, 2.0)))
        for state, want in ((None, normlib.NormState.empty(shape, SD)), (incoming, incoming)):
            y, s = getattr(normlib.functional, name)(x, state=state, return_state=True, **kw)
            for got, exp in zip(s, want):
                assert got.dtype == SD and torch.equal(got.cpu(), exp.cpu()), (name, state is None, s)
        # the state passed through, so its gradient does too (the Triton backward once dropped it at C = 0)
        m, m2 = (to(torch.tensor(v, dtype=SD)).expand(shape).clone().requires_grad_() for v in (0.5, 2.0))
        _, s = getattr(normlib.functional, name)(x, state=normlib.NormState(incoming.w, m, m2),
                                                 return_state=True, **kw)
        gm, gm2 = torch.autograd.grad((s.m * 3).sum() + s.m2.sum(), (m, m2))
        assert torch.equal(gm.cpu(), torch.full(shape, 3.0, dtype=SD)) and torch.equal(gm2.cpu(), torch.ones(shape, dtype=SD))
    assert y.shape == x.shape
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert gx.shape == x.shape


@pytest.mark.parametrize("name", ["cln", "ccln"])
def test_an_empty_state_is_no_state_under_a_dc_offset(name):
    B, C, T = 2, 5, 37
    x = make_x(B, C, T, offset=1e4)
    empty = normlib.NormState.empty((B, C) if SPECS[name].per_channel else (B,), SD)
    with tile_size(block_t=8, window=2):
        y_empty = tri(name, dev(x), state=dev_state(empty))
        y_none = tri(name, dev(x))
    assert_rel(y_none, ref(name, x), TOL[F32], "no state")
    assert_rel(y_empty, ref(name, x, state=empty), TOL[F32], "empty state")


def test_block_c_on_a_pooled_norm_is_ignored_or_refused():
    x = make_x(2, 5, 21)
    try:
        with tile_size(block_t=8, block_c=2):
            y = tri("cln", dev(x))
    except ValueError:
        return
    check_output(y, dev(x), ref("cln", x), F32, "cln with block_c=2 < C=5")
