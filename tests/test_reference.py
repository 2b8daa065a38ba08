"""The float64 references are the oracle of every other test: check them against the math of DESIGN.md
section 1 written out naively (loops, two-pass statistics), against the merge, and against torch.nn."""
import pytest
import torch
from torch import nn

import normlib
from normlib import reference as R
from normlib import backends
from conftest import CAUSAL, EMA, GLOBAL, NORMS, SPECS, make_affine, make_state, make_x

F64 = torch.float64
TIGHT = dict(rtol=1e-11, atol=1e-12)


def _decay(name, decay):
    return {"frame": 0.0, "cumulative": 1.0, "ema": decay, "global": None}[SPECS[name].time.value]


def naive_running(x, weight, bias, eps, *, per_channel, decay, eps_mode, lengths, state):
    """Frame tau <= t weighs decay^(t - tau); the incoming state is a pseudo-frame -1 of weight
    decay^(t + 1) * w0. Two-pass weighted mean and variance, straight from the definition."""
    B, C, T = x.shape
    y = torch.zeros_like(x)
    groups = [[c] for c in range(C)] if per_channel else [list(range(C))]
    sw = torch.zeros(B, len(groups), dtype=F64)
    sm, sm2 = sw.clone(), sw.clone()
    for b in range(B):
        L = T if lengths is None else int(lengths[b])
        for g, G in enumerate(groups):
            if state is not None:
                w0, m0, M0 = (s[b, g] if per_channel else s[b] for s in state)
            else:
                w0 = m0 = M0 = torch.zeros((), dtype=F64)
            sw[b, g], sm[b, g], sm2[b, g] = w0, m0, M0
            for t in range(L):
                vals = x[b, G, : t + 1]  # (|G|, t + 1)
                wts = torch.tensor([decay ** (t - tau) for tau in range(t + 1)], dtype=F64).expand_as(vals)
                dw0 = decay ** (t + 1) * w0
                W = wts.sum() + dw0
                mu = ((wts * vals).sum() + dw0 * m0) / W
                M2 = (wts * (vals - mu) ** 2).sum() + decay ** (t + 1) * M0 + dw0 * (m0 - mu) ** 2
                var = M2 / W
                if eps_mode == "inside":
                    yt = (x[b, G, t] - mu) / torch.sqrt(var + eps)
                else:
                    yt = (x[b, G, t] - mu) / (torch.sqrt(var) + eps)
                if weight is not None:
                    yt = yt * weight[G]
                if bias is not None:
                    yt = yt + bias[G]
                y[b, G, t] = yt
                sw[b, g], sm[b, g], sm2[b, g] = W, mu, M2
    if not per_channel:
        sw, sm, sm2 = sw[:, 0], sm[:, 0], sm2[:, 0]
    return y, normlib.NormState(sw, sm, sm2)


def naive_global(x, weight, bias, eps, *, per_channel, eps_mode, lengths):
    B, C, T = x.shape
    y = torch.zeros_like(x)
    groups = [[c] for c in range(C)] if per_channel else [list(range(C))]
    for b in range(B):
        L = T if lengths is None else int(lengths[b])
        if L == 0:
            continue
        for G in groups:
            v = x[b, G, :L]
            mu = v.mean()
            var = ((v - mu) ** 2).mean()
            den = torch.sqrt(var + eps) if eps_mode == "inside" else torch.sqrt(var) + eps
            yt = (v - mu) / den
            if weight is not None:
                yt = yt * weight[G, None]
            if bias is not None:
                yt = yt + bias[G, None]
            y[b, G, :L] = yt
    return y


def _ref_kw(name, decay):
    return {"decay": decay} if name in EMA else {}


@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("name", CAUSAL)
def test_running_reference_matches_definition(name, with_lengths, with_state, eps_mode):
    B, C, T = 3, 4, 7
    x = make_x(B, C, T, dtype=F64, offset=0.3)
    w, b = make_affine(C, F64)
    lengths = torch.tensor([T, 3, 0]) if with_lengths else None
    state = make_state(name, B, C, F64) if with_state else None
    decay = 0.7
    y, s = getattr(R, name)(x, w, b, 1e-3, eps_mode=eps_mode, lengths=lengths, state=state,
                            return_state=True, **_ref_kw(name, decay))
    y_n, s_n = naive_running(x, w, b, 1e-3, per_channel=SPECS[name].per_channel,
                             decay=_decay(name, decay), eps_mode=eps_mode, lengths=lengths, state=state)
    torch.testing.assert_close(y, y_n, **TIGHT)
    assert y.dtype == F64 and s.w.dtype == F64
    for field, a, e in zip(normlib.NormState._fields, s, s_n):
        torch.testing.assert_close(a, e, **TIGHT, msg=f"state.{field}")
    # without return_state: the same y alone
    y2 = getattr(R, name)(x, w, b, 1e-3, eps_mode=eps_mode, lengths=lengths, state=state, **_ref_kw(name, decay))
    assert torch.equal(y2, y)


