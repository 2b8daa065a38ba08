"""Every bad input raises, with a message that names the argument (functional API and layers)."""
import numpy as np
import pytest
import torch

import normlib
import normlib.backends
from normlib import NormState
from conftest import CAUSAL, EMA, GLOBAL, NORMS, SPECS, make_state, run, state_shape

F = normlib.functional
NON_EMA = tuple(n for n in NORMS if n not in EMA)


def x_(B=2, C=4, T=6, **kw):
    return torch.randn(B, C, T, **kw)


# ---------------------------------------------------------------------------------------------------
# x
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 6), (2, 4, 6, 1), (6,), ()], ids=["rank2", "rank4", "rank1", "rank0"])
@pytest.mark.parametrize("name", NORMS)
def test_wrong_rank(name, shape):
    with pytest.raises(ValueError, match=r"x must have 3 dims"):
        run(name, torch.randn(shape))


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
def test_wrong_rank_names_layout(layout):
    with pytest.raises(ValueError, match=r"x must have 3 dims.*" + layout):
        run("cln", torch.randn(4, 6), layout=layout)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, torch.uint8])
@pytest.mark.parametrize("name", NORMS)
def test_non_floating_x(name, dtype):
    x = torch.ones(2, 4, 6, dtype=dtype)
    with pytest.raises(TypeError, match=r"x must be a floating tensor"):
        run(name, x)


@pytest.mark.parametrize("make", ["sparse", "nested"])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_x_not_dense(make, backend):
    """A sparse or nested x gets a TypeError naming x, not an error from inside a backend."""
    x = torch.randn(2, 4, 6).to_sparse() if make == "sparse" else torch.nested.nested_tensor(
        [torch.randn(4, 6), torch.randn(4, 5)], layout=torch.jagged)
    with pytest.raises(TypeError, match=r"x must be a dense \(strided\) tensor, got (torch.sparse_coo|a nested)"):
        run("cln", x, backend=backend)


def test_lengths_of_a_meta_x_are_not_read():
    """A meta tensor has a shape and no values: lengths are checked for shape only (the range check copied
    them out and raised NotImplementedError)."""
    y = run("cln", torch.randn(2, 4, 9, device="meta"), lengths=[9, 5])
    assert y.shape == (2, 4, 9) and y.device.type == "meta"


def test_lengths_past_int64_are_out_of_range():
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, T=6\]"):
        run("cln", x_(B=2, T=6), lengths=[2**70, 1])


def test_x_not_a_tensor():
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        run("cln", [[[1.0, 2.0]]])


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
@pytest.mark.parametrize("name", NORMS)
def test_channel_count_mismatch_in_layer(name, layout):
    layer = normlib.create(name, 5, layout=layout, backend="torch")
    x = torch.randn(2, 4, 7) if layout == "b c t" else torch.randn(2, 7, 4)
    with pytest.raises(ValueError, match=r"x has 4 channels.*num_channels=5"):
        layer(x)
    # the other layout's reading of the same tensor: 7 channels
    layer_wrong = normlib.create(name, 4, layout="b t c" if layout == "b c t" else "b c t", backend="torch")
    with pytest.raises(ValueError, match=r"x has 7 channels.*num_channels=4"):
        layer_wrong(x)


@pytest.mark.parametrize("num_channels", [2.5, -1, True, "4", None, 2**63])
def test_bad_num_channels(num_channels):
    """A layer's C is an integer >= 0: 2.5 was accepted (every call then failed), -1, "4" and 2^63 gave torch's
    errors, which do not name the argument."""
    with pytest.raises(ValueError, match=r"num_channels must be an integer in \[0, 2\^63\)"):
        normlib.create("cln", num_channels)


def test_numpy_num_channels_is_an_int():
    np = pytest.importorskip("numpy")
    for c in (np.int64(4), torch.tensor(4)):
        layer = normlib.create("cln", c)
        assert type(layer.num_channels) is int and layer.weight.shape == (4,)
    with pytest.raises(ValueError, match=r"num_channels must be an integer in \[0, 2\^63\)"):
        normlib.create("cln", torch.tensor(4.0))


