"""Streaming: NormState (save, move, detach, merge) and chunked runs that thread the state, compared with
one run over the whole sequence (outputs, final state and gradients, for truncated BPTT)."""
import io
import random

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import normlib
from normlib import NormState, merge
from normlib.backends import cpu, pytorch
from conftest import (CAUSAL, DC_OFFSET_TOL, EMA, LAYOUTS, RUNNING, SPECS, TOL, assert_rel, assert_state_close,
                      examples, make_affine, make_state, make_x, ref, rel_err, run, state_shape, stats_dtype,
                      time_dim, STATE_DTYPE)

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16


def _layout_id(layout):
    return layout.replace(" ", "")


def random_split(T, seed):
    """Random chunk sizes summing to T, with plenty of size-1 chunks."""
    rng = random.Random(seed)
    sizes = []
    while sum(sizes) < T:
        sizes.append(min(rng.choice([1, 1, 1, 2, 3, 4, 7, 11]), T - sum(sizes)))
    return sizes


SPLITS = {
    "whole": lambda T: [T],
    "ones": lambda T: [1] * T,
    "halves": lambda T: [T // 2, T - T // 2],
    "random0": lambda T: random_split(T, 0),
    "random1": lambda T: random_split(T, 1),
    "random2": lambda T: random_split(T, 2),
}


def run_chunked(name, x, sizes, layout="b c t", state=None, **kw):
    """Run chunk by chunk, threading the state (not detached). Returns (y, final state)."""
    ys = []
    for chunk in x.split(sizes, dim=time_dim(layout)):
        y, state = run(name, chunk, layout=layout, state=state, return_state=True, **kw)
        ys.append(y)
    return torch.cat(ys, dim=time_dim(layout)), state


def _kw(name, decay=0.9):
    return {"decay": decay} if name in EMA else {}


# ---------------------------------------------------------------------------------------------------
# Chunked == whole
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", CAUSAL)
def test_chunked_equals_whole(name, layout, split, with_state, dtype):
    B, C, T = 3, 5, 23
    x = make_x(B, C, T, layout, dtype, offset=0.7)
    w, b = make_affine(C, dtype)
    state = make_state(name, B, C) if with_state else None
    kw = dict(layout=layout, **_kw(name))
    y_whole, s_whole = run(name, x, w, b, state=state, return_state=True, **kw)
    y, s = run_chunked(name, x, SPLITS[split](T), layout, state, weight=w, bias=b, **_kw(name))
    tol = 1e-12 if dtype == F64 else TOL[dtype] / 5
    assert y.shape == x.shape and y.dtype == dtype
    assert_rel(y, y_whole, tol, "chunked y vs whole")
    assert_state_close(s, s_whole, tol, "chunked final state vs whole")
    # and both against the oracle
    y_r, s_r = ref(name, x, w, b, state=state, return_state=True, **kw)
    assert_rel(y, y_r, TOL[dtype], "chunked y vs reference")
    assert_state_close(s, s_r, TOL[stats_dtype(dtype)], "chunked state vs reference")


@st.composite
def stream_cases(draw):
    name = draw(st.sampled_from(CAUSAL))
    T = draw(st.integers(1, 40))
    sizes = []
    while sum(sizes) < T:
        sizes.append(min(draw(st.integers(1, 12)), T - sum(sizes)))
    return dict(name=name, B=draw(st.integers(1, 3)), C=draw(st.integers(1, 9)), T=T, sizes=sizes,
                layout=draw(st.sampled_from(LAYOUTS)), dtype=draw(st.sampled_from([F64, F32, F16, BF16])),
                decay=draw(st.sampled_from([1.0] if SPECS[name].per_channel else [0.0, 1.0]) | st.floats(0.1, 1.0)),
                with_state=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))