@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("name", GLOBAL)
def test_global_reference_matches_definition(name, affine, with_lengths, eps_mode):
    B, C, T = 3, 5, 9
    x = make_x(B, C, T, dtype=F64, offset=-0.4)
    w, b = make_affine(C, F64) if affine else (None, None)
    lengths = torch.tensor([T, 4, 0]) if with_lengths else None
    y = getattr(R, name)(x, w, b, 1e-3, eps_mode=eps_mode, lengths=lengths)
    y_n = naive_global(x, w, b, 1e-3, per_channel=SPECS[name].per_channel, eps_mode=eps_mode, lengths=lengths)
    torch.testing.assert_close(y, y_n, **TIGHT)


@pytest.mark.parametrize("d", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("T", [1, 2, 5, 8, 13])
def test_decayed_cumsum(T, d):
    v = torch.randn(2, 3, T, dtype=F64)
    expected = torch.zeros_like(v)
    for t in range(T):
        for tau in range(t + 1):
            expected[..., t] += d ** (t - tau) * v[..., tau]
    torch.testing.assert_close(R.decayed_cumsum(v, d), expected, **TIGHT)


@pytest.mark.parametrize("name", CAUSAL)
def test_reference_state_is_the_fold_of_frame_merges(name):
    """The returned state is merge(...merge(merge(s_in, f_0), f_1)..., f_{L-1}) with the norm's decay."""
    B, C, T = 2, 3, 6
    per_channel = SPECS[name].per_channel
    x = make_x(B, C, T, dtype=F64)
    state = make_state(name, B, C, F64)
    decay = _decay(name, 0.6)
    _, s = getattr(R, name)(x, state=state, return_state=True, **_ref_kw(name, 0.6))
    acc = state
    for t in range(T):
        xt = x[..., t]
        if per_channel:
            f = normlib.NormState(torch.ones_like(xt), xt, torch.zeros_like(xt))
        else:
            m = xt.mean(1)
            f = normlib.NormState(torch.full_like(m, C), m, ((xt - m[:, None]) ** 2).sum(1))
        acc = normlib.merge(acc, f, decay)
    for field, a, e in zip(normlib.NormState._fields, s, acc):
        torch.testing.assert_close(a, e, **TIGHT, msg=f"state.{field}")


# ---------------------------------------------------------------------------------------------------
# Identities
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pair", [("emaln", "cln"), ("ccemaln", "ccln")], ids=["emaln", "ccemaln"])
def test_reference_ema_decay_one_is_cumulative(pair):
    ema, cum = pair
    x = make_x(2, 4, 11, dtype=F64)
    w, b = make_affine(4, F64)
    state = make_state(ema, 2, 4, F64)
    lengths = torch.tensor([11, 6])
    y1, s1 = getattr(R, ema)(x, w, b, decay=1.0, lengths=lengths, state=state, return_state=True)
    y2, s2 = getattr(R, cum)(x, w, b, lengths=lengths, state=state, return_state=True)
    torch.testing.assert_close(y1, y2, **TIGHT)
    for a, e in zip(s1, s2):
        torch.testing.assert_close(a, e, **TIGHT)


def test_reference_ema_decay_zero_is_frameln():
    x = make_x(2, 4, 11, dtype=F64)
    w, b = make_affine(4, F64)
    state = make_state("emaln", 2, 4, F64)
    lengths = torch.tensor([11, 6])
    y1, s1 = R.emaln(x, w, b, decay=0.0, lengths=lengths, state=state, return_state=True)
    y2, s2 = R.frameln(x, w, b, lengths=lengths, state=state, return_state=True)
    torch.testing.assert_close(y1, y2, **TIGHT)
    for a, e in zip(s1, s2):
        torch.testing.assert_close(a, e, **TIGHT)


def test_reference_gln_is_groupnorm():
    C = 6
    x = make_x(3, C, 13, dtype=F64, offset=2.0)
    gn = nn.GroupNorm(1, C, eps=1e-5, dtype=F64)
    with torch.no_grad():
        gn.weight.copy_(make_affine(C, F64)[0])
        gn.bias.copy_(make_affine(C, F64)[1])
    torch.testing.assert_close(R.gln(x, gn.weight, gn.bias, 1e-5), gn(x), **TIGHT)


def test_reference_instln_is_instancenorm():
    C = 6
    x = make_x(3, C, 13, dtype=F64, offset=2.0)
    inorm = nn.InstanceNorm1d(C, eps=1e-5, affine=True, dtype=F64)
    with torch.no_grad():
        inorm.weight.copy_(make_affine(C, F64)[0])
        inorm.bias.copy_(make_affine(C, F64)[1])
    torch.testing.assert_close(R.instln(x, inorm.weight, inorm.bias, 1e-5), inorm(x), **TIGHT)


def test_reference_frameln_is_layernorm_over_channels():
    C = 6
    x_btc = make_x(3, C, 13, layout="b t c", dtype=F64, offset=2.0)
    ln = nn.LayerNorm(C, eps=1e-5, dtype=F64)
    with torch.no_grad():
        ln.weight.copy_(make_affine(C, F64)[0])
        ln.bias.copy_(make_affine(C, F64)[1])
    y = R.frameln(x_btc, ln.weight, ln.bias, 1e-5, layout="b t c")
    torch.testing.assert_close(y, ln(x_btc), **TIGHT)


@pytest.mark.parametrize("name", NORMS)
def test_reference_reads_and_writes_either_layout(name):
    """layout="b t c": x read as (B, T, C), y given as (B, T, C), the state as in "b c t"."""
    x = make_x(2, 5, 11, dtype=F64)
    kw = dict(return_state=True) if SPECS[name].causal else {}
    f = R.REFERENCES[name]
    got, want = f(x.transpose(1, 2), layout="btc", **kw), f(x, **kw)
    if kw:
        (got, s_got), (want, s_want) = got, want
        for a, b in zip(s_got, s_want):
            assert torch.equal(a, b)
    assert torch.equal(got, want.transpose(1, 2))
    with pytest.raises(ValueError, match=r"layout must be one of"):
        f(x, layout="c t")


# ---------------------------------------------------------------------------------------------------
# Other properties of the oracle
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NORMS)
def test_reference_keeps_dtype(name, dtype):
    x = make_x(2, 3, 5, dtype=dtype)
    kw = {"return_state": True} if SPECS[name].causal else {}
    out = getattr(R, name)(x, **kw)
    y = out[0] if kw else out
    assert y.dtype == dtype and y.shape == x.shape
    if kw:
        assert all(t.dtype == F64 for t in out[1])  # states are float64 whatever the input