def test_channel_count_mismatch_functional():
    with pytest.raises(ValueError, match=r"num_channels=5"):
        F.cln(x_(C=4), backend="torch", num_channels=5)


# ---------------------------------------------------------------------------------------------------
# weight and bias
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arg", ["weight", "bias"])
@pytest.mark.parametrize("name", NORMS)
def test_affine_wrong_shape(name, arg):
    with pytest.raises(ValueError, match=rf"{arg} must be a tensor of shape \(4,\)"):
        run(name, x_(C=4), **{arg: torch.ones(5)})
    with pytest.raises(ValueError, match=rf"{arg} must be a tensor of shape \(4,\)"):
        run(name, x_(C=4), **{arg: torch.ones(4, 1)})
    with pytest.raises(TypeError, match=rf"{arg} must be a tensor of shape \(4,\), got list"):
        run(name, x_(C=4), **{arg: [1.0] * 4})


@pytest.mark.parametrize("arg", ["weight", "bias"])
def test_affine_non_floating(arg):
    with pytest.raises(TypeError, match=rf"{arg} must be floating"):
        run("cln", x_(C=4), **{arg: torch.ones(4, dtype=torch.int64)})


@pytest.mark.parametrize("arg", ["weight", "bias"])
@pytest.mark.parametrize("name", NORMS)
def test_affine_on_another_device(name, arg):
    with pytest.raises(ValueError, match=rf"{arg} is on meta but x is on cpu"):
        run(name, x_(C=4), **{arg: torch.ones(4, device="meta")})


def test_layer_moved_to_meta_refuses_cpu_input():
    layer = normlib.create("gln", 4, backend="torch").to("meta")
    with pytest.raises(ValueError, match=r"weight is on meta"):
        layer(x_(C=4))


# ---------------------------------------------------------------------------------------------------
# lengths
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lengths", [torch.tensor([6]), torch.tensor([6, 6, 6]), torch.tensor([[6], [6]]),
                                     torch.tensor(6)], ids=["short", "long", "2d", "scalar"])
@pytest.mark.parametrize("name", NORMS)
def test_lengths_wrong_shape(name, lengths):
    with pytest.raises(ValueError, match=r"lengths must have shape \(2,\)"):
        run(name, x_(B=2), lengths=lengths)


@pytest.mark.parametrize("lengths", [[7, 3], [-1, 3], [0, 100]], ids=["above-T", "negative", "far-above"])
@pytest.mark.parametrize("name", NORMS)
def test_lengths_out_of_range(name, lengths):
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, T=6\]"):
        run(name, x_(B=2, T=6), lengths=torch.tensor(lengths))


def test_lengths_out_of_range_under_torch_compile():
    """Traced, the check cannot read lengths on the host: it runs in the graph and fails the call (eager
    raises the ValueError above). Once it returned a silently wrong state."""
    f = torch.compile(lambda x, L: run("cln", x, lengths=L, return_state=True), backend="aot_eager",
                      fullgraph=True)
    assert f(x_(B=2, T=6), torch.tensor([6, 2]))[1].w.tolist() == [24.0, 8.0]
    for bad in ([9, 2], [-1, 2]):  # each bound alone
        with pytest.raises(RuntimeError, match=r"lengths must lie in \[0, T\]"):
            f(x_(B=2, T=6), torch.tensor(bad))


def test_a_layer_compiles_with_dynamic_shapes():
    """dynamic=True makes eps a symbolic float, which math.isfinite could not take."""
    layer = normlib.create("cln", 4)
    f = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=True)
    x = x_(B=2, T=9)
    torch.testing.assert_close(f(x), layer(x))


@pytest.mark.parametrize("name", NORMS)
def test_empty_batch_takes_an_empty_list_of_lengths(name):
    x = torch.zeros(0, 4, 6)
    assert run(name, x, lengths=[]).shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.complex64])
@pytest.mark.parametrize("name", NORMS)
def test_lengths_non_integer(name, dtype):
    with pytest.raises(TypeError, match=r"lengths must be an integer tensor"):
        run(name, x_(B=2, T=6), lengths=torch.tensor([6, 3]).to(dtype))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.uint16, torch.uint32, torch.uint64])