@hsettings(max_examples=examples(1.5))
@given(c=stream_cases())
def test_random_chunks_match_reference(c):
    g = torch.Generator().manual_seed(c["seed"])
    name, B, C, T, dtype, layout = c["name"], c["B"], c["C"], c["T"], c["dtype"], c["layout"]
    x = make_x(B, C, T, layout, dtype, generator=g)
    w, b = make_affine(C, dtype, g)
    state = make_state(name, B, C, generator=g) if c["with_state"] else None
    kw = _kw(name, c["decay"])
    y, s = run_chunked(name, x, c["sizes"], layout, state, weight=w, bias=b, **kw)
    y_r, s_r = ref(name, x, w, b, layout=layout, state=state, return_state=True, **kw)
    assert y.dtype == dtype and y.shape == x.shape
    assert all(t.dtype == STATE_DTYPE for t in s)
    assert_rel(y, y_r, TOL[dtype], f"{name} chunks {c['sizes']}", float(y_r.numel()) ** 0.5)
    assert_state_close(s, s_r, TOL[stats_dtype(dtype)], floor=True)


@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", CAUSAL)
def test_chunked_gradients_equal_whole(name, layout):
    """Truncated BPTT with the state not detached: gradients through a chunked run equal the whole run's,
    for x, weight, bias and the initial state (the loss also reads the final state)."""
    B, C, T = 2, 4, 13
    sizes = [1, 4, 1, 2, 5]
    x = make_x(B, C, T, layout, F64)
    w, b = make_affine(C, F64)
    s0 = make_state(name, B, C, F64)
    g = torch.randn(x.shape, dtype=F64)
    gs = [torch.randn(state_shape(name, B, C), dtype=F64) for _ in range(3)]

    def grads(chunked):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w, b, *s0)]
        xx, ww, bb, *st0 = leaves
        if chunked:
            y, s = run_chunked(name, xx, sizes, layout, NormState(*st0), weight=ww, bias=bb, **_kw(name))
        else:
            y, s = run(name, xx, ww, bb, layout=layout, state=NormState(*st0), return_state=True, **_kw(name))
        loss = (y * g).sum() + sum((f * gf).sum() for f, gf in zip(s, gs))
        return torch.autograd.grad(loss, leaves, allow_unused=True)

    for what, a, e in zip(["x", "weight", "bias", "state.w", "state.m", "state.m2"], grads(True), grads(False)):
        a = torch.zeros(1) if a is None else a
        e = torch.zeros(1) if e is None else e
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-11, msg=f"grad of {what}")


@pytest.mark.parametrize("name", RUNNING)
def test_detached_state_cuts_the_graph(name):
    """state.detach() between chunks: the second chunk's loss no longer reaches the first chunk's input."""
    x = make_x(2, 3, 10, dtype=F64).requires_grad_()
    _, s = run(name, x[..., :6], return_state=True)
    y2 = run(name, x[..., 6:], state=s.detach())
    y2.sum().backward()
    assert torch.equal(x.grad[..., :6], torch.zeros(2, 3, 6, dtype=F64))
    x.grad = None
    y2 = run(name, x[..., 6:], state=s)
    (y2 * torch.randn_like(y2)).sum().backward()
    assert x.grad[..., :6].abs().sum() > 0


@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", CAUSAL)
def test_streaming_last_chunk_with_lengths(name, layout):
    """A sequence that ends inside the last chunk: lengths on that chunk give the truncated sequence's state."""
    B, C, T = 3, 4, 20
    x = make_x(B, C, T, layout, F64)
    lengths_total = torch.tensor([20, 15, 12])
    y_whole, s_whole = run(name, x, layout=layout, lengths=lengths_total, return_state=True)
    td = time_dim(layout)
    first, last = x.split([12, 8], dim=td)
    y1, s1 = run(name, first, layout=layout, return_state=True)
    y2, s2 = run(name, last, layout=layout, state=s1, lengths=lengths_total - 12, return_state=True)
    torch.testing.assert_close(torch.cat([y1, y2], td), y_whole, rtol=1e-12, atol=1e-12)
    for a, e in zip(s2, s_whole):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    assert all(torch.equal(a[2], e[2]) for a, e in zip(s2, s1))  # lengths 0 in the last chunk: unchanged


