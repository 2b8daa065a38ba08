"""The nn.Module layers: parameters, options, factory kwargs, state_dict, pickling, forward."""
import copy
import io
import pickle

import pytest
import torch
from torch import nn

import normlib
from conftest import (CAUSAL, EMA, LAYOUTS, NORMS, SPECS, TOL, assert_rel, assert_state_close, make_lengths,
                      make_state, make_x, ref, run)

F32, F64 = torch.float32, torch.float64


def _layer(name, C=6, **kw):
    kw.setdefault("backend", "torch")
    return normlib.create(name, C, **kw)


@pytest.mark.parametrize("name", NORMS)
def test_parameters(name):
    layer = _layer(name, 6)
    params = dict(layer.named_parameters())
    assert set(params) == {"weight", "bias"}
    assert params["weight"].shape == (6,) and params["bias"].shape == (6,)
    assert torch.equal(layer.weight, torch.ones(6)) and torch.equal(layer.bias, torch.zeros(6))
    assert layer.weight.dtype == torch.get_default_dtype()
    assert layer.num_channels == 6 and layer.eps == 1e-8 and layer.eps_mode == "inside"
    assert layer.layout == "b c t" and layer.backend == "torch" and layer.elementwise_affine
    assert (layer.decay is not None) == (name in EMA)
    assert list(layer.buffers()) == []


@pytest.mark.parametrize("name", NORMS)
def test_reset_parameters(name):
    layer = _layer(name, 5)
    with torch.no_grad():
        layer.weight.mul_(3).add_(1)
        layer.bias.add_(2)
    w_id = id(layer.weight)
    layer.reset_parameters()
    assert id(layer.weight) == w_id  # in place: an optimizer holding the parameter still sees it
    assert torch.equal(layer.weight, torch.ones(5)) and torch.equal(layer.bias, torch.zeros(5))


@pytest.mark.parametrize("name", NORMS)
def test_extra_repr(name):
    r = repr(_layer(name, 7, eps=1e-5))
    assert r.startswith(SPECS[name].class_name + "(7, ")
    assert "eps=1e-05" in r and "elementwise_affine=True" in r and "bias=True" in r and "layout='b c t'" in r
    assert ("decay=" in r) == (name in EMA)
    assert "eps_mode" not in r
    r = repr(_layer(name, 7, eps_mode="outside", layout="btc", elementwise_affine=False,
                    **({"decay": 0.25} if name in EMA else {})))
    assert "eps_mode='outside'" in r and "layout='b t c'" in r and "elementwise_affine=False" in r
    if name in EMA:
        assert "decay=0.25" in r


@pytest.mark.parametrize("name", NORMS)
def test_no_elementwise_affine(name):
    layer = _layer(name, 6, elementwise_affine=False)
    assert layer.weight is None and layer.bias is None
    assert list(layer.parameters()) == [] and layer.state_dict() == {}
    x = make_x(2, 6, 11)
    assert torch.equal(layer(x), run(name, x))
    assert_rel(layer(x), ref(name, x), TOL[F32], name)
    layer.reset_parameters()  # nothing to reset, no error


@pytest.mark.parametrize("name", NORMS)
def test_no_bias(name):
    layer = _layer(name, 6, bias=False)
    assert isinstance(layer.weight, nn.Parameter) and layer.bias is None
    assert set(dict(layer.named_parameters())) == {"weight"}
    assert set(layer.state_dict()) == {"weight"}
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 2, 6))
    x = make_x(2, 6, 11)
    assert_rel(layer(x), ref(name, x, layer.weight), TOL[F32], name)
    assert "bias=False" in repr(layer)
    assert "bias" in layer._parameters  # registered as None, as nn.LayerNorm's: the name is a parameter's
    layer.register_parameter("bias", nn.Parameter(torch.zeros(6)))  # (it raised KeyError: an attribute)