def test_lengths_of_any_integer_dtype(dtype):
    x = x_(B=2, T=6)
    assert torch.equal(run("cln", x, lengths=torch.tensor([6, 3]).to(dtype)), run("cln", x, lengths=[6, 3]))


def test_a_uint64_length_past_int64_is_reported_as_such():
    big = torch.tensor([2**63 + 5, 3], dtype=torch.uint64)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, T=6\], got a value of 2\*\*63 or more"):
        run("cln", x_(B=2, T=6), lengths=big)


@pytest.mark.parametrize("lengths", ["ab", [None, 1], {0: 1, 1: 2}])
def test_lengths_that_are_no_integers(lengths):
    with pytest.raises(TypeError, match=r"lengths must be a tensor or a sequence of integers"):
        run("cln", x_(B=2, T=6), lengths=lengths)


def test_lengths_float_list():
    with pytest.raises(TypeError, match=r"lengths must be an integer tensor"):
        run("cln", x_(B=2, T=6), lengths=[6.0, 3.5])


def test_lengths_on_another_device():
    with pytest.raises(ValueError, match=r"lengths is on meta but x is on cpu"):
        run("cln", x_(B=2, T=6), lengths=torch.tensor([6, 3], device="meta"))


# ---------------------------------------------------------------------------------------------------
# state and return_state
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CAUSAL)
def test_state_wrong_shape(name):
    B, C = 2, 4
    good = make_state(name, B, C)
    wrong_shapes = [(B + 1,), (B, C + 1), (B, C, 1)] if SPECS[name].per_channel else [(B + 1,), (B, C), (B, 1)]
    for shape in wrong_shapes:
        for i, field in enumerate(NormState._fields):
            fields = list(good)
            fields[i] = torch.zeros(shape)
            with pytest.raises(ValueError, match=rf"state\.{field} must have shape {tuple(state_shape(name, B, C))}"
                               .replace("(", r"\(").replace(")", r"\)")):
                run(name, x_(B, C), state=NormState(*fields))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", CAUSAL)
def test_state_wrong_dtype(name, dtype):
    """States are float64 whatever the input dtype; any other state dtype is refused, naming the field."""
    B, C = 2, 4
    good = make_state(name, B, C)
    run(name, x_(B, C, dtype=dtype), state=good)  # accepted
    for i, field in enumerate(NormState._fields):
        for bad in (torch.float32, torch.float16, torch.int64):
            fields = list(good)
            fields[i] = fields[i].to(bad)
            with pytest.raises(TypeError, match=rf"state\.{field} must be torch.float64, got {bad}"):
                run(name, x_(B, C, dtype=dtype), state=NormState(*fields))


@pytest.mark.parametrize("name", CAUSAL)
def test_state_wrong_device(name):
    B, C = 2, 4
    good = make_state(name, B, C)
    with pytest.raises(ValueError, match=r"state\.w is on meta but x is on cpu"):
        run(name, x_(B, C), state=good.to("meta"))
    with pytest.raises(ValueError, match=r"state\.m2 is on meta but x is on cpu"):
        run(name, x_(B, C), state=NormState(good.w, good.m, good.m2.to("meta")))


@pytest.mark.parametrize("name", CAUSAL)
def test_state_negative_weight_or_m2(name):
    """A negative weight or M2 is no state: refused, naming the field (the backends made NaN of one, or
    finite garbage); zeros (the empty state) and a NaN (as in x) pass."""
    B, C = 2, 4
    good = make_state(name, B, C)
    for field in ("w", "m2"):
        bad = good._replace(**{field: getattr(good, field).clone().index_fill_(0, torch.tensor([1]), -0.5)})
        with pytest.raises(ValueError, match=rf"state\.{field} must be >= 0 .*minimum of -0.5"):
            run(name, x_(B, C), state=bad)
    run(name, x_(B, C), state=normlib.NormState.empty(good.shape))
    run(name, x_(B, C), state=good._replace(m2=torch.full(good.shape, float("nan"), dtype=torch.float64)))
    f = torch.compile(lambda x, s: run(name, x, state=s), backend="aot_eager", fullgraph=True)
    for bad in (good._replace(w=-good.w), good._replace(m2=-good.m2 - 1)):  # in the graph: no host sync
        with pytest.raises(RuntimeError, match=r"state.w and state.m2 must be >= 0"):
            f(x_(B, C), bad)


