"""The PyTorch backend (``backend="torch"``) against the float64 reference: every norm, both layouts,
affine or not, lengths, dtypes, odd and random shapes, gradients, DC offsets, causality, identities."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from torch import nn

import normlib
import normlib.backends
from normlib.backends import pytorch as pytorch_backend
from conftest import (CAUSAL, DC_OFFSET_TOL, EMA, GLOBAL, LAYOUTS, NORMS, SPECS, TOL, assert_rel,
                      assert_state_close, examples, make_affine, make_lengths, make_state, make_x, ref,
                      rel_err, run, unit_floor, state_shape, stats_dtype, time_dim,
                      STATE_DTYPE)

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
ALL_DTYPES = (F64, F32, F16, BF16)


def _dtype_id(dtype):
    return str(dtype).replace("torch.", "")


def _layout_id(layout):
    return layout.replace(" ", "")


def _tbatch(x, layout, b, L):
    """x[b:b+1] truncated to its first L frames, in the given layout."""
    return x[b:b + 1, :, :L] if layout == "b c t" else x[b:b + 1, :L, :]


def _time_slice(t, layout, sl):
    return t[:, :, sl] if layout == "b c t" else t[:, sl, :]


# ---------------------------------------------------------------------------------------------------
# The grid: every norm x both layouts x affine x lengths x dtypes
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", NORMS)
def test_matches_reference(name, layout, affine, with_lengths, dtype):
    B, C, T = 3, 6, 21
    x = make_x(B, C, T, layout, dtype, offset=0.5)
    w, b = make_affine(C, dtype) if affine else (None, None)
    lengths = torch.tensor([T, 9, 0]) if with_lengths else None
    y = run(name, x, w, b, layout=layout, lengths=lengths)
    assert y.dtype == dtype and y.shape == x.shape
    assert_rel(y, ref(name, x, w, b, layout=layout, lengths=lengths), TOL[dtype], name)


ODD_SHAPES = [
    pytest.param(1, 1, 1, id="B1-C1-T1"),
    pytest.param(1, 1, 17, id="B1-C1-T17"),
    pytest.param(2, 7, 1, id="B2-C7-T1"),
    pytest.param(3, 50, 63, id="B3-C50-T63"),
    pytest.param(1, 3, 129, id="B1-C3-T129"),
    pytest.param(5, 2, 64, id="B5-C2-T64"),
    pytest.param(2, 13, 33, id="B2-C13-T33"),
    pytest.param(4, 1, 2, id="B4-C1-T2"),
]


@pytest.mark.parametrize("dtype", [F64, F32], ids=_dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("B,C,T", ODD_SHAPES)
@pytest.mark.parametrize("name", NORMS)
def test_odd_shapes(name, B, C, T, layout, dtype):
    x = make_x(B, C, T, layout, dtype)
    w, b = make_affine(C, dtype)
    lengths = make_lengths(B, T)
    kw = dict(layout=layout, lengths=lengths)
    if SPECS[name].causal:
        state = make_state(name, B, C)
        y, s = run(name, x, w, b, state=state, return_state=True, **kw)
        y_r, s_r = ref(name, x, w, b, state=state, return_state=True, **kw)
        assert all(t.dtype == STATE_DTYPE for t in s)
        assert_state_close(s, s_r, TOL[stats_dtype(dtype)], floor=True)
    else:
        y, y_r = run(name, x, w, b, **kw), ref(name, x, w, b, **kw)
    assert y.dtype == dtype and y.shape == x.shape
    assert_rel(y, y_r, TOL[dtype], name, unit_floor(y_r))


# ---------------------------------------------------------------------------------------------------
# Property-based: random shapes and options
# ---------------------------------------------------------------------------------------------------
@st.composite
def cases(draw):
    name = draw(st.sampled_from(NORMS))
    B, C, T = draw(st.integers(1, 3)), draw(st.integers(1, 24)), draw(st.integers(1, 48))
    causal = SPECS[name].causal
    return dict(
        name=name, B=B, C=C, T=T,
        dtype=draw(st.sampled_from(ALL_DTYPES)),
        layout=draw(st.sampled_from(LAYOUTS)),
        affine=draw(st.sampled_from(["none", "weight", "bias", "both"])),
        lengths=draw(st.none() | st.lists(st.integers(0, T), min_size=B, max_size=B)),
        eps_mode=(eps_mode := draw(st.sampled_from(["inside", "outside"]))),
        # outside the sqrt a zero-variance group (C = 1 pooled over one frame) turns the float64
        # reference's rounding of x - mu (~1e-16) into ~1e-16 / eps: keep eps >= 1e-4 there
        eps=draw(st.sampled_from([1e-8, 1e-5, 1e-2] if eps_mode == "inside" else [1e-4, 1e-2])),
        # decay 0 is refused for the per-channel EMA (a single-frame per-channel norm has variance 0)
        decay=draw(st.sampled_from([1.0] if SPECS[name].per_channel else [0.0, 1.0]) | st.floats(0.1, 1.0))
        if name in EMA else None,
        state=causal and draw(st.booleans()),
        empty_row=draw(st.booleans()),
        return_state=causal and draw(st.booleans()),
        noncontig=draw(st.booleans()),
        offset=draw(st.sampled_from([0.0, 0.0, 3.0, -50.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _materialize(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, C, T, dtype, layout = c["B"], c["C"], c["T"], c["dtype"], c["layout"]
    x = make_x(B, C, T, layout, dtype, generator=g, offset=c["offset"])
    if c["noncontig"]:  # the same values in a strided view
        big = torch.zeros((B, 2 * x.shape[1], 3 * x.shape[2]), dtype=dtype)
        big[:, ::2, ::3] = x
        x = big[:, ::2, ::3]
    w, b = make_affine(C, dtype, g)
    if c["affine"] == "none":
        w = b = None
    elif c["affine"] == "weight":
        b = None
    elif c["affine"] == "bias":
        w = None
    kw = dict(layout=layout, eps_mode=c["eps_mode"])
    if c["lengths"] is not None:
        kw["lengths"] = torch.tensor(c["lengths"])
    if c["decay"] is not None:
        kw["decay"] = c["decay"]
    if c["state"]:
        kw["state"] = make_state(c["name"], B, C, generator=g, empty_rows=(0,) if c["empty_row"] else ())
    if c["return_state"]:
        kw["return_state"] = True
    return x, w, b, kw


@hsettings(max_examples=examples(3))
@given(c=cases())
def test_random_cases_match_reference(c):
    x, w, b, kw = _materialize(c)
    name, dtype = c["name"], c["dtype"]
    out = run(name, x, w, b, c["eps"], **kw)
    expected = ref(name, x, w, b, c["eps"], **kw)
    if c["return_state"]:
        (y, s), (y_r, s_r) = out, expected
        assert all(t.dtype == STATE_DTYPE for t in s) and s.shape == state_shape(name, c["B"], c["C"])
        assert_state_close(s, s_r, TOL[stats_dtype(dtype)], floor=True)
    else:
        y, y_r = out, expected
    assert y.dtype == dtype and y.shape == x.shape
    assert_rel(y, y_r, TOL[dtype], name, unit_floor(y_r))


@hsettings(max_examples=examples(1))
@given(c=cases())
def test_random_cases_gradients_match_reference(c):
    """Autograd through the backend equals autograd through the float64 reference (float64 inputs)."""
    c = dict(c, dtype=F64)
    x, w, b, kw = _materialize(c)
    name = c["name"]
    leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
    if "state" in kw:
        kw["state"] = normlib.NormState(*(t.requires_grad_() for t in kw["state"]))
        leaves += list(kw["state"])
    g = torch.Generator().manual_seed(c["seed"] + 1)

    def loss(out):
        y, s = out if c["return_state"] else (out, None)
        total = (y * torch.randn(y.shape, generator=g, dtype=F64)).sum()
        if s is not None:
            total = total + sum((t * torch.randn(t.shape, generator=g, dtype=F64)).sum() for t in s)
        return total

    g.manual_seed(c["seed"] + 1)
    grads = torch.autograd.grad(loss(run(name, x, w, b, c["eps"], **kw)), leaves, allow_unused=True)
    g.manual_seed(c["seed"] + 1)
    grads_r = torch.autograd.grad(loss(ref(name, x, w, b, c["eps"], **kw)), leaves, allow_unused=True)
    for i, (a, e) in enumerate(zip(grads, grads_r)):
        a = torch.zeros_like(leaves[i]) if a is None else a
        e = torch.zeros_like(leaves[i]) if e is None else e
        # float64; rounding is amplified where var ~ 0 (eps 1e-8), and a gradient may be ~0 (C = 1)
        diff, scale = (a - e).norm().item(), max(e.norm().item(), 1.0)
        assert diff <= 1e-6 * scale, f"grad of input {i}: |diff| {diff:.2e}, |ref| {e.norm().item():.2e}"


# ---------------------------------------------------------------------------------------------------
# Layouts and strides
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=_dtype_id)
@pytest.mark.parametrize("name", NORMS)
def test_btc_is_the_transpose_of_bct(name, dtype):
    B, C, T = 2, 5, 19
    x = make_x(B, C, T, "b c t", dtype)
    w, b = make_affine(C, dtype)
    lengths = torch.tensor([T, 7])
    kw = dict(lengths=lengths, return_state=True) if SPECS[name].causal else dict(lengths=lengths)
    out1 = run(name, x, w, b, layout="b c t", **kw)
    out2 = run(name, x.transpose(1, 2).contiguous(), w, b, layout="b t c", **kw)
    y1, y2 = (out1[0], out2[0]) if SPECS[name].causal else (out1, out2)
    assert y2.shape == (B, T, C) and y2.dtype == dtype
    assert_rel(y2.transpose(1, 2), y1, 1e-12 if dtype == F64 else TOL[dtype] / 10, "y")
    if SPECS[name].causal:
        assert_state_close(out2[1], out1[1], 1e-12 if dtype == F64 else 1e-6)


@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", NORMS)
def test_layout_spellings(name, layout):
    x = make_x(2, 4, 9, layout)
    y = run(name, x, layout=layout)
    for spelling in (layout.replace(" ", ""), layout.upper(), layout.replace(" ", ",")):
        assert torch.equal(run(name, x, layout=spelling), y)


@pytest.mark.parametrize("view", ["channel-stride", "time-stride", "transposed-storage", "expanded-batch"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", NORMS)
def test_non_contiguous_inputs(name, layout, view):
    B, C, T = 3, 5, 14
    base = make_x(B, C, T, layout, F64)
    cd, td = (1, 2) if layout == "b c t" else (2, 1)
    if view in ("channel-stride", "time-stride"):
        dim = cd if view == "channel-stride" else td
        shape = list(base.shape)
        shape[dim] *= 2
        sl = [slice(None)] * 3
        sl[dim] = slice(1, None, 2)
        big = torch.randn(shape, dtype=F64)
        big[tuple(sl)] = base
        x = big[tuple(sl)]
    elif view == "transposed-storage":
        x = base.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        x = base[:1].expand(base.shape)
    assert not x.is_contiguous()
    w_big = torch.randn(2 * C, dtype=F64)
    w = w_big[::2]
    lengths = torch.tensor([T, 4, 11])
    kw = dict(layout=layout, lengths=lengths)
    if SPECS[name].causal:
        kw["state"] = make_state(name, B, C, F64)
    y = run(name, x, w, None, **kw)
    torch.testing.assert_close(y, run(name, x.contiguous(), w.contiguous(), None, **kw), rtol=1e-12, atol=1e-12)
    assert_rel(y, ref(name, x, w, None, **kw), TOL[F64], name)


@pytest.mark.parametrize("name", NORMS)
def test_auto_backend_on_cpu_is_torch(name):
    x = make_x(2, 4, 10)
    y = getattr(normlib.functional, name)(x)
    assert torch.equal(y, run(name, x))


# ---------------------------------------------------------------------------------------------------
# gradcheck in float64 (x, weight, bias and the incoming state's fields; the returned state too)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("name,with_state", [(n, s) for n in NORMS for s in (False, True) if SPECS[n].causal or not s],
                         ids=lambda v: {False: "nostate", True: "state"}.get(v, v) if isinstance(v, bool) else v)
def test_gradcheck(name, with_state, with_lengths, eps_mode):
    """Global norms take no state: they run without one only."""
    causal = SPECS[name].causal
    B, C, T = 3, 3, 5
    x = make_x(B, C, T, dtype=F64, offset=0.2).requires_grad_()
    w, b = (t.requires_grad_() for t in make_affine(C, F64))
    inputs = [x, w, b]
    if with_state:  # the weight, a count, gets no gradient (test_a_states_weight_gets_no_gradient)
        inputs += [t.requires_grad_(i > 0) for i, t in enumerate(make_state(name, B, C, F64))]
    lengths = torch.tensor([T, 2, 0]) if with_lengths else None
    kw = dict(eps_mode=eps_mode, lengths=lengths)
    if name in EMA:
        kw["decay"] = 0.8

    def fn(x, w, b, *state):
        if not causal:
            return run(name, x, w, b, **kw)
        y, s = run(name, x, w, b, state=normlib.NormState(*state) if state else None, return_state=True, **kw)
        return (y, *s)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("affine", ["weight", "bias"])
@pytest.mark.parametrize("name", NORMS)
def test_gradcheck_one_affine_parameter(name, affine):
    """gamma alone or beta alone (the functional API takes either): a training path that saves x-hat keeps it
    apart from y = gamma x-hat + beta however many of the two there are."""
    x = make_x(2, 4, 6, dtype=F64, offset=0.2).requires_grad_()
    w, b = make_affine(4, F64)
    p = (w if affine == "weight" else b).requires_grad_()
    fn = (lambda x, p: run(name, x, p, None)) if affine == "weight" else (lambda x, p: run(name, x, None, p))
    assert torch.autograd.gradcheck(fn, [x, p], eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", NORMS)
def test_gradcheck_layout_no_affine(name, layout):
    x = make_x(2, 4, 6, layout, F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: run(name, x, layout=layout), [x], eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=_dtype_id)
@pytest.mark.parametrize("name", NORMS)
def test_low_precision_gradients(name, dtype):
    """Gradients of fp32/fp16/bf16 inputs have the input's dtype and match the float64 reference's.
    (eps = 1e-5: with 1e-8 the per-channel norms' early frames, where var ~ 0, amplify rounding 1e4 times.)"""
    B, C, T = 2, 6, 16
    x = make_x(B, C, T, dtype=dtype).requires_grad_()
    w, b = (t.requires_grad_() for t in make_affine(C, dtype))
    g = torch.randn(B, C, T, dtype=F64)
    (run(name, x, w, b, 1e-5).double() * g).sum().backward()
    x64 = x.detach().double().requires_grad_()
    w64, b64 = (t.detach().double().requires_grad_() for t in (w, b))
    (ref(name, x64, w64, b64, 1e-5) * g).sum().backward()
    tol = 1e-4 if dtype == F32 else TOL[dtype]
    for a, e, what in ((x.grad, x64.grad, "x"), (w.grad, w64.grad, "weight"), (b.grad, b64.grad, "bias")):
        assert a.dtype == dtype
        assert_rel(a, e, tol, f"grad {what}")


# ---------------------------------------------------------------------------------------------------
# DC offsets: fp32 input, relative error against the float64 reference, never NaN
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("offset", sorted(DC_OFFSET_TOL), ids=lambda o: f"offset{o:g}")
@pytest.mark.parametrize("name,mode", [(n, m) for n in NORMS
                                       for m in ("whole", "lengths", "chunks-from-none", "chunks-from-empty")
                                       if SPECS[n].causal or not m.startswith("chunks")])
def test_dc_offset(name, offset, mode):
    """Global norms do not stream: whole sequences and lengths only."""
    B, C, T = 3, 16, 50
    x = make_x(B, C, T, dtype=F32, offset=offset)
    lengths = torch.tensor([T, 20, 1]) if mode == "lengths" else None
    if mode.startswith("chunks"):
        state = None if mode == "chunks-from-none" else normlib.NormState.empty(state_shape(name, B, C))
        ys = []
        for chunk in x.split([7, 1, 20, 22], dim=-1):
            y, state = run(name, chunk, state=state, return_state=True)
            ys.append(y)
        y = torch.cat(ys, -1)
    else:
        y = run(name, x, lengths=lengths)
    assert torch.isfinite(y).all()
    err = rel_err(y, ref(name, x, lengths=lengths))
    assert err <= DC_OFFSET_TOL[offset], f"{name} offset {offset}: relative error {err:.2e}"


@pytest.mark.parametrize("name", NORMS)
def test_dc_offset_gradients_finite(name):
    x = make_x(2, 16, 40, dtype=F32, offset=1e4).requires_grad_()
    w, b = (t.requires_grad_() for t in make_affine(16, F32))
    (run(name, x, w, b) * torch.randn(2, 16, 40)).sum().backward()
    for t in (x.grad, w.grad, b.grad):
        assert torch.isfinite(t).all()


# ---------------------------------------------------------------------------------------------------
# Causality
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", CAUSAL)
def test_causal(name, layout):
    """Changing frames >= t changes no output before t (bit for bit), with a state and lengths too."""
    B, C, T = 2, 5, 24
    x = make_x(B, C, T, layout)
    w, b = make_affine(C, F32)
    state = make_state(name, B, C)
    lengths = torch.tensor([T, 17])
    td = time_dim(layout)
    y = run(name, x, w, b, layout=layout, state=state, lengths=lengths)
    for t in (1, 2, 9, 16, 23):
        x2 = x.clone()
        x2.narrow(td, t, T - t).copy_(100 * torch.randn_like(x2.narrow(td, t, T - t)) - 30)
        y2 = run(name, x2, w, b, layout=layout, state=state, lengths=lengths)
        assert torch.equal(y2.narrow(td, 0, t), y.narrow(td, 0, t)), f"t={t}"
        if name != "frameln":  # the probe can see a change: later outputs do move
            assert not torch.equal(y2.narrow(td, t, T - t), y.narrow(td, t, T - t))


@pytest.mark.parametrize("name", GLOBAL)
def test_global_norms_are_not_causal(name):
    x = make_x(2, 5, 24)
    y = run(name, x)
    x2 = x.clone()
    x2[..., 12:] += 5
    assert not torch.allclose(run(name, x2)[..., :12], y[..., :12])


# ---------------------------------------------------------------------------------------------------
# Identities
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("pair", [("emaln", "cln", 1.0), ("ccemaln", "ccln", 1.0), ("emaln", "frameln", 0.0)],
                         ids=["emaln1-cln", "ccemaln1-ccln", "emaln0-frameln"])
def test_ema_limits(pair, layout):
    ema, other, decay = pair
    B, C, T = 3, 4, 17
    x = make_x(B, C, T, layout, F64)
    w, b = make_affine(C, F64)
    state = make_state(ema, B, C, F64)
    kw = dict(layout=layout, lengths=torch.tensor([T, 5, 0]), state=state, return_state=True)
    y1, s1 = run(ema, x, w, b, decay=decay, **kw)
    y2, s2 = run(other, x, w, b, **kw)
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    for a, e in zip(s1, s2):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [F64, F32], ids=_dtype_id)
def test_gln_is_groupnorm(dtype):
    C = 8
    x = make_x(3, C, 29, dtype=dtype, offset=1.5)
    gn = nn.GroupNorm(1, C, dtype=dtype)
    with torch.no_grad():
        gn.weight.copy_(make_affine(C, dtype)[0])
        gn.bias.copy_(make_affine(C, dtype)[1])
    assert_rel(run("gln", x, gn.weight, gn.bias, gn.eps), gn(x), TOL[dtype] * 10, "gln vs GroupNorm")