@pytest.mark.parametrize("name", NORMS)
def test_reference_padding_is_zero_and_excluded(name):
    B, C, T = 2, 3, 8
    x = make_x(B, C, T, dtype=F64)
    lengths = torch.tensor([5, 0])
    y = getattr(R, name)(x, lengths=lengths)
    assert torch.equal(y[0, :, 5:], torch.zeros_like(y[0, :, 5:]))
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    x2 = x.clone()
    x2[0, :, 5:] = 1e3 * torch.randn(C, T - 5, dtype=F64)
    x2[1] = -7.0
    torch.testing.assert_close(getattr(R, name)(x2, lengths=lengths), y, **TIGHT)
    torch.testing.assert_close(y[:1, :, :5], getattr(R, name)(x[:1, :, :5]), **TIGHT)


@pytest.mark.parametrize("name", CAUSAL)
def test_reference_is_causal(name):
    x = make_x(2, 4, 16, dtype=F64)
    y = getattr(R, name)(x)
    for t in (1, 5, 15):
        x2 = x.clone()
        x2[..., t:] = 10 * torch.randn_like(x2[..., t:]) + 3
        y2 = getattr(R, name)(x2)
        torch.testing.assert_close(y2[..., :t], y[..., :t], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(y2[..., t:], y[..., t:])


def test_reference_dc_offset_float64():
    """The oracle itself: a DC offset of 1e4 changes no output (the shift K is exact in float64)."""
    x = make_x(2, 8, 40, dtype=F64)
    for name in NORMS:
        y0 = getattr(R, name)(x)
        y1 = getattr(R, name)(x + 1e4)
        torch.testing.assert_close(y1, y0, rtol=1e-8, atol=1e-8, msg=name)


@pytest.mark.parametrize("eps_mode", ["inside", "outside"])
@pytest.mark.parametrize("name", NORMS)
def test_a_lone_value_is_beta_at_eps_0(name, eps_mode):
    """A statistic of one value (per channel at frame 0, one valid frame, one channel) normalizes to 0, so y
    is beta there even with eps = 0, as the norms' pages say and both backends give (the reference gave
    0 / 0); and C = 0 returns the empty state, not a NaN mean."""
    C = 3 if SPECS[name].per_channel else 1
    x = make_x(2, C, 6, "b c t", F64)
    bias = torch.linspace(-1, 1, C, dtype=F64)
    lengths = torch.tensor([6, 1])
    y = getattr(R, name)(x, None, bias, 0.0, eps_mode=eps_mode, lengths=lengths)
    assert torch.isfinite(y).all()
    assert torch.equal(y[1, :, 0], bias)  # one valid frame: each statistic of sequence 1 holds one value
    for backend in ("torch",) + (("triton",) if backends.triton_usable(x) else ()):
        dt = F64 if backend == "torch" else torch.float32  # Triton takes no float64
        got = getattr(normlib.functional, name)(x.to(dt), None, bias.to(dt), 0.0, eps_mode=eps_mode,
                                               lengths=lengths, backend=backend)
        assert torch.equal(got[1, :, 0], bias.to(dt)), backend
    if SPECS[name].causal and not SPECS[name].per_channel:
        _, s = getattr(R, name)(torch.zeros(2, 0, 5, dtype=F64), return_state=True)
        assert all(torch.equal(t, torch.zeros(2, dtype=F64)) for t in s)