@pytest.mark.parametrize("name", CAUSAL)
def test_state_of_weight_zero_with_a_spread(name):
    """An empty state (weight 0) has no spread: an M2 > 0 there is refused (it entered every later frame's
    variance, and the returned state); a mean there is free (no value carries it), and so is a NaN."""
    B, C = 2, 4
    good = make_state(name, B, C)
    w = good.w.clone().index_fill_(0, torch.tensor([1]), 0.0)
    with pytest.raises(ValueError, match=r"state\.m2 must be 0 where state\.w is 0 .*got [0-9]"):
        run(name, x_(B, C), state=good._replace(w=w))
    m2 = good.m2.clone().index_fill_(0, torch.tensor([1]), 0.0)
    run(name, x_(B, C), state=good._replace(w=w, m2=m2))
    f = torch.compile(lambda x, s: run(name, x, state=s), backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError, match=r"state.m2 0 where state.w is 0"):
        f(x_(B, C), good._replace(w=w))


@pytest.mark.parametrize("name", CAUSAL)
def test_state_not_a_normstate(name):
    good = make_state(name, 2, 4)
    with pytest.raises(TypeError, match=r"state must be a normlib.NormState"):
        run(name, x_(2, 4), state=tuple(good))
    with pytest.raises(TypeError, match=r"state must be a normlib.NormState"):
        run(name, x_(2, 4), state=good.w)


@pytest.mark.parametrize("name", GLOBAL)
def test_global_norms_refuse_state(name):
    with pytest.raises(ValueError, match=rf"'{name}' is not causal.*takes no state"):
        run(name, x_(2, 4), state=NormState.empty(state_shape(name, 2, 4)))
    with pytest.raises(ValueError, match=rf"'{name}' is not causal.*returns none"):
        run(name, x_(2, 4), return_state=True)
    layer = normlib.create(name, 4, backend="torch")
    with pytest.raises(ValueError, match=r"state"):
        layer(x_(2, 4), return_state=True)


# ---------------------------------------------------------------------------------------------------
# hyper-parameters: decay, eps, eps_mode, layout, backend (functional and layer constructors)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("decay", [-0.1, 1.0001, 2, float("nan"), float("inf"), True, "0.5"],
                         ids=["neg", "above1", "two", "nan", "inf", "bool", "str"])
@pytest.mark.parametrize("name", EMA)
def test_decay_outside_unit_interval(name, decay):
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\]"):
        run(name, x_(), decay=decay)
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\]"):
        normlib.create(name, 4, decay=decay)


@pytest.mark.parametrize("name", EMA)
def test_decay_bounds_accepted(name):
    for decay in ((1, 1.0, 0.5, 1e-3) if SPECS[name].per_channel else (0, 0.0, 1, 1.0, 0.5)):
        run(name, x_(), decay=decay)
        normlib.create(name, 4, decay=decay)


@pytest.mark.parametrize("decay", [0, 0.0])
@pytest.mark.parametrize("name", [n for n in EMA if SPECS[n].per_channel])
def test_per_channel_ema_refuses_decay_zero(name, decay):
    """decay 0 makes a per-channel EMA a per-channel single-frame norm (variance 0): refused, like the spec."""
    with pytest.raises(ValueError, match=rf"decay=0 makes '{name}' a per-channel single-frame norm"):
        run(name, x_(), decay=decay)
    with pytest.raises(ValueError, match=r"decay=0"):
        normlib.create(name, 4, decay=decay)


@pytest.mark.parametrize("decay", [0.5, 1.0, 0.0])
@pytest.mark.parametrize("name", NON_EMA)
def test_decay_given_to_non_ema_norm(name, decay):
    with pytest.raises(ValueError, match=rf"decay is only accepted by EMA norms, not by '{name}'"):
        run(name, x_(), decay=decay)
    with pytest.raises(ValueError, match=r"decay is only accepted by EMA norms"):
        normlib.create(name, 4, decay=decay)