@pytest.mark.parametrize("arg", ["elementwise_affine", "bias"])
@pytest.mark.parametrize("value", ["False", "no", None, 2.0], ids=["str-False", "str", "none", "float"])
def test_on_off_options_are_bools(arg, value):
    """A string reads as True: "False" made the parameters and the repr said they were not there."""
    with pytest.raises(TypeError, match=rf"{arg} must be True or False, got"):
        _layer("cln", 6, **{arg: value})


@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64, "float32"])
def test_parameters_dtype_is_floating(dtype):
    with pytest.raises(TypeError, match=r"dtype must be a floating dtype"):
        _layer("cln", 6, dtype=dtype)


@pytest.mark.parametrize("name", NORMS)
def test_factory_kwargs(name):
    layer = _layer(name, 6, dtype=F64)
    assert layer.weight.dtype == F64 and layer.bias.dtype == F64
    x = make_x(2, 6, 11, dtype=F64)
    y = layer(x)
    assert y.dtype == F64
    assert_rel(y, ref(name, x), TOL[F64], name)
    meta = _layer(name, 6, device="meta")
    assert meta.weight.device.type == "meta" and meta.bias.device.type == "meta"
    cpu = _layer(name, 6, device="cpu", dtype=torch.float16)
    assert cpu.weight.device.type == "cpu" and cpu.weight.dtype == torch.float16
    assert torch.equal(cpu.weight, torch.ones(6, dtype=torch.float16))
    # a meta layer materialized on the CPU
    real = meta.to_empty(device="cpu")
    real.reset_parameters()
    assert torch.equal(real.weight, torch.ones(6)) and torch.equal(real.bias, torch.zeros(6))


@pytest.mark.parametrize("name", NORMS)
def test_half_layer_on_half_input(name):
    layer = _layer(name, 6, dtype=torch.bfloat16)
    x = make_x(2, 6, 11, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    assert_rel(y, ref(name, x, layer.weight, layer.bias), TOL[torch.bfloat16], name)


@pytest.mark.parametrize("name", NORMS)
def test_state_dict_round_trip(name):
    a = _layer(name, 6)
    with torch.no_grad():
        a.weight.normal_()
        a.bias.normal_()
    sd = a.state_dict()
    assert set(sd) == {"weight", "bias"}
    b = _layer(name, 6)
    assert b.load_state_dict(sd) is not None
    assert torch.equal(b.weight, a.weight) and torch.equal(b.bias, a.bias)
    x = make_x(2, 6, 11)
    assert torch.equal(b(x), a(x))
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    c = _layer(name, 6)
    c.load_state_dict(torch.load(buf))  # weights_only load
    assert torch.equal(c(x), a(x))
    with pytest.raises(RuntimeError):
        _layer(name, 5).load_state_dict(sd)  # a size mismatch is refused by torch


@pytest.mark.parametrize("name", NORMS)
def test_pickle_whole_model(name):
    model = nn.Sequential(nn.Linear(3, 6), _layer(name, 6, eps=1e-5, layout="b t c"), nn.PReLU())
    with torch.no_grad():
        model[1].weight.normal_()
    x = make_x(2, 3, 11, "b t c")
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded[1]) is normlib.get(name)
    assert loaded[1].eps == 1e-5 and loaded[1].spec is SPECS[name] and loaded[1].layout == "b t c"
    assert torch.equal(loaded(x), model(x))
    again = pickle.loads(pickle.dumps(model[1]))
    assert type(again) is type(model[1]) and torch.equal(again.weight, model[1].weight)
    dup = copy.deepcopy(model[1])
    x6 = make_x(2, 6, 5, "b t c")
    assert torch.equal(dup(x6), model[1](x6))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: s.replace(" ", ""))