@pytest.mark.parametrize("dtype", [F64, F32], ids=_dtype_id)
def test_instln_is_instancenorm(dtype):
    C = 8
    x = make_x(3, C, 29, dtype=dtype, offset=1.5)
    inorm = nn.InstanceNorm1d(C, affine=True, dtype=dtype)
    with torch.no_grad():
        inorm.weight.copy_(make_affine(C, dtype)[0])
        inorm.bias.copy_(make_affine(C, dtype)[1])
    assert_rel(run("instln", x, inorm.weight, inorm.bias, inorm.eps), inorm(x), TOL[dtype] * 10, "instln")


@pytest.mark.parametrize("dtype", [F64, F32], ids=_dtype_id)
def test_frameln_btc_is_layernorm(dtype):
    C = 8
    x = make_x(3, C, 29, "b t c", dtype, offset=1.5)
    ln = nn.LayerNorm(C, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(make_affine(C, dtype)[0])
        ln.bias.copy_(make_affine(C, dtype)[1])
    assert_rel(run("frameln", x, ln.weight, ln.bias, ln.eps, layout="b t c"), ln(x), TOL[dtype] * 10, "frameln")


def test_cln_first_frames_by_hand():
    """cLN at t=0 is LayerNorm of frame 0; at t=1 the statistics of frames 0 and 1 together."""
    x = make_x(2, 5, 3, dtype=F64)
    y = run("cln", x)
    for t in range(3):
        v = x[..., : t + 1].reshape(2, -1)
        mu, var = v.mean(1), v.var(1, unbiased=False)
        torch.testing.assert_close(y[..., t], (x[..., t] - mu[:, None]) / torch.sqrt(var[:, None] + 1e-8))


# ---------------------------------------------------------------------------------------------------
# lengths
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=_dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("name", NORMS)
def test_lengths_semantics(name, layout, dtype):
    B, C, T = 4, 5, 13
    causal = SPECS[name].causal
    x = make_x(B, C, T, layout, dtype)
    lengths = torch.tensor([T, 6, 1, 0])
    valid = torch.arange(T) < lengths[:, None]  # (B, T)
    mask = valid[:, None, :] if layout == "b c t" else valid[:, :, None]
    x = torch.where(mask, x, (1e3 * torch.randn(x.shape, dtype=F64)).to(dtype))  # garbage padding
    x.requires_grad_()
    w, b = (t.requires_grad_() for t in make_affine(C, dtype))
    kw = dict(layout=layout, lengths=lengths)
    state = make_state(name, B, C) if causal else None
    if causal:
        y, s = run(name, x, w, b, state=state, return_state=True, **kw)
    else:
        y = run(name, x, w, b, **kw)

    # padded output is exactly 0
    assert torch.equal(torch.where(mask, 0, y), torch.zeros_like(y))
    # padded frames' gradient is exactly 0
    (y.double() * torch.randn(y.shape, dtype=F64)).sum().backward()
    assert torch.equal(torch.where(mask, 0, x.grad), torch.zeros_like(x.grad))
    assert torch.isfinite(w.grad).all() and torch.isfinite(b.grad).all()
    # the valid frames equal a run on the truncated sequence; the state equals its state
    tight = 1e-12 if dtype == F64 else TOL[dtype] / 5
    for i in range(B - 1):  # item 3 has length 0: see below (a T = 0 input is tested in test_streaming.py)
        L = int(lengths[i])
        xi = _tbatch(x.detach(), layout, i, L)
        if causal:
            si = state.map(lambda t: t[i:i + 1])
            yi, s_i = run(name, xi, w.detach(), b.detach(), layout=layout, state=si, return_state=True)
            for field, a, e in zip(normlib.NormState._fields, s.map(lambda t: t[i:i + 1]), s_i):
                assert_rel(a, e, 1e-12 if dtype == F64 else 1e-6, f"state.{field} of item {i}")
        else:
            yi = run(name, xi, w.detach(), b.detach(), layout=layout)
        assert_rel(_tbatch(y.detach(), layout, i, L), yi, tight, f"item {i}")
    # lengths == 0: the incoming state comes back unchanged
    if causal:
        assert all(torch.equal(a[3], e[3]) for a, e in zip(s, state))


@pytest.mark.parametrize("name", CAUSAL)
def test_lengths_zero_without_state_gives_the_empty_state(name):
    B, C, T = 2, 3, 6
    x = make_x(B, C, T)
    y, s = run(name, x, lengths=torch.tensor([0, 0]), return_state=True)
    assert torch.equal(y, torch.zeros_like(y))
    empty = normlib.NormState.empty(state_shape(name, B, C), dtype=STATE_DTYPE)
    assert all(a.dtype == STATE_DTYPE and torch.equal(a, e) for a, e in zip(s, empty))


@pytest.mark.parametrize("name", NORMS)
def test_lengths_other_integer_types(name):
    x = make_x(3, 4, 10)
    y = run(name, x, lengths=torch.tensor([10, 3, 0]))
    assert torch.equal(run(name, x, lengths=torch.tensor([10, 3, 0], dtype=torch.int32)), y)
    assert torch.equal(run(name, x, lengths=torch.tensor([10, 3, 0], dtype=torch.uint8)), y)
    assert torch.equal(run(name, x, lengths=[10, 3, 0]), y)


@pytest.mark.parametrize("name", NORMS)
def test_lengths_full_equals_no_lengths(name):
    x = make_x(3, 4, 10, dtype=F64)
    torch.testing.assert_close(run(name, x, lengths=torch.tensor([10, 10, 10])), run(name, x),
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", NORMS)
def test_nan_padding_does_not_leak(name):
    """Padding is excluded from every statistic: NaN/inf in padded frames must not reach the valid outputs,
    nor any gradient (padded frames get gradient exactly 0, weight and bias finite gradients)."""
    B, C, T = 2, 4, 9
    x = make_x(B, C, T, dtype=F64)
    x[0, :, 6:] = float("nan")
    x[1, :, 8:] = float("inf")
    x.requires_grad_()
    w, b = (t.requires_grad_() for t in make_affine(C, F64))
    lengths = torch.tensor([6, 8])
    y = run(name, x, w, b, lengths=lengths)
    assert torch.isfinite(y).all()
    (y * torch.randn(B, C, T, dtype=F64)).sum().backward()
    assert torch.equal(x.grad[0, :, 6:], torch.zeros(C, 3, dtype=F64))
    assert torch.equal(x.grad[1, :, 8:], torch.zeros(C, 1, dtype=F64))
    assert torch.isfinite(x.grad).all()
    assert torch.isfinite(w.grad).all() and torch.isfinite(b.grad).all()


# ---------------------------------------------------------------------------------------------------
# The backend contract (normlib.backends.pytorch), and the generic entry point
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NORMS)
def test_backend_forward_contract(name):
    """forward(x (B, C, T) view in any strides, ...) -> (y of x's shape and dtype, state or None)."""
    spec = SPECS[name]
    decay = spec.resolve_decay(None)
    x = make_x(2, 5, 12, "b t c", F32).transpose(1, 2)  # a permuted (B, C, T) view, as "b t c" arrives
    w, b = make_affine(5, F32)
    lengths = torch.tensor([12, 4])
    y, s = pytorch_backend.forward(x, w, b, lengths, None, per_channel=spec.per_channel, decay=decay,
                                   eps=1e-8, eps_mode="inside", return_state=False)
    assert s is None and y.shape == x.shape and y.dtype == F32
    assert_rel(y, ref(name, x, w, b, lengths=lengths), TOL[F32], name)
    if spec.causal:
        y2, s2 = pytorch_backend.forward(x, w, b, lengths, None, per_channel=spec.per_channel, decay=decay,
                                         eps=1e-8, eps_mode="inside", return_state=True)
        assert torch.equal(y2, y) and isinstance(s2, normlib.NormState)
        assert s2.shape == state_shape(name, 2, 5) and s2.dtype == STATE_DTYPE


@pytest.mark.parametrize("decay, T", [(0.0, 9), (1.0, 33), (0.6, 33), (0.5, 600), (1e-3, 77), (1e-30, 9),
                                      (0.999, 1000)])
def test_decayed_cumsum_is_the_sequential_recurrence(decay, T):
    """S_t = d S_(t-1) + v_t, in blocks where the scale d^-L would leave float64's range (0.5 over 600
    frames: 3 blocks of 256; 1e-3: 4 of 25; 1e-30: 5 of 2), the blocks' totals carried over."""
    v = torch.randn(2, 3, T, dtype=F64) * torch.logspace(-3, 3, T, dtype=F64)
    got = pytorch_backend.decayed_cumsum(v, decay)
    acc, want = torch.zeros(2, 3, dtype=F64), []
    for t in range(T):
        acc = decay * acc + v[..., t]
        want.append(acc)
    torch.testing.assert_close(got, torch.stack(want, -1), rtol=1e-12, atol=1e-12 * float(v.abs().max()))


@pytest.mark.parametrize("name", NORMS)
def test_generic_norm_entry_point(name):
    x = make_x(2, 5, 12)
    assert torch.equal(normlib.functional.norm(SPECS[name], x, backend="torch"), run(name, x))
    assert getattr(normlib.functional, name).__name__ == name


@pytest.mark.parametrize("name", NORMS)
def test_empty_time_keeps_y_on_the_graph(name):
    """T = 0: y is empty but still depends on x, so a loss over it back-propagates (once it raised)."""
    x = torch.randn(2, 4, 0, requires_grad=True)
    (gx,) = torch.autograd.grad(run(name, x).sum(), x)
    assert gx.shape == x.shape
    w, b = (t.requires_grad_() for t in make_affine(4, torch.float32))  # zero gradients, not None (DDP would
    # take them for unused parameters), as on the Triton backend
    y = run(name, x, w, b)
    assert y.dtype == x.dtype
    both = (y, run(name, x, w, b, backend="triton")) if normlib.backends.triton_usable(x) else (y,)
    for backend_y in both:
        gw, gb = torch.autograd.grad(backend_y.sum(), (w, b))
        assert torch.equal(gw, torch.zeros(4)) and torch.equal(gb, torch.zeros(4))


@pytest.mark.parametrize("name, decay", [("frameln", None), ("emaln", 0.0)], ids=["frameln", "emaln-decay0"])
def test_a_frame_norm_gives_its_unread_state_zero_gradients(name, decay):
    """FRAME reads no incoming statistics: their gradients are zeros, not None, on both backends and in the
    reference (once the PyTorch backend gave None), and a NaN in them stays out of y."""
    x = make_x(2, 4, 9, "b c t", F32)
    for backend in ("torch", "triton") if normlib.backends.triton_usable(x) else ("torch",):
        m = torch.tensor([0.5, float("nan")], dtype=F64, requires_grad=True)
        m2 = torch.tensor([2.0, 3.0], dtype=F64, requires_grad=True)
        state = normlib.NormState(torch.tensor([5.0, 1.0], dtype=F64), m, m2)
        y = run(name, x, state=state, decay=decay, backend=backend)
        assert torch.isfinite(y).all(), backend
        gm, gm2 = torch.autograd.grad((y * torch.randn_like(y)).sum(), (m, m2))
        assert torch.equal(gm, torch.zeros(2, dtype=F64)) and torch.equal(gm2, torch.zeros(2, dtype=F64)), backend


@pytest.mark.parametrize("name", ["gln", "instln", "frameln"])
def test_the_native_kernels_trace_without_a_graph_break(name):
    """GroupNorm's and LayerNorm's path reads a tensor on the host (whether to shift) only when not compiling:
    a bool of a tensor breaks a fullgraph trace. Dynamo's graph (backend="eager") equals the eager layer."""
    layer = normlib.create(name, 8, backend="torch")
    x = make_x(2, 8, 50, "b c t", F32, offset=3.0)
    torch._dynamo.reset()
    assert_rel(torch.compile(layer, fullgraph=True, backend="eager")(x), layer(x), 1e-6, name)


@pytest.mark.parametrize("name", ["cln", "ccemaln"])
def test_inductor_gives_the_eager_gradients_through_a_state(name):
    """torch.compile's default backend over a layer that takes and returns a state, the loss reading both:
    the returned state was a gather, whose backward inductor (torch 2.13, CPU) fused wrongly, and x's and
    the state's gradients came out up to 80 % off (aot_eager was right)."""
    B, C, T = 3, 4, 9
    layer = normlib.create(name, C, backend="torch")
    x = make_x(B, C, T, "b c t", F32, offset=3.0)
    state = make_state(name, B, C, generator=torch.Generator().manual_seed(2))
    state = normlib.NormState(state.w * 20, state.m, state.m2 * 20)

    def grads(fn):
        xx = x.clone().requires_grad_()
        st = normlib.NormState(state.w, state.m.clone().requires_grad_(), state.m2.clone().requires_grad_())
        y, s = fn(xx, st)
        return torch.autograd.grad(y.square().sum() + 1e-2 * s.m2.sum() + s.m.sum(), (xx, st.m, st.m2, layer.weight))

    eager = grads(lambda x, s: layer(x, state=s, return_state=True))
    torch._dynamo.reset()
    compiled = grads(torch.compile(lambda x, s: layer(x, state=s, return_state=True), fullgraph=True))
    for what, a, e in zip(("x", "state.m", "state.m2", "weight"), compiled, eager):
        assert rel_err(a, e) < 1e-5, what


@pytest.mark.parametrize("name", EMA)
def test_a_long_padding_tail_keeps_gradients_finite(name):
    """An EMA's weight decays through a sequence's padding until it is subnormal in float32 (decay 0.5, 200
    padding frames): 1 / w was inf there and 0 * inf a NaN, which the forward masked and autograd's backward
    carried into every valid frame of the sequence (and into the weight's gradient). Gradients now match
    float64's; a stream that has ended (length 0 for a whole chunk) passes its state's gradient through."""
    B, C, T = 2, 4, 300
    x, gy = make_x(B, C, T), make_x(B, C, T)
    w, _ = make_affine(C, F32)
    lengths = torch.tensor([T, 100])
    grads = {}
    for dt in (F32, F64):
        xg, wg = x.to(dt).requires_grad_(), w.to(dt).requires_grad_()
        y = run(name, xg, wg, decay=0.5, lengths=lengths) if dt == F32 else ref(name, xg, wg, decay=0.5,
                                                                                lengths=lengths)
        grads[dt] = torch.autograd.grad((y * gy.to(dt)).sum(), [xg, wg])
    for got, want, what in zip(grads[F32], grads[F64], ("dx", "dweight")):
        assert_rel(got, want, 1e-5, what)
    shape = state_shape(name, B, C)
    m = torch.randn(shape, dtype=STATE_DTYPE, requires_grad=True)
    s0 = normlib.NormState(torch.full(shape, 50.0, dtype=STATE_DTYPE), m, torch.full(shape, 40.0, dtype=STATE_DTYPE))
    y, s1 = run(name, make_x(B, C, 1000), decay=0.9, state=s0, lengths=[1000, 0], return_state=True)
    (gm,) = torch.autograd.grad(y.sum() + s1.m.sum(), [m])
    assert torch.isfinite(gm).all() and torch.equal(gm[1], torch.ones_like(gm[1]))


@pytest.mark.parametrize("name", ["emaln", "ccemaln", "cln"])
def test_a_level_step_that_an_ema_forgets_frame_0_for_keeps_the_spread(name):
    """A step of 1e3 after frame 100: an EMA's window then sits 1e3 from frame 0's mean (the shift), with a
    spread of 1. Float32 squares of x - K rounded that spread away (emaln 1.7e-3 off); squares about the
    running mean keep it (1.4e-5, the float32 rounding of x - mu near 1e3)."""
    g = torch.Generator().manual_seed(3)
    T = 600
    x = (torch.randn(2, 16, T, generator=g, dtype=F64) + torch.where(torch.arange(T) < 100, 0.0, 1e3)).to(F32)
    assert_rel(run(name, x, eps=1e-5), ref(name, x, eps=1e-5), 1e-4, name)


def test_float64_ema_that_forgets_frame_0_is_exact():
    """ccemaln, decay 1e-3, a step of 1e4 after frame 20, float64: the running spread is a decayed sum of
    squared differences of means (Welford's recurrence), so it matches a frame-by-frame Chan fold to float64's
    rounding of x - mu near 1e4 against a spread of 0.03 (4e-9; the earlier Chan scan: 2e-9); sums of
    (x - K)^2 about frame 0 lost (mu - K)^2 / var of the digits (1.9e-4 off)."""
    g = torch.Generator().manual_seed(1)
    T, d, eps = 100, 1e-3, 1e-8
    x = torch.randn(1, 3, T, generator=g, dtype=F64) + torch.where(torch.arange(T) < 20, 0.0, 1e4)
    acc, want = normlib.NormState.empty((1, 3)), []
    for t in range(T):
        acc = normlib.merge(acc, normlib.NormState(torch.ones(1, 3, dtype=F64), x[..., t], torch.zeros(1, 3, dtype=F64)), d)
        var = torch.where(acc.w > 1, acc.var, 1)
        want.append((x[..., t] - acc.m) / (var + eps).sqrt())
    assert_rel(run("ccemaln", x, eps=eps, decay=d), torch.stack(want, -1), 1e-8, "ccemaln")


@pytest.mark.parametrize("case", ["dc", "against the shift"])
@pytest.mark.parametrize("name", ["gln", "instln", "frameln"])
def test_the_native_kernels_keep_their_digits(name, case):
    """gln and instln run GroupNorm's kernels, frameln LayerNorm's, whose float32 moments lose digits in the
    distance of the mean from 0 (a DC offset of 1e4: 4e-4 of y): shifted by the median of 17 sampled frames
    (GLOBAL; not where that median is near 0 in its spreads) or by each frame's channel 0 (FRAME), they keep
    the reference's. Data built against the shifts: every sampled frame at 0 and every other one at 1e4 (the
    median and its spread say "no shift", and the zeros widen the spread of the whole, so GroupNorm keeps its
    digits); channel 0 at 1e4 and the others 1e4 + 100 (FRAME)."""
    g = torch.Generator().manual_seed(6)
    T = 1000
    x = torch.randn(2, 8, T, generator=g, dtype=F64) + 1e4
    if case != "dc" and name == "frameln":
        x[:, 1:] += 100
    elif case != "dc":
        sampled = torch.zeros(T, dtype=torch.bool)
        sampled[::(T - 1) // 16] = True
        x = torch.where(sampled, 0.0, x)
    x = x.to(F32)
    assert_rel(run(name, x), ref(name, x), 1e-6, name)


@pytest.mark.parametrize("sigmas", [7.9, 8.1, 300.0])
def test_frameln_skips_its_shift_only_where_layernorm_keeps_the_digits(sigmas, monkeypatch):
    """On the CPU frameln takes LayerNorm's result unshifted where every frame's mean is within 8 of its standard
    deviations from 0 (LayerNorm's own statistics say so), else shifts each frame by its channel 0 and runs it
    again: frames at 7.9, 8.1 and 300 deviations from 0 keep the reference's digits either way, and the second
    run happens exactly past 8."""
    from normlib.backends import cpu
    monkeypatch.setattr(cpu, "AVAILABLE", False)  # "b c t" frames run the compiled loops where numba is
    monkeypatch.setattr(normlib.functional, "_CALLS", {})
    calls = []
    real = torch.nn.functional.layer_norm
    monkeypatch.setattr(torch.nn.functional, "layer_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(8)
    C, T = 64, 50
    z = torch.randn(2, C, T, generator=g, dtype=F64)
    z = (z - z.mean(1, keepdim=True)) / z.std(1, correction=0, keepdim=True)  # each frame: mean 0, std 1
    x = (z * 0.5 + 0.5 * sigmas).to(F32)  # mean sigmas / 2 over a std of 1 / 2
    assert_rel(run("frameln", x), ref("frameln", x), 1e-6, "frameln")
    assert len(calls) == (sigmas > 8)


@pytest.mark.parametrize("name", ["gln", "instln"])
def test_global_norms_keep_their_digits_when_frame_0_is_far_from_the_rest(name):
    """Frame 0 at 0, 2999 frames at 1e4 (silence, then a level): the mean's float32 rounding is corrected by
    the deviations' own mean, and the squares are summed by torch.sum's cascade (vector_norm's float32
    accumulation left 1.1e-5 of y for gln)."""
    g = torch.Generator().manual_seed(5)
    T = 3000
    x = (torch.randn(2, 8, T, generator=g, dtype=F64) + torch.where(torch.arange(T) < 1, 0.0, 1e4)).to(F32)
    assert_rel(run(name, x), ref(name, x), 1e-6, name)


# ---------------------------------------------------------------------------------------------------
# A per-channel causal norm without lengths (pytorch._running_chan)
# ---------------------------------------------------------------------------------------------------
FEW_CHAN = [pytest.param("ccln", 1.0, id="ccln"), pytest.param("ccemaln", 0.999, id="ccemaln-0.999"),
            pytest.param("ccemaln", 0.9, id="ccemaln-0.9"), pytest.param("ccemaln", 0.3, id="ccemaln-0.3")]


def _few_chan_kw(name, decay):
    return {"decay": decay} if name in EMA else {}


def _count_few_chan(monkeypatch, loops=False):
    """A list that grows by one at each call of _running_chan, the torch path (the compiled CPU loops turned off),
    or with ``loops`` of the loops' per-channel forward."""
    from normlib.backends import cpu
    taken = []
    if loops and not cpu.AVAILABLE:
        pytest.skip("numba is not installed")
    module, fn = (cpu, "forward_channels") if loops else (pytorch_backend, "_running_chan")
    real = getattr(module, fn)
    monkeypatch.setattr(module, fn, lambda *a: taken.append(1) or real(*a))
    monkeypatch.setattr(cpu, "AVAILABLE", loops)
    monkeypatch.setattr(normlib.functional, "_CALLS", {})  # a signature's path is chosen when it is prepared
    return taken


LOOPS = [pytest.param(False, id="torch"), pytest.param(True, id="loops")]


def _sequential(x, state, decay, eps=1e-8, shift=0.0):
    """Chan's merge of the state with each frame in turn, float64 (DESIGN.md section 1 as written): y and the
    state after the last frame of a per-channel causal norm. ``shift``: taken from x and the state's mean first
    (exact where both are near it), for y's digits where the spread is small."""
    B, C, T = x.shape
    x = x.double() - shift
    s = normlib.NormState.empty((B, C)) if state is None else normlib.NormState(
        state.w.double(), state.m.double() - shift, state.m2.double())
    one = torch.ones(B, C, dtype=F64)
    ys = []
    for t in range(T):
        s = normlib.state.merge(s, normlib.NormState(one, x[..., t].double(), 0 * one), decay)
        var = torch.where(s.w > 1, s.m2 / s.w, 1)
        ys.append((x[..., t].double() - s.m) / torch.sqrt(var + eps))
    return torch.stack(ys, -1), normlib.NormState(s.w, s.m + shift, s.m2)


@pytest.mark.parametrize("T", [1, 5, 64])
@pytest.mark.parametrize("dtype,loops", [(F32, False), (F64, False), (BF16, False), (F32, True), (F64, True)],
                         ids=["float32-torch", "float64-torch", "bfloat16-torch", "float32-loops", "float64-loops"])
@pytest.mark.parametrize("name,decay", FEW_CHAN)
def test_a_few_frames_of_a_per_channel_norm_match_the_reference(name, decay, dtype, loops, T, monkeypatch):
    """A per-channel call of a few frames runs Welford's recurrence for all frames at once (the torch path, or the
    compiled CPU loops for float32 and float64): y and the state against the float64 oracle, 1e4 from zero, from a
    state near the data, from none and from one of weight 0 (whose mean is far from the data), and x left as it
    was."""
    taken = _count_few_chan(monkeypatch, loops)
    g = torch.Generator().manual_seed(7)
    B, C = 2, 5
    x = make_x(B, C, T, generator=g, offset=1e4).to(dtype)
    x0 = x.clone()
    w, b = make_affine(C, F32, generator=g)
    near = make_state(name, B, C, generator=g)
    near = normlib.NormState(near.w, near.m + 1e4, near.m2)
    empty = normlib.NormState(0 * near.w, near.m - 3e4, 0 * near.m2)
    for st in (near, None, empty):
        kw = dict(state=st, return_state=T > 1, **_few_chan_kw(name, decay))
        with torch.no_grad():
            out = run(name, x, w, b, **kw)
        out_r = ref(name, x.double(), w, b, **kw)
        y, y_r = (out[0], out_r[0]) if T > 1 else (out, out_r)
        assert y.dtype == dtype and y.shape == x.shape
        assert_rel(y, y_r, TOL[dtype], f"{name} y")
        if T > 1:
            assert out[1].dtype == STATE_DTYPE and out[1].shape == (B, C)
            # bf16 rounds x 1e4 from zero to steps of 64, so frames repeat: m2 ~1e-29 there, judged absolutely
            assert_state_close(out[1], out_r[1], 1e-12, f"{name} state", floor=dtype == BF16)
        assert torch.equal(x, x0)
    assert len(taken) == 3


@pytest.mark.parametrize("T", [5, 64])
@pytest.mark.parametrize("name,decay", FEW_CHAN + [pytest.param("ccemaln", 0.01, id="ccemaln-0.01")])
@pytest.mark.parametrize("loops", LOOPS)
def test_a_few_frames_of_a_per_channel_norm_after_a_heavy_far_state(name, decay, T, loops, monkeypatch):
    """A state of a million frames' weight 1e4 from the data (forgotten within the call by the fast EMAs), and a
    light one far from it: y and
    the state against Chan's merge frame by frame in float64, to float64's digits (the float64 reference's
    sums of squares lose some 1e-10 here; a shift by the state's mean where the EMA forgets it cost y 4e-12 and
    M2 3e-12)."""
    taken = _count_few_chan(monkeypatch, loops)
    g = torch.Generator().manual_seed(8)
    B, C = 2, 4
    x = make_x(B, C, T, dtype=F64, generator=g, offset=1e4)
    st = make_state(name, B, C, generator=g)
    y, s = run(name, x, state=normlib.NormState(st.w * 1e6, st.m, st.m2 * 1e6), return_state=True,
               **_few_chan_kw(name, decay))
    y_r, s_r = _sequential(x, normlib.NormState(st.w * 1e6, st.m, st.m2 * 1e6), decay)
    assert_rel(y, y_r, 1e-12, f"{name} y")
    assert_state_close(s, s_r, 1e-12, f"{name} state")
    assert rel_err(s.m, s_r.m) <= 1e-14, "the returned mean keeps the state's digits"
    # and a light one (1e-3 frames' weight) 1e3 from the data: the kernels' LIGHT case
    light = normlib.NormState(st.w * 1e-3, st.m + 1e4 + 1e3, st.m2 * 1e-3)
    y, s = run(name, x, state=light, return_state=True, **_few_chan_kw(name, decay))
    y_r, s_r = _sequential(x, light, decay, shift=1e4)
    assert_rel(y, y_r, 1e-12, f"{name} y, light state")
    assert_state_close(s, s_r, 1e-12, f"{name} state, light state")
    assert len(taken) == 2


@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("name,decay", FEW_CHAN)
def test_a_few_frames_of_a_per_channel_norm_give_the_reference_gradients(name, decay, eps_mode, monkeypatch):
    """The short path also runs under autograd (it is faster there too): the gradients of x, the affine parameters
    and the state's m and m2 (through y and the returned state) against the float64 oracle's, with a state of
    weight 0 in one row."""
    taken = _count_few_chan(monkeypatch)
    g = torch.Generator().manual_seed(9)
    B, C, T = 3, 4, 6
    x = make_x(B, C, T, dtype=F64, generator=g, offset=3.0)
    w, b = make_affine(C, F64, generator=g)
    st = make_state(name, B, C, generator=g, empty_rows=(1,))
    kw = dict(return_state=True, eps_mode=eps_mode, **_few_chan_kw(name, decay))
    grads = []
    for fn in (run, ref):
        leaves = [t.clone().requires_grad_() for t in (x, w, b, st.m, st.m2)]
        y, s = fn(name, *leaves[:3], state=normlib.NormState(st.w, *leaves[3:]), **kw)
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        grads.append(torch.autograd.grad((y * gy).sum() + s.m.sum() + (s.m2 * 0.1).sum(), leaves))
    for k, (a, e) in enumerate(zip(*grads)):
        assert_rel(a, e, 1e-9, f"{name} gradient {k}")
    assert len(taken) == 1


def test_per_channel_calls_outside_the_short_path_take_the_general_one(monkeypatch):
    """Lengths, one frame with a state out (_one_frame), or a pooled norm: not _running_chan; any T, in blocks of
    channels or not, with or without autograd: _running_chan."""
    taken = _count_few_chan(monkeypatch)
    x = torch.randn(2, 4, 6)
    run("ccln", x, lengths=torch.tensor([6, 3]), return_state=True)
    run("ccemaln", x[..., :1], return_state=True, decay=0.9)
    for name in ("cln", "emaln"):
        run(name, x, return_state=True)
    assert not taken
    run("ccemaln", x, return_state=True, decay=0.9)
    run("ccln", torch.randn(1, 4, pytorch_backend.FEW_FRAMES + 1), return_state=True)
    run("ccln", torch.randn(2, 4, 6, requires_grad=True))  # twice: _ChanNorm's forward runs it without autograd
    assert len(taken) == 4


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("name,decay", FEW_CHAN)
def test_a_per_channel_norm_in_blocks_of_channels_matches_the_reference(name, decay, eps_mode, layout, monkeypatch):
    """Blocks of 2 channels of 5 (a last block of 1) on the CPU: y, the state and every gradient against the float64
    oracle, 1e4 from zero, from no state (a training step's _ChanNorm: its own backward) and from a state (autograd
    through the blocks), with and without autograd alike."""
    monkeypatch.setattr(pytorch_backend, "CHAN_BLOCK", 2 * 3 * 40)  # B T values: blocks of 2 channels
    g = torch.Generator().manual_seed(11)
    B, C, T = 3, 5, 40
    x = make_x(B, C, T, layout, dtype=F64, generator=g, offset=1e4)
    w, b = make_affine(C, F64, generator=g)
    kw = dict(eps_mode=eps_mode, layout=layout, **_few_chan_kw(name, decay))
    gy = torch.randn(x.shape, generator=g, dtype=F64)
    for st in (None, make_state(name, B, C, generator=g, empty_rows=(1,))):
        skw = dict(kw, state=None if st is None else normlib.NormState(st.w, st.m + 1e4, st.m2),
                   return_state=st is not None)
        grads, ys = [], []
        for fn in (run, ref):
            leaves = [t.clone().requires_grad_() for t in (x, w, b)]
            out = fn(name, *leaves, 1e-5, **skw)
            y, s = out if st is not None else (out, None)
            loss = (y * gy).sum() + (0 if s is None else s.m.sum() + s.m2.sum())
            grads.append(torch.autograd.grad(loss, leaves))
            ys.append((y, s))
        # the oracle's own sums lose some 1e-12 at 1e4 from zero
        assert_rel(ys[0][0], ys[1][0], 1e-10, f"{name} y")
        if st is not None:
            assert_state_close(ys[0][1], ys[1][1], 1e-10, f"{name} state")
        for k, (a, e) in enumerate(zip(*grads)):
            assert_rel(a, e, 1e-9, f"{name} gradient {k}, state {st is not None}")
        with torch.no_grad():
            out = run(name, x, w, b, 1e-5, **skw)
        assert_rel(out if st is None else out[0], ys[1][0], 1e-10, f"{name} y without autograd")


@pytest.mark.parametrize("eps", [0.0, 1e-8])
@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("loops", LOOPS)
def test_a_few_frames_of_a_per_channel_norm_give_beta_where_a_channel_has_one_value(eps, eps_mode, loops,
                                                                                     monkeypatch):
    """Frame 0 after no state (or one of weight 0) is its own mean: y = beta there, also with eps = 0, and the
    reference's values elsewhere."""
    taken = _count_few_chan(monkeypatch, loops)
    x = make_x(2, 3, 4, dtype=F64)
    w, b = make_affine(3, F64)
    st = make_state("ccln", 2, 3, empty_rows=(0,))
    for state in (None, st):
        with torch.no_grad():
            y = run("ccln", x, w, b, eps, state=state, eps_mode=eps_mode)
        assert torch.equal(y[0, :, 0], b) and (state is not None or torch.equal(y[1, :, 0], b))
        assert_rel(y, ref("ccln", x, w, b, eps, state=state, eps_mode=eps_mode), TOL[F64], "ccln y")
    assert len(taken) == 2



def _strided(x, how):
    """x's values in another memory order: "b t c" storage, or every other frame of a longer tensor."""
    if how == "channels-last":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if how == "gapped":
        return torch.stack([x, torch.zeros_like(x)], -1).flatten(-2)[..., ::2]
    return x


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name,decay", [("ccln", None), ("ccemaln", 0.9)])
@pytest.mark.parametrize("shape,slope", [((2, 8, 3000), 0.5), ((2, 64, 499), 0.6)], ids=str)
def test_per_channel_gradients_keep_their_digits_where_the_mean_drifts_far_from_the_shift(name, decay, layout,
                                                                                          shape, slope):
    """The per-channel loops' backward recomputes x - mu in float64 from the moments entering each tile, as the
    forward did: a mu 1500 from K (a ramp under a short EMA, whose spread stays about 2) rounded to float32 would
    cost dx 1e-4; and r keeps float64's digits (float32's root alone, 1e-7 of r, cost dx 2.7e-7 at (2, 64, 499))."""
    gen = torch.Generator().manual_seed(3)
    B, C, T = shape
    x64 = torch.arange(T, dtype=F64) * slope + 1e3 + torch.randn(B, C, T, generator=gen, dtype=F64)
    gy = torch.randn(B, C, T, generator=gen, dtype=F64)
    perm = (lambda t: t) if layout == "b c t" else (lambda t: t.transpose(1, 2))
    x = perm(x64).float().requires_grad_()
    y = run(name, x, decay=decay, layout=layout)
    gx, = torch.autograd.grad(y, x, perm(gy).float())
    xr = x64.float().double().requires_grad_()  # the float32 input's own values
    yr = normlib.reference.REFERENCES[name](xr, **({} if decay is None else {"decay": decay}))
    gr, = torch.autograd.grad(yr, xr, gy)
    assert rel_err(perm(y), yr) < 1e-6
    assert rel_err(perm(gx), gr) < 1e-7  # 3.9e-8 (7.7e-8 when the backward read float32 x - mu and r)


@pytest.mark.parametrize("loops", [True, False], ids=["loops", "torch ops"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("scale", [1e16, 1e-17], ids=["var 1e32", "var 1e-34"])
def test_per_channel_frames_outside_the_fast_roots_range_take_the_exact_root(scale, dtype, loops, monkeypatch):
    """The per-channel loops take float32's root (and a Newton step) where var + eps lies within 1e-30 to 1e30;
    a frame with any channel outside (values of 1e16, or of 1e-17) takes the exact root, forward and in the
    backward's recompute. With eps 0 the norm is scale-free: y and scale x dx are the reference's of x / scale
    (the reference's own dx at 1e16 loses frame 0's to the rounding of its largest term, 1e32 times it). The
    torch ops' backward (_ChanNorm, without numba) too: it added g r and frame 0's own term of the suffix sum,
    -g r, apart, and at 1e16 its dx was 7 % off (frame 0's 2.4 times the mean |dx|)."""
    from normlib.backends import cpu
    if loops and not cpu.AVAILABLE:
        pytest.skip("numba is not installed")
    monkeypatch.setattr(cpu, "AVAILABLE", loops)
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(2, 70, 40, generator=gen, dtype=F64) * scale).to(dtype).requires_grad_()
    gy = torch.randn(2, 70, 40, generator=gen, dtype=F64)
    y = run("ccln", x, eps=0.0)
    assert ("CpuLoops" if loops else "ChanNorm") in type(y.grad_fn).__name__
    gx, = torch.autograd.grad(y, x, gy.to(dtype))
    xr = (x.detach().double() / scale).requires_grad_()
    yr = normlib.reference.REFERENCES["ccln"](xr, eps=0.0)
    gr, = torch.autograd.grad(yr, xr, gy)
    tol = 1e-12 if dtype == F64 else 1e-6
    assert rel_err(y, yr) < tol and rel_err(gx.double() * scale, gr) < tol


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_per_channel_loops_keep_two_numbers_a_channel_a_tile_for_the_backward(layout):
    """What a per-channel layer keeps until its backward, beside x: each tile's incoming mean and M2 (float64,
    two numbers a channel every TILE frames), not arrays of x's size; and the backward from them is the
    reference's (T = 1000: a last tile of 8 frames)."""
    from normlib.backends import cpu
    if not cpu.AVAILABLE:
        pytest.skip("numba is not installed")
    gen = torch.Generator().manual_seed(5)
    B, C, T = 2, 8, 1000
    x64 = make_x(B, C, T, generator=gen, offset=1e4)
    gy = torch.randn(B, C, T, generator=gen, dtype=F64)
    perm = (lambda t: t) if layout == "b c t" else (lambda t: t.transpose(1, 2))
    x = perm(x64).float().requires_grad_()
    y = run("ccln", x, layout=layout)
    node = y.grad_fn
    while type(node).__name__ != "_CpuLoopsBackward":  # past a layout's transpose
        node = node.next_functions[0][0]
    kept = node.stats[0]
    assert kept.dtype == np.float64 and kept.size == B * C * 2 * -(-T // cpu.TILE)
    assert kept.nbytes * 3 < x.numel() * x.element_size()  # a quarter of float32 x (the two arrays: twice x)
    gx, = torch.autograd.grad(y, x, perm(gy).float())
    xr = x64.float().double().requires_grad_()
    gr, = torch.autograd.grad(normlib.reference.REFERENCES["ccln"](xr), xr, gy)
    assert rel_err(perm(gx), gr) < 1e-6


@pytest.mark.parametrize("how", ["contiguous", "channels-last", "gapped"])
@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("name", ["cln", "emaln", "ccln", "ccemaln", "frameln"])
# (2, 70, 5): per channel, a block of 64 channels and one of 6; (1, 40, 1030): rows 4 KiB apart, blocks of 32 and 8
@pytest.mark.parametrize("shape", [(2, 5, 17), (1, 1, 9), (3, 4, 1), (1, 3, 70), (2, 70, 5), (1, 40, 1030)], ids=str)
def test_cpu_loops_match_the_general_path(name, shape, eps_mode, how, monkeypatch):
    """The compiled CPU loops (backends/cpu.py) against the torch ops they replace, forward and every gradient,
    with a state in and out where autograd allows it (a state's gradients stay on the general path), DC offset
    1e4; and the loops are the path taken."""
    from normlib.backends import cpu
    if not cpu.AVAILABLE:
        pytest.skip("numba is not installed")
    gen = torch.Generator().manual_seed(sum(shape))
    B, C, T = shape
    x0 = _strided(make_x(B, C, T, generator=gen, offset=1e4), how)
    w, b = make_affine(C, F32, gen)
    state = make_state(name, B, C, generator=gen)
    gy = torch.randn(shape, generator=gen)
    calls = []
    kernel = "forward_channels" if name.startswith("cc") else "forward"
    real = getattr(cpu, kernel)

    def counted(*a):
        calls.append(1)
        return real(*a)

    def both(**kw):
        out = []
        for loops in (True, False):
            monkeypatch.setattr(cpu, "AVAILABLE", loops)
            monkeypatch.setattr(cpu, kernel, counted if loops else real)
            x, wi, bi = (t.clone().requires_grad_() for t in (x0, w, b))
            y, s = run(name, x, wi, bi, 1e-5, eps_mode=eps_mode, return_state=True, **kw) if kw else \
                (run(name, x, wi, bi, 1e-5, eps_mode=eps_mode), None)
            y.backward(gy)
            out.append((y, x.grad, wi.grad, bi.grad))
            with torch.no_grad():
                out[-1] += run(name, x0, w, b, 1e-5, eps_mode=eps_mode, return_state=True, state=state)
        return out

    n0 = len(calls)
    (y, dx, dw, db, ys, s), (y_, dx_, dw_, db_, ys_, s_) = both()
    # the training call (but frameln's in "b t c" memory: LayerNorm's) and the streaming one (one frame too)
    rows = not x0.is_contiguous() and x0.transpose(1, 2).is_contiguous()
    assert len(calls) - n0 == (1 if name == "frameln" and rows else 2)
    for a, r, what in ((y, y_, "y"), (dx, dx_, "dx"), (dw, dw_, "dweight"), (db, db_, "dbias"), (ys, ys_, "y, state")):
        assert_rel(a, r, 2e-6, what, floor=1e-3)
    for a, r, what in zip(s, s_, ("w", "m", "m2")):
        assert a.dtype == r.dtype == F64
        assert_rel(a, r, 1e-6, what, floor=1e-3)


@pytest.mark.parametrize("name", ["cln", "ccemaln"])
def test_a_streams_hops_read_the_state_as_it_is_now(name):
    """A streaming hop on the CPU loops (one prepared call for like layers, numpy views of the state's fields)
    equals a fresh layer's on a copy of the same state: along two streams of like layers hop by hop, after
    the state is written in place, transposed in place, or its memory replaced, for another state and an older
    one, after an in-place step on the weight. (A cache of the views between hops must keep all of these.)"""
    torch.manual_seed(0)
    layers = [normlib.create(name, 6) for _ in range(2)]
    fresh = normlib.create(name, 6)
    xs = torch.randn(10, 6, 6, 1) + 3  # B = C: a per-channel state's fields are square

    def hop(layer, x, state):
        fresh.load_state_dict(layer.state_dict())
        want = fresh(x, state=normlib.NormState(*(t.clone() for t in state)), return_state=True)
        got = layer(x, state=state, return_state=True)
        assert_rel(got[0], want[0], 1e-6, name)
        for a, b in zip(got[1], want[1]):
            assert torch.equal(a, b)
        return got[1]

    with torch.no_grad():
        states = [layer(xs[0], return_state=True)[1] for layer in layers]
        older = states[0]
        for i, x in enumerate(xs[1:]):
            s = states[0]
            if i == 2:
                s.m.add_(5.0)  # written in place
            if i == 3:
                s.m.t_()  # transposed in place (per channel: the same shape, another layout)
            if i == 4:
                s.m.data = s.m.data + 1.0  # the memory replaced, no version bump
            if i == 5:
                s = normlib.NormState(s.w.clone(), s.m.clone(), s.m2.clone())  # another state
            if i == 6:
                s = older  # an older state of this stream
            if i == 7:
                layers[0].weight.mul_(2.0)  # an optimizer's step
            states = [hop(layers[0], x, s), hop(layers[1], x.flip(0), states[1])]