@pytest.mark.parametrize("eps", [-1e-8, -1.0, float("nan"), float("inf"), True, "1e-5", None],
                         ids=["tiny-neg", "neg", "nan", "inf", "bool", "str", "none"])
@pytest.mark.parametrize("name", NORMS)
def test_bad_eps(name, eps):
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        run(name, x_(), eps=eps)
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        normlib.create(name, 4, eps=eps)


@pytest.mark.parametrize("value", ["no", 2, [True], torch.tensor([1, 1]), np.array([1, 1]), 1.0, torch.tensor(1.0),
                                   np.array([1.0])],
                         ids=["str", "two", "list", "tensor2", "array2", "float", "float-tensor", "float-array"])
def test_return_state_not_a_bool(value):
    with pytest.raises(TypeError, match=r"return_state must be True or False"):
        run("cln", x_(), return_state=value)


@pytest.mark.parametrize("value", [1, np.int64(1), np.True_, np.array([True]), torch.tensor(True)],
                         ids=["one", "numpy-one", "numpy", "numpy-array", "tensor"])
def test_return_state_that_reads_as_a_bool(value):
    x = x_()
    y, state = run("cln", x, return_state=value)
    assert torch.equal(y, run("cln", x)) and isinstance(state, NormState)
    assert torch.equal(run("cln", x, return_state=None), y)  # None: no state, as False


@pytest.mark.parametrize("eps", [10**400, "fraction", "longdouble"])
def test_eps_past_floats_range(eps):
    """Finite in its own type, past float's range: refused (float() made inf of a long double, and raised
    OverflowError on a Fraction)."""
    from fractions import Fraction

    eps = {"fraction": Fraction(10**400), "longdouble": np.longdouble("1e400")}.get(eps, eps)
    if isinstance(eps, np.longdouble) and not np.isfinite(eps):
        eps = np.finfo(np.longdouble).max  # a platform whose long double is a double: its largest
        eps = eps if not np.isfinite(float(eps)) else 10**400
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        run("cln", x_(), eps=eps)
    from fractions import Fraction as Fr
    assert torch.equal(run("cln", x := x_(), eps=Fr(1, 10**5)), run("cln", x, eps=1e-5))


def test_spec_that_is_no_normspec():
    class Plain(torch.nn.Module):
        pass

    for spec in (None, Plain, Plain()):
        with pytest.raises(TypeError, match=r"spec must be a normlib.NormSpec"):
            F.norm(spec, x_())
    x = x_()  # a layer class stands for its spec
    assert torch.equal(F.norm(normlib.get("cln"), x), F.cln(x))
    # a layer would have its own decay, eps, weights... that norm() would drop: refused, not half-used
    with pytest.raises(TypeError, match=r"spec must be a normlib.NormSpec.*got CumulativeLayerNorm"):
        F.norm(normlib.create("cln", 4), x)


def test_functional_num_channels():
    with pytest.raises(ValueError, match=r"num_channels must be an integer in \[0, 2\^63\), got '4'"):
        F.cln(x_(C=4), num_channels="4")


def test_options_are_checked_without_the_cache_under_compile():
    """Dynamo warns about a call into an lru_cache; the compiled call checks its options uncached."""
    import warnings

    layer = normlib.create("cln", 4, backend="torch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(layer, fullgraph=True, backend="eager")(x_())
    assert not [w for w in caught if "lru_cache" in str(w.message)]


def test_eps_zero_and_int_accepted():
    x = x_()
    assert torch.isfinite(run("cln", x, eps=0)).all()
    assert torch.equal(run("cln", x, eps=1), run("cln", x, eps=1.0))


def test_numpy_scalars_are_numbers():
    """eps and decay from a numpy config (np.float32, np.float64, np.int64) are taken as the numbers they hold;
    np.bool_ is refused like bool. np.float32 was once refused."""
    np = pytest.importorskip("numpy")
    x = x_()
    assert torch.equal(run("cln", x, eps=np.float32(0.5)), run("cln", x, eps=float(np.float32(0.5))))
    assert torch.equal(run("cln", x, eps=np.int64(1)), run("cln", x, eps=1.0))
    assert torch.equal(run("emaln", x, decay=np.float32(0.5)), run("emaln", x, decay=0.5))
    assert torch.equal(run("emaln", x, decay=np.float64(0.25)), run("emaln", x, decay=0.25))
    normlib.create("emaln", 4, eps=np.float32(1e-5), decay=np.float32(0.9))
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        run("cln", x, eps=np.bool_(True))
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        run("cln", x, eps=np.float32("nan"))
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\]"):
        run("emaln", x, decay=np.float32(1.5))