@pytest.mark.parametrize("name", NORMS)
def test_forward_matches_functional_and_reference(name, layout):
    B, C, T = 3, 6, 15
    kw = {"decay": 0.7} if name in EMA else {}
    layer = _layer(name, C, eps=1e-5, eps_mode="outside", layout=layout, **kw)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = make_x(B, C, T, layout)
    lengths = make_lengths(B, T)
    fkw = dict(eps_mode="outside", layout=layout, lengths=lengths, **kw)
    if SPECS[name].causal:
        state = make_state(name, B, C)
        y, s = layer(x, lengths=lengths, state=state, return_state=True)
        y_f, s_f = run(name, x, layer.weight, layer.bias, 1e-5, state=state, return_state=True, **fkw)
        assert torch.equal(y, y_f) and all(torch.equal(a, b) for a, b in zip(s, s_f))
        y_r, s_r = ref(name, x, layer.weight, layer.bias, 1e-5, state=state, return_state=True, **fkw)
        assert_state_close(s, s_r, TOL[F32], floor=True)
        assert torch.equal(layer(x, lengths, state), y)  # positional arguments
    else:
        y = layer(x, lengths=lengths)
        assert torch.equal(y, run(name, x, layer.weight, layer.bias, 1e-5, **fkw))
        y_r = ref(name, x, layer.weight, layer.bias, 1e-5, **fkw)
    assert y.shape == x.shape
    assert_rel(y, y_r, TOL[F32], name)


@pytest.mark.parametrize("name", NORMS)
def test_parameter_gradients(name):
    layer = _layer(name, 6)
    x = make_x(2, 6, 11, dtype=F64).requires_grad_()
    layer = layer.double()
    (layer(x) * torch.randn(2, 6, 11, dtype=F64)).sum().backward()
    assert layer.weight.grad is not None and layer.bias.grad is not None and x.grad is not None
    assert layer.weight.grad.abs().sum() > 0 and layer.bias.grad.abs().sum() > 0
    assert torch.autograd.gradcheck(lambda w, b: run(name, x.detach(), w, b),
                                    [layer.weight.detach().clone().requires_grad_(),
                                     layer.bias.detach().clone().requires_grad_()])


@pytest.mark.parametrize("name", ["cln", "ccln", "gln"])
def test_a_parametrized_weight_is_read_through_its_parametrization(name):
    """The layer reads its parameters from their dict where they are there; torch.nn.utils.parametrize moves the
    weight out of it and computes it: y is the functional's with the computed weight, and its gradient reaches
    the original."""
    from torch.nn.utils import parametrize

    class Scaled(nn.Module):
        def forward(self, w):
            return 3 * w

    layer = _layer(name, 6)
    parametrize.register_parametrization(layer, "weight", Scaled())
    x = make_x(2, 6, 11)
    y = layer(x)
    assert_rel(y, run(name, x, torch.full((6,), 3.0), torch.zeros(6)), TOL[F32], name)
    y.square().sum().backward()
    assert layer.parametrizations.weight.original.grad.abs().sum() > 0


@pytest.mark.parametrize("name", NORMS)
def test_module_moves_with_to(name):
    layer = _layer(name, 6).to(F64)
    assert layer.weight.dtype == F64
    layer = layer.to("meta")
    assert layer.weight.device.type == "meta"


def test_layer_classes_are_exported():
    for s in normlib.FAMILY:
        cls = getattr(normlib, s.class_name)
        assert cls is normlib.get(s.name) and cls.spec is s
        assert cls.__module__ == "normlib.modules"
        assert s.description in cls.__doc__
    assert normlib.layer_class(normlib.FAMILY[0]).spec is normlib.FAMILY[0]


@pytest.mark.parametrize("name", NORMS)
def test_default_decay_and_backend(name):
    layer = normlib.create(name, 4)
    assert layer.backend == "auto"
    if name in EMA:
        assert layer.decay == SPECS[name].decay
    x = make_x(2, 4, 9)
    assert torch.equal(layer(x), run(name, x, layer.weight, layer.bias))  # "auto" on CPU is the torch backend