@pytest.mark.parametrize("name", CAUSAL)
def test_zero_length_chunk_returns_the_incoming_state(name):
    """A chunk of T = 0 frames (what a streaming loop may hand over at a boundary) is a no-op."""
    B, C = 2, 3
    state = make_state(name, B, C)
    y, s = run(name, torch.randn(B, C, 0), state=state, return_state=True)
    assert y.shape == (B, C, 0)
    assert all(torch.equal(a, e) for a, e in zip(s, state))


@pytest.mark.parametrize("offset", sorted(DC_OFFSET_TOL), ids=lambda o: f"offset{o:g}")
@pytest.mark.parametrize("name", CAUSAL)
def test_empty_state_equals_no_state(name, offset):
    """An empty incoming state (weight 0: what a stream starts from) is the same as none, to within fp32
    rounding, also on an fp32 input with a DC offset (it is the same computation in exact arithmetic)."""
    B, C, T = 2, 8, 30
    x = make_x(B, C, T, offset=offset)
    empty = NormState.empty(state_shape(name, B, C))
    y, s = run(name, x, state=empty, return_state=True)
    y_none, s_none = run(name, x, return_state=True)
    err = rel_err(y, y_none)
    assert err <= TOL[F32], f"{name}: empty state vs none, offset {offset:g}: relative error {err:.2e}"
    assert_state_close(s, s_none, TOL[F32])


@pytest.mark.parametrize("offset", sorted(DC_OFFSET_TOL), ids=lambda o: f"offset{o:g}")
@pytest.mark.parametrize("norm", [("frameln", None), ("emaln", 0.0)], ids=["frameln", "emaln-decay0"])
def test_frame_mode_ignores_the_state(norm, offset):
    """FRAME (decay 0) ignores the incoming state: the output is that of no state, to within fp32 rounding,
    also with a DC offset."""
    name, decay = norm
    B, C, T = 2, 8, 30
    x = make_x(B, C, T, offset=offset)
    kw = {} if decay is None else {"decay": decay}
    y_none = run(name, x, **kw)
    err = rel_err(run(name, x, state=make_state(name, B, C), **kw), y_none)
    assert err <= TOL[F32], f"{name}: a state changed the output, offset {offset:g}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", RUNNING)
def test_low_precision_streaming_keeps_float64_state(name, dtype):
    B, C, T = 2, 6, 16
    x = make_x(B, C, T, dtype=dtype)
    y, s = run_chunked(name, x, [5, 1, 10])
    assert y.dtype == dtype and all(t.dtype == STATE_DTYPE for t in s)
    assert_rel(y, run(name, x), TOL[dtype], "chunked vs whole")


@pytest.mark.parametrize("name", RUNNING)
def test_one_frame_chunks_are_as_accurate_as_one_call(name):
    """Each call merges the incoming state with its chunk's own summary in float64: a float32 merge rounded the
    state once a call, which an EMA keeps for about 1 / (1 - d) calls (here 4x the error of one call)."""
    g = torch.Generator().manual_seed(0)
    x = make_x(2, 4, 800, generator=g, scale=2.0, offset=5.0)
    kw = _kw(name, 0.998)
    y_r = ref(name, x, **kw)
    y, _ = run_chunked(name, x, [1] * 800, **kw)
    assert rel_err(y, y_r) <= 1.5 * rel_err(run(name, x, **kw), y_r)


@pytest.mark.parametrize("T", [1, 12])
@pytest.mark.parametrize("name", RUNNING)
def test_the_outgoing_state_after_a_heavy_one_is_float64_exact(name, T):
    """One call's returned state, after an incoming state of a million frames' weight: float64 to 1e-10 (a
    float32 merge rounded it by 2^-24)."""
    x = make_x(2, 3, T, offset=5.0, scale=2.0)
    s0 = make_state(name, 2, 3)
    s0 = NormState(s0.w * 1e6, s0.m, s0.m2 * 1e6)
    _, s = run(name, x, state=s0, return_state=True, **_kw(name, 0.999))
    _, s_ref = ref(name, x, state=s0, return_state=True, **_kw(name, 0.999))
    assert_state_close(s, s_ref, 1e-10)