def test_remembered_options_still_refuse_lookalikes():
    """Good options are remembered, by value and type: 1 and 1.0 accepted do not let True (== 1, same
    hash) or decay=True through, and an unhashable argument still gets its own error."""
    x = x_()
    run("cln", x, eps=1)
    run("emaln", x, decay=1)
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        run("cln", x, eps=True)
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\]"):
        run("emaln", x, decay=True)
    with pytest.raises(ValueError, match=r"eps must be a finite number >= 0"):
        run("cln", x, eps=[1e-5])


@pytest.mark.parametrize("eps_mode", ["Inside", "in", "", None, "sqrt"])
@pytest.mark.parametrize("name", NORMS)
def test_unknown_eps_mode(name, eps_mode):
    with pytest.raises(ValueError, match=r"eps_mode must be one of \('inside', 'outside'\)"):
        run(name, x_(), eps_mode=eps_mode)
    with pytest.raises(ValueError, match=r"eps_mode must be one of"):
        normlib.create(name, 4, eps_mode=eps_mode)


@pytest.mark.parametrize("layout", ["b c", "t c b", "c b t", "nct", "", "b t c t"])
@pytest.mark.parametrize("name", NORMS)
def test_unknown_layout(name, layout):
    with pytest.raises(ValueError, match=r"layout must be one of \('b c t', 'b t c'\)"):
        run(name, x_(), layout=layout)
    with pytest.raises(ValueError, match=r"layout must be one of"):
        normlib.create(name, 4, layout=layout)


@pytest.mark.parametrize("backend", ["cuda", "Torch", "", None, "numpy"])
@pytest.mark.parametrize("name", NORMS)
def test_unknown_backend(name, backend):
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'torch', 'triton'\)"):
        getattr(F, name)(x_(), backend=backend)
    with pytest.raises(ValueError, match=r"backend must be one of"):
        normlib.create(name, 4, backend=backend)


def _without_triton():
    return {k: v for k, v in normlib.backends.BACKENDS.items() if k != "triton"}


@pytest.mark.parametrize("name", NORMS)
def test_triton_backend_on_cpu_without_interpreter(name, monkeypatch):
    x = x_()
    # no interpreter: a CPU tensor cannot run Triton, whether or not the Triton backend is registered
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"backend='triton' needs a CUDA tensor.*TRITON_INTERPRET=1.*cpu"):
        getattr(F, name)(x, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"backend='triton' needs a CUDA tensor"):
        getattr(F, name)(x, backend="triton")
    # no Triton backend at all (triton missing): refused even with the interpreter on
    monkeypatch.setattr(normlib.backends, "BACKENDS", _without_triton())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"backend='triton' needs .*the triton package"):
        getattr(F, name)(x, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match=r"backend='triton' needs .*the triton package"):
        getattr(F, name)(x, backend="triton")
    layer = normlib.create(name, 4, backend="triton")  # the check is at call time, on the input
    with pytest.raises(ValueError, match=r"backend='triton'"):
        layer(x)
    # "auto" still works on the CPU, through the torch backend
    assert torch.equal(getattr(F, name)(x, backend="auto"), run(name, x))


def test_errors_come_before_any_work_on_bad_hyperparameters():
    """Checks happen up front: a bad option is reported even when x is fine and no other option is set."""
    with pytest.raises(ValueError, match="eps_mode"):
        F.cln(x_(), eps_mode="nope", backend="torch")
    with pytest.raises(ValueError, match="layout"):
        F.cln(x_(), layout="nope", backend="torch")