@pytest.mark.parametrize("name", CAUSAL)
def test_module_in_a_training_loop(name):
    """A causal layer inside a tiny model trains: loss decreases with SGD (sanity of the whole stack)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), _layer(name, 8, layout="b t c"), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(4, 32, 2)
    target = x[..., :1].cumsum(1).tanh()
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = (model(x) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(lambda v: v == v, losses)) and losses[-1] < losses[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", NORMS)
def test_float32_layer_on_half_input(name, dtype):
    """Mixed precision: float32 parameters, a half input; the output keeps the input's dtype."""
    layer = _layer(name, 6)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = make_x(2, 6, 11, dtype=dtype).requires_grad_()
    y = layer(x)
    assert y.dtype == dtype
    assert_rel(y, ref(name, x, layer.weight, layer.bias), TOL[dtype], name)
    y.float().sum().backward()
    assert x.grad.dtype == dtype and layer.weight.grad.dtype == F32


def _counting_norm(monkeypatch):
    """A list that grows by one at each call of normlib.functional.norm (from a layer: modules.py's own name)."""
    from normlib import modules
    seen, real = [], modules.norm

    def counted(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(modules, "norm", counted)
    return seen


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["cln", "ccln", "gln"])
def test_a_layer_keeps_its_prepared_call_and_gives_norms_result(name, layout, monkeypatch):
    """From its second call with an input's signature a layer runs the prepared call that norm made for it, without
    norm's checks and key; y (and every gradient) is norm's."""
    seen = _counting_norm(monkeypatch)
    layer = _layer(name, 6, layout=layout)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = make_x(2, 6, 11)
    x = x if layout == "b c t" else x.transpose(1, 2).contiguous()
    ys = [layer(x) for _ in range(3)]
    assert len(seen) == 2  # the first call prepares; the second finds the call norm made and keeps it
    want = normlib.functional.norm(layer.spec, x, layer.weight, layer.bias, layer.eps, layout=layout,
                                   backend="torch")
    assert all(torch.equal(y, want) for y in ys)
    xg = x.clone().requires_grad_()
    layer(xg).square().sum().backward()
    assert len(seen) == 2 and xg.grad is not None and layer.weight.grad.abs().sum() > 0


def test_a_layer_takes_a_changed_setting_and_new_parameters_at_its_next_call(monkeypatch):
    """A layer's kept calls cover what can change between calls (the input's signature, the parameters' dtype,
    shape and device); a setting changed on the layer sends the next call through norm again."""
    seen = _counting_norm(monkeypatch)
    layer = _layer("cln", 6)
    x = make_x(2, 6, 11) * 1e-3  # var ~ 1e-6: eps 1e-2 changes y
    for _ in range(2):
        layer(x)
    n = len(seen)
    layer.eps = 1e-2
    assert torch.equal(layer(x), run("cln", x, layer.weight, layer.bias, eps=1e-2))
    assert len(seen) == n + 1
    layer.double()  # the parameters' dtype, not through setattr (.data swapped)
    y = layer(x.double())
    assert y.dtype == F64 and torch.equal(y, run("cln", x.double(), layer.weight, layer.bias, eps=1e-2))
    with torch.no_grad():
        layer.weight.data = torch.ones(5, dtype=F64)  # a wrong shape: norm's checks, not a stale call
    with pytest.raises(ValueError, match="weight"):
        layer(x.double())


def test_a_copied_or_pickled_layer_starts_without_its_calls():
    layer = _layer("ccln", 6)
    x = make_x(2, 6, 11)
    for _ in range(2):
        layer(x)
    assert layer._calls
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert not other._calls
        assert torch.equal(other(x), layer(x)) and torch.equal(other(x), layer(x))


def test_a_layer_parametrized_after_its_calls_reads_its_parametrization():
    from torch.nn.utils import parametrize

    class Scaled(nn.Module):
        def forward(self, w):
            return 3 * w

    layer = _layer("cln", 6)
    x = make_x(2, 6, 11)
    for _ in range(2):
        layer(x)
    parametrize.register_parametrization(layer, "weight", Scaled())
    assert torch.equal(layer(x), run("cln", x, torch.full((6,), 3.0), torch.zeros(6)))