@pytest.mark.parametrize("name", CAUSAL)
def test_module_streaming(name):
    layer = normlib.create(name, 6, layout="b t c", backend="torch")
    x = make_x(2, 6, 17, "b t c")
    state, ys = None, []
    for chunk in x.split([3, 1, 13], dim=1):
        y, state = layer(chunk, state=state, return_state=True)
        ys.append(y)
    y_whole, s_whole = layer(x, return_state=True)
    assert_rel(torch.cat(ys, 1), y_whole, TOL[F32] / 5, "module chunked")
    assert_state_close(state, s_whole, TOL[F32])


# ---------------------------------------------------------------------------------------------------
# NormState
# ---------------------------------------------------------------------------------------------------
def _random_state(shape, dtype=F64):
    w = 1 + 3 * torch.rand(shape, dtype=dtype)
    return NormState(w, torch.randn(shape, dtype=dtype), w * torch.rand(shape, dtype=dtype))


def _assert_states_equal(a, b):
    assert isinstance(a, NormState) and isinstance(b, NormState)
    for fa, fb in zip(a, b):
        assert torch.equal(fa, fb)


@pytest.mark.parametrize("shape", [(3,), (3, 5)], ids=["pooled", "per-channel"])
def test_state_save_load_roundtrip(shape):
    s = _random_state(shape, F32)
    buf = io.BytesIO()
    torch.save(s, buf)
    buf.seek(0)
    loaded = torch.load(buf)  # the default (weights_only=True) load must accept a NormState
    _assert_states_equal(loaded, s)
    buf = io.BytesIO()
    torch.save({"states": [s, s.map(lambda t: t + 1)], "step": 3}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    _assert_states_equal(loaded["states"][0], s)
    _assert_states_equal(loaded["states"][1], s.map(lambda t: t + 1))


def test_state_from_a_run_save_load_and_continue():
    x = make_x(2, 4, 12)
    _, s = run("cln", x[..., :5], return_state=True)
    buf = io.BytesIO()
    torch.save(s, buf)
    buf.seek(0)
    y2 = run("cln", x[..., 5:], state=torch.load(buf))
    assert torch.equal(y2, run("cln", x[..., 5:], state=s))


def test_state_to_detach_map_and_properties():
    s = _random_state((2, 3), F32)
    assert s.shape == (2, 3) and s.dtype == F32 and s.device == torch.device("cpu")
    s64 = s.to(F64)
    assert isinstance(s64, NormState) and all(t.dtype == F64 for t in s64)
    assert all(torch.equal(a.to(F32), b) for a, b in zip(s64, s))
    s_meta = s.to("meta")
    assert isinstance(s_meta, NormState) and s_meta.device.type == "meta"
    torch.testing.assert_close(s.var, s.m2 / s.w)
    assert torch.equal(NormState.empty((2,), F32).var, torch.zeros(2))  # empty: variance 0, not NaN
    req = s.map(lambda t: t.clone().requires_grad_())
    d = req.detach()
    assert isinstance(d, NormState) and not any(t.requires_grad for t in d)
    assert all(t.data_ptr() == u.data_ptr() for t, u in zip(d, req))  # detach shares storage
    sub = s.map(lambda t: t[1:])
    assert isinstance(sub, NormState) and sub.shape == (1, 3)


def test_state_empty():
    assert NormState.empty((4, 2)).dtype == STATE_DTYPE  # the default
    e = NormState.empty((4, 2), dtype=F64)
    assert e.shape == (4, 2) and e.dtype == F64
    assert all(torch.equal(t, torch.zeros(4, 2, dtype=F64)) for t in e)
    assert e.w.data_ptr() != e.m.data_ptr() != e.m2.data_ptr()  # independent tensors
    assert NormState.empty(3, device="meta").device.type == "meta"


@hsettings(max_examples=examples(0.5))
@given(La=st.integers(0, 6), Lb=st.integers(0, 6), Lc=st.integers(0, 6),
       d=st.sampled_from([0.0, 1.0]) | st.floats(0.05, 1.0), seed=st.integers(0, 2**31 - 1))
def test_merge_is_associative(La, Lb, Lc, d, seed):
    """Segments a, b, c of lengths La, Lb, Lc (a length-L segment carries decay d**L):
    merge(merge(a, b, d^Lb), c, d^Lc) == merge(a, merge(b, c, d^Lc), d^(Lb + Lc))."""
    torch.manual_seed(seed)
    a, b, c = (_random_state((4,)) if L else NormState.empty((4,), F64) for L in (La, Lb, Lc))
    left = merge(merge(a, b, d**Lb), c, d**Lc)
    right = merge(a, merge(b, c, d**Lc), d ** (Lb + Lc))
    for x, y in zip(left, right):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", CAUSAL)
def test_merge_of_segment_states_is_the_sequence_state(name):
    """state(A ++ B) == merge(state(A), state(B), d ** len(B)), with states from actual runs."""
    B, C, La, Lb = 2, 4, 7, 5
    x = make_x(B, C, La + Lb, dtype=F64, offset=1.0)
    d = {"frame": 0.0, "cumulative": 1.0, "ema": 0.8}[SPECS[name].time.value]
    _, s_ab = run(name, x, return_state=True, **_kw(name, 0.8))
    _, s_a = run(name, x[..., :La], return_state=True, **_kw(name, 0.8))
    _, s_b = run(name, x[..., La:], return_state=True, **_kw(name, 0.8))
    for a, e in zip(merge(s_a, s_b, d**Lb), s_ab):
        torch.testing.assert_close(a, e, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("d", [0.0, 0.5, 1.0])
def test_merge_empty_identity(d):
    s = _random_state((3, 2))
    e = NormState.empty((3, 2), F64)
    _assert_states_equal(merge(e, s, d), s)  # an empty past changes nothing, for any decay
    _assert_states_equal(merge(s, e, 1.0), s)  # an empty segment (length 0, decay d**0 = 1)
    decayed = merge(s, e, d)  # an empty segment seen as time passing: weights decay, mean stays
    torch.testing.assert_close(decayed.w, d * s.w)
    torch.testing.assert_close(decayed.m2, d * s.m2)
    assert torch.equal(decayed.m, s.m)


def test_merge_tensor_decay_broadcasts():
    a, b = _random_state((3, 4)), _random_state((3, 4))
    d = torch.tensor([0.0, 0.5, 1.0, 0.9], dtype=F64)
    out = merge(a, b, d)
    for j in range(4):
        ref_j = merge(a.map(lambda t: t[:, j]), b.map(lambda t: t[:, j]), float(d[j]))
        for x, y in zip(out, ref_j):
            torch.testing.assert_close(x[:, j], y, rtol=1e-14, atol=0)


def test_merge_formula():
    """Chan's update with the old state decayed, as DESIGN.md writes it."""
    a, b, d = _random_state((5,)), _random_state((5,)), 0.7
    out = merge(a, b, d)
    w = d * a.w + b.w
    delta = b.m - a.m
    torch.testing.assert_close(out.w, w)
    torch.testing.assert_close(out.m, a.m + delta * b.w / w)
    torch.testing.assert_close(out.m2, d * a.m2 + b.m2 + delta**2 * (d * a.w) * b.w / w)


@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", CAUSAL)
def test_one_frame_calls_match_the_reference_values_and_gradients(name, layout, eps_mode, monkeypatch):
    """A call of one frame with a state takes the PyTorch backend's short path (Welford's step written out):
    y, the state and the gradients of x, the affine parameters and the state's m and m2 against the float64
    oracle, 1e4 from zero, from a random state and from none."""
    taken = []
    real = pytorch._one_frame
    monkeypatch.setattr(pytorch, "_one_frame", lambda *a, **k: taken.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(3)
    B, C = 3, 6
    x = make_x(B, C, 1, layout=layout, generator=g, offset=1e4)
    w, b = make_affine(C, torch.float32, generator=g)
    for st in (make_state(name, B, C, generator=g), None):
        if st is not None:
            st = NormState(st.w, st.m + 1e4, st.m2)
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        s_in = None if st is None else NormState(st.w, st.m.clone().requires_grad_(), st.m2.clone().requires_grad_())
        y, s = getattr(normlib.functional, name)(leaves[0], leaves[1], leaves[2], layout=layout, state=s_in,
                                                 return_state=True, eps_mode=eps_mode, backend="torch", **_kw(name))
        wants = [t.double().clone().requires_grad_() for t in (x, w, b)]
        s_ref = None if st is None else NormState(st.w, st.m.clone().requires_grad_(), st.m2.clone().requires_grad_())
        y_r, s_r = ref(name, wants[0], wants[1], wants[2], layout=layout, state=s_ref, return_state=True,
                       eps_mode=eps_mode, **_kw(name))
        assert_rel(y, y_r, TOL[torch.float32], f"{name} y")
        assert_state_close(s, s_r, 1e-12, f"{name} state")
        gy = torch.randn(y.shape, generator=g)
        got = torch.autograd.grad((y * gy).sum() + s.m.sum() + s.m2.sum(),
                                  leaves + ([] if st is None else [s_in.m, s_in.m2]), allow_unused=True)
        want = torch.autograd.grad((y_r * gy.double()).sum() + s_r.m.sum() + s_r.m2.sum(),
                                   wants + ([] if st is None else [s_ref.m, s_ref.m2]), allow_unused=True)
        for k, (a, e) in enumerate(zip(got, want)):
            a = torch.zeros_like(e) if a is None else a
            e = torch.zeros_like(a) if e is None else e
            assert_rel(a, e, 1e-5, f"{name} gradient {k}")
    assert len(taken) == 2


def test_a_returned_state_is_checked_again_once_changed_in_place():
    """States that normlib returned are not read again to check their values; once changed in place they are."""
    layer = normlib.get("cln")(4)
    x = torch.randn(1, 4, 1)
    _, s = layer(x, return_state=True)
    _, s = layer(x, state=s, return_state=True)
    s.w.mul_(-1)
    with pytest.raises(ValueError, match=r"state.w must be >= 0"):
        layer(x, state=s, return_state=True)


@pytest.mark.parametrize("T", [1, 5, pytorch.FEW_FRAMES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("name", [n for n in CAUSAL if not SPECS[n].per_channel])
def test_a_few_frames_of_one_sequence_without_autograd_match_the_reference(name, eps_mode, dtype, T, monkeypatch):
    """A pooled call of one sequence and a few frames under no_grad runs its statistics as Python floats, or in
    the compiled CPU loops (float32, float64): y and the state against the float64 oracle, 1e4 from zero, from
    a random state and from none, and x left as it was."""
    taken = []
    loops = dtype in (torch.float32, torch.float64) and cpu.AVAILABLE
    module, fn = (cpu, "forward") if loops else (pytorch, "_frames_floats")
    real = getattr(module, fn)
    monkeypatch.setattr(module, fn, lambda *a: taken.append(1) or real(*a))
    g = torch.Generator().manual_seed(4)
    C = 7
    x = make_x(1, C, T, generator=g, offset=1e4).to(dtype)
    x0 = x.clone()
    w, b = make_affine(C, torch.float32, generator=g)
    for st in (make_state(name, 1, C, generator=g), None):
        if st is not None:
            st = NormState(st.w, st.m + 1e4, st.m2)
        with torch.no_grad():
            y, s = getattr(normlib.functional, name)(x, w, b, state=st, return_state=True, eps_mode=eps_mode,
                                                     backend="torch", **_kw(name))
        y_r, s_r = ref(name, x.double(), w, b, state=st, return_state=True, eps_mode=eps_mode, **_kw(name))
        assert y.dtype == dtype and y.shape == x.shape
        assert_rel(y, y_r, TOL[dtype], f"{name} y")
        assert_state_close(s, s_r, 1e-12, f"{name} state")
        assert torch.equal(x, x0)
    assert len(taken) == 2


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("name", CAUSAL)
def test_short_calls_on_numpy_arrays_match_the_same_lines_on_tensors(name, B, T, monkeypatch):
    """The CPU's short streaming paths run on numpy arrays, or in the compiled loops; the same lines on tensors
    (the GPU's way, forced here) give the same y and state, within float32's rounding of the affine step, and
    non-finite values and eps = 0 give NaN there as on tensors, without a numpy warning."""
    g = torch.Generator().manual_seed(5)
    C = 6
    x = make_x(B, C, T, generator=g, offset=1e4)
    w, b = make_affine(C, torch.float32, generator=g)
    st = make_state(name, B, C, generator=g)
    st = NormState(st.w, st.m + 1e4, st.m2)
    on_host, loops = pytorch._on_host, cpu.AVAILABLE
    got = {}
    for how in ("tensors", "numpy", "loops"):
        # a signature's path is chosen when it is first prepared: each way starts with no prepared call
        monkeypatch.setattr(normlib.functional, "_CALLS", {})
        monkeypatch.setattr(cpu, "AVAILABLE", loops and how == "loops")
        monkeypatch.setattr(pytorch, "_on_host", (lambda x, grad: False) if how == "tensors" else on_host)
        layer = normlib.get(name)(C, backend="torch", **_kw(name))
        with torch.no_grad():
            layer.weight.copy_(w)
            layer.bias.copy_(b)
            got[how] = layer(x, state=st, return_state=True)
            if how == "tensors":
                continue
            if how == "numpy":  # the same lines: to the last bits
                assert_rel(got[how][0], got["tensors"][0], 1e-6, f"{name} y ({how})")
                assert_state_close(got[how][1], got["tensors"][1], 1e-14, f"{name} state ({how})")
            else:  # the loops' own float64 arithmetic (a general path's hop of B > 1 keeps float32 moments)
                y_r, s_r = ref(name, x.double(), w, b, state=st, return_state=True, **_kw(name))
                assert_rel(got[how][0], y_r, TOL[torch.float32], f"{name} y ({how})")
                assert_state_close(got[how][1], s_r, 1e-12, f"{name} state ({how})")
            bad = x.clone()
            bad[0, 0, 0] = float("inf")
            flat = torch.ones(B, C, T)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                y_bad, _ = layer(bad, state=st, return_state=True)
                y_flat, _ = normlib.get(name)(C, eps=0.0, backend="torch", **_kw(name))(flat, return_state=True)
        assert y_bad[0, :, 0].isnan().any()
        if SPECS[name].per_channel:  # each channel's first value alone: no spread, so 0
            assert torch.equal(y_flat[..., 0], torch.zeros(B, C))
        else:  # one frame of equal values and eps 0: 0 / 0
            assert y_flat.isnan().all()


def test_a_call_longer_than_a_few_frames_or_with_autograd_takes_the_general_path(monkeypatch):
    taken = []
    real = pytorch._frames_floats
    monkeypatch.setattr(pytorch, "_frames_floats", lambda *a: taken.append(1) or real(*a))
    layer = normlib.get("cln")(4, backend="torch")
    layer(torch.randn(1, 4, pytorch.FEW_FRAMES + 1), return_state=True)
    layer(torch.randn(1, 4, 3, requires_grad=True), return_state=True)
    layer(torch.randn(2, 4, 3), return_state=True)
    assert not taken


# ---------------------------------------------------------------------------------------------------
# A state knows its norm
# ---------------------------------------------------------------------------------------------------
POOLED = [n for n in CAUSAL if not SPECS[n].per_channel]
PER_CHANNEL = [n for n in CAUSAL if SPECS[n].per_channel]
OTHERS = [(a, b) for group in (POOLED, PER_CHANNEL) for a in group for b in group if a != b]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", CAUSAL)
def test_a_returned_state_is_tagged_with_its_norm(name, backend):
    x = make_x(2, 3, 4)
    _, s = run(name, x, return_state=True, backend=backend, **_kw(name))
    _, s = run(name, x[..., :1], state=s, return_state=True, backend=backend, **_kw(name))  # fast path
    assert isinstance(s, NormState) and s.norm == name and s.decay == (0.9 if name in EMA else None)
    w, m, m2 = s  # still three fields
    assert len(s) == 3 and s._fields == ("w", "m", "m2")


@pytest.mark.parametrize("pair", OTHERS, ids="-".join)
def test_a_state_of_another_norm_is_refused_naming_both(pair):
    a, b = pair
    x = make_x(2, 3, 4)
    _, sa = run(a, x, return_state=True, **_kw(a))
    _, sb = run(b, x, return_state=True, **_kw(b))
    run(b, x, state=sb, return_state=True, **_kw(b))  # b's signature with its own state: cached
    run(b, x, state=sb, return_state=True, **_kw(b))
    want = rf"state is a state of '{a}'( \(decay=0.9\))?; '{b}'( \(decay=0.9\))? refuses it"
    with pytest.raises(ValueError, match=want):
        run(b, x, state=sa, return_state=True, **_kw(b))  # the fast path's key holds the tag
    with pytest.raises(ValueError, match=want):
        run(b, x, state=sa, **_kw(b))


def test_an_ema_state_of_another_decay_is_refused():
    layer, other = normlib.create("emaln", 4, decay=0.99), normlib.create("emaln", 4, decay=0.9)
    x = torch.randn(2, 4, 3)
    _, s = layer(x, return_state=True)
    _, s_other = other(x, return_state=True)
    layer(x, state=s, return_state=True)
    with pytest.raises(ValueError, match=r"'emaln' \(decay=0.9\); 'emaln' \(decay=0.99\) refuses it"):
        layer(x, state=s_other, return_state=True)
    y, s2 = layer(x, state=s_other.untagged(), return_state=True)  # on purpose: the tag dropped
    assert s2.norm == "emaln" and s2.decay == 0.99


@pytest.mark.parametrize("name", CAUSAL)
def test_an_untagged_state_is_taken_by_any_norm_of_fitting_shapes(name):
    x = make_x(2, 3, 4)
    s = make_state(name, 2, 3)
    assert type(s) is NormState and s.norm is None and s.decay is None
    y, out = run(name, x, state=s, return_state=True, **_kw(name))
    assert out.norm == name
    assert torch.equal(y, run(name, x, state=NormState(*s), **_kw(name)))


def test_the_tag_survives_save_to_detach_map_merge_copy_and_pytree():
    import copy

    import torch.utils._pytree as pytree

    _, s = run("emaln", make_x(2, 3, 4), return_state=True, decay=0.5)
    buf = io.BytesIO()
    torch.save({"s": s, "plain": s.untagged()}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert type(loaded["s"]) is type(s) and type(loaded["plain"]) is NormState
    _assert_states_equal(loaded["s"], s)
    leaves, spec = pytree.tree_flatten({"s": s})
    for t in (s.to(F32), s.detach(), s.map(lambda t: t[:1]), merge(s, NormState.empty(2), 1.0),
              merge(NormState.empty(2), s, 1.0), copy.deepcopy(s), pytree.tree_unflatten(leaves, spec)["s"],
              pytree.tree_map(lambda t: t + 1, s)):
        assert type(t) is type(s) and (t.norm, t.decay) == ("emaln", 0.5)
    assert "norm='emaln', decay=0.5" in repr(s)
    assert s.tagged(None).norm is None and s.untagged().tagged("emaln", 0.5).__class__ is type(s)
    _, c = run("cln", make_x(2, 3, 4), return_state=True)
    with pytest.raises(ValueError, match=r"old is a state of 'emaln' \(decay=0.5\), new one of 'cln'"):
        merge(s, c, 1.0)


def test_the_tag_survives_torch_compile():
    layer = normlib.create("ccemaln", 3, decay=0.7, backend="torch")
    f = torch.compile(lambda x, s: layer(x, state=s, return_state=True), fullgraph=True, backend="aot_eager")
    x = make_x(2, 3, 5)
    _, s = f(x, None)
    _, s = f(x, s)
    assert (s.norm, s.decay) == ("ccemaln", 0.7)
    with pytest.raises(ValueError, match=r"'ccln' refuses it"):  # raised as the graph is traced
        torch.compile(lambda x, s: normlib.functional.ccln(x, state=s), backend="aot_eager")(x, s)
