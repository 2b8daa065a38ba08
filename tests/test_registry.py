"""The registry: names, normalized names, aliases, classes and partials, create, available, register."""
import functools
import os
import subprocess
import sys
import uuid

import pytest
import torch
from torch import nn

import normlib
from normlib import NormSpec, Pool, TimeMode
from conftest import NORMS, SPECS, TOL, assert_rel, make_x, ref

CLASS_NAMES = {
    "cln": "CumulativeLayerNorm", "ccln": "ChannelCumulativeLayerNorm", "gln": "GlobalLayerNorm",
    "emaln": "EMALayerNorm", "frameln": "FrameLayerNorm", "instln": "InstanceLayerNorm",
    "ccemaln": "ChannelEMALayerNorm",
}


@pytest.fixture
def uname():
    """A fresh name per test: registrations are global and stay for the session."""
    return f"usertest{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("name", NORMS)
def test_get_by_name(name):
    cls = normlib.get(name)
    assert cls is getattr(normlib, CLASS_NAMES[name])
    assert issubclass(cls, nn.Module) and issubclass(cls, normlib.NormLayer)
    assert cls.__name__ == CLASS_NAMES[name]
    assert cls.spec is SPECS[name]


@pytest.mark.parametrize("spelling", ["cln", "cLN", "c_ln", "CLN", "C-LN", "c ln", " cln "])
def test_normalized_names(spelling):
    assert normlib.get(spelling) is normlib.CumulativeLayerNorm


@pytest.mark.parametrize("spelling", ["GLN", "g_ln", "Frame_LN", "INSTLN", "ccEMA-LN", "EMALN"])
def test_normalized_names_other_norms(spelling):
    key = "".join(ch for ch in spelling.lower() if ch.isalnum())
    assert normlib.get(spelling) is normlib.get(key)


@pytest.mark.parametrize("alias,target", [("cumln", "cln"), ("cgln", "cln"), ("chanln", "frameln"),
                                          ("fgln", "instln"), ("CumLN", "cln"), ("chan_ln", "frameln"),
                                          ("fgLN", "instln"), ("C-G-L-N", "cln")])
def test_aliases(alias, target):
    assert normlib.get(alias) is normlib.get(target)


def test_aliases_listing():
    a = normlib.aliases()
    for alias, target in {"cumln": "cln", "cgln": "cln", "chanln": "frameln", "fgln": "instln"}.items():
        assert a[alias] == target
    a["cumln"] = "gln"  # a copy: changing it changes nothing
    assert normlib.get("cumln") is normlib.CumulativeLayerNorm


def test_get_class_and_partial_are_returned_as_given():
    assert normlib.get(nn.LayerNorm) is nn.LayerNorm
    assert normlib.get(normlib.GlobalLayerNorm) is normlib.GlobalLayerNorm
    p = functools.partial(normlib.CumulativeLayerNorm, eps=1e-5)
    assert normlib.get(p) is p
    layer = normlib.create(p, 8)
    assert isinstance(layer, normlib.CumulativeLayerNorm) and layer.eps == 1e-5 and layer.num_channels == 8
    assert isinstance(normlib.create(nn.BatchNorm1d, 8), nn.BatchNorm1d)


@pytest.mark.parametrize("name", NORMS)
def test_create(name):
    layer = normlib.create(name, 6, eps=1e-5, layout="b t c", backend="torch")
    assert isinstance(layer, normlib.get(name))
    assert layer.num_channels == 6 and layer.eps == 1e-5 and layer.layout == "b t c"
    x = make_x(2, 6, 9, "b t c")
    assert_rel(layer(x), ref(name, x, layer.weight, layer.bias, 1e-5, layout="b t c"), TOL[torch.float32], name)


def test_create_passes_decay():
    layer = normlib.create("emaln", 6, decay=0.3, backend="torch")
    assert layer.decay == 0.3
    x = make_x(2, 6, 9)
    assert_rel(layer(x), ref("emaln", x, decay=0.3), TOL[torch.float32], "emaln decay 0.3")
    assert normlib.create("emaln", 6).decay == SPECS["emaln"].decay


def test_available_lists_the_family_with_descriptions():
    av = normlib.available()
    assert isinstance(av, dict)
    for name in NORMS:
        assert av[name] == SPECS[name].description and av[name]
    for alias in ("cumln", "cgln", "chanln", "fgln"):
        assert alias not in av  # aliases are not separate norms
    assert list(av) == sorted(av)


def test_available_is_exactly_the_seven_in_a_fresh_process():
    root = os.path.dirname(os.path.dirname(os.path.abspath(normlib.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", "import normlib; print(' '.join(normlib.available()))"],
                         capture_output=True, text=True, check=True, timeout=120, env=env)
    assert out.stdout.split() == sorted(NORMS)


@pytest.mark.parametrize("name", ["nope", "layernorm", "cln2", ""])
def test_unknown_name(name):
    with pytest.raises(KeyError, match=r"unknown norm.*known norms: .*ccemaln.*cln.*gln.*instln") as info:
        normlib.get(name)
    assert "cumln->cln" in str(info.value)  # the aliases are listed too
    with pytest.raises(KeyError, match=r"unknown norm"):
        normlib.create(name, 4)


def test_register_spec(uname):
    spec = NormSpec(uname, Pool.ALL, TimeMode.EMA, "MyLN", "desc", decay=0.5)
    cls = normlib.register(uname, spec, aliases=(uname + "alias",))
    assert normlib.get(uname) is cls and normlib.get(uname + "_ALIAS") is cls
    assert issubclass(cls, normlib.NormLayer) and cls.__name__ == "MyLN" and cls.spec is spec
    assert normlib.available()[uname] == "desc"
    assert normlib.aliases()[uname + "alias"] == uname
    layer = normlib.create(uname, 5, backend="torch")
    assert layer.decay == 0.5
    x = make_x(2, 5, 12)
    assert_rel(layer(x), ref("emaln", x, decay=0.5), TOL[torch.float32], "user EMA spec")
    y, s = layer(x, return_state=True)
    assert s.shape == (2,)


def test_register_spec_per_channel_cumulative(uname):
    spec = NormSpec(uname, Pool.CHANNEL, TimeMode.CUMULATIVE, "MyCCLN", "my per-channel cumulative norm")
    normlib.register(uname, spec)
    x = make_x(2, 5, 12)
    assert_rel(normlib.create(uname, 5, backend="torch")(x), ref("ccln", x), TOL[torch.float32], "user spec")


def test_register_module_class(uname):
    class MyNorm(nn.Module):
        """My norm: a LayerNorm over channels.

        More text.
        """

        def __init__(self, num_channels, eps=1e-5):
            super().__init__()
            self.ln = nn.LayerNorm(num_channels, eps=eps)

        def forward(self, x):
            return self.ln(x.transpose(1, 2)).transpose(1, 2)

    assert normlib.register(uname, MyNorm) is MyNorm
    assert normlib.get(uname) is MyNorm
    assert normlib.available()[uname] == "My norm: a LayerNorm over channels."
    layer = normlib.create(uname, 4, eps=1e-3)
    assert isinstance(layer, MyNorm) and layer.ln.eps == 1e-3


def test_register_decorator_and_description(uname):
    @normlib.register(uname, description="a custom description")
    class Other(nn.Module):
        def __init__(self, num_channels):
            super().__init__()

    assert normlib.get(uname) is Other
    assert normlib.available()[uname] == "a custom description"


def test_register_duplicates(uname):
    spec = NormSpec(uname, Pool.ALL, TimeMode.CUMULATIVE, "Dup", "dup")
    for taken in ("cln", "CLN", "c_ln", "cumln", "fgln"):
        with pytest.raises(ValueError, match=r"already registered.*overwrite=True"):
            normlib.register(taken, spec)
    with pytest.raises(ValueError, match=r"already registered"):
        normlib.register(uname, spec, aliases=("chanln",))  # an alias that is taken
    with pytest.raises(ValueError, match=r"are registered norm names"):
        normlib.register(uname, spec, aliases=("gln",))  # an alias that is a name
    assert normlib.get("cln") is normlib.CumulativeLayerNorm  # nothing was replaced
    assert normlib.get("chanln") is normlib.FrameLayerNorm
    with pytest.raises(KeyError):
        normlib.get(uname)  # a refused registration leaves nothing behind

    first = normlib.register(uname, spec)
    with pytest.raises(ValueError, match=r"already registered"):
        normlib.register(uname.upper(), nn.LayerNorm)
    assert normlib.get(uname) is first
    assert normlib.register(uname, nn.LayerNorm, overwrite=True) is nn.LayerNorm
    assert normlib.get(uname) is nn.LayerNorm


def test_register_a_name_over_an_alias(uname):
    """overwrite=True lets a new name take an alias's place: the name then resolves to the new class."""
    spec = NormSpec(uname, Pool.ALL, TimeMode.CUMULATIVE, "Aliased", "aliased")
    first = normlib.register(uname, spec, aliases=(uname + "alias",))
    with pytest.raises(ValueError, match=r"already registered"):
        normlib.register(uname + "alias", nn.LayerNorm)
    assert normlib.register(uname + "alias", nn.LayerNorm, overwrite=True) is nn.LayerNorm
    assert normlib.get(uname + "alias") is nn.LayerNorm
    assert normlib.get(uname) is first


@pytest.mark.parametrize("target", [42, "cln", nn.LayerNorm(4), lambda c: c], ids=["int", "str", "instance", "fn"])
def test_register_bad_target(uname, target):
    with pytest.raises(TypeError, match=r"target must be a NormSpec or an nn.Module class"):
        normlib.register(uname, target)
    with pytest.raises(KeyError):
        normlib.get(uname)


def test_a_bad_target_under_a_taken_name_is_a_type_error():
    """The target's type is checked before the name: a TypeError, not "already registered"."""
    with pytest.raises(TypeError, match=r"target must be a NormSpec or an nn.Module class"):
        normlib.register("cln", 5)


@pytest.mark.parametrize("name", [None, 3, ["x"]], ids=["none", "int", "list"])
def test_register_a_name_that_is_no_string(name):
    """str() made "none" of None and registered it."""
    spec = NormSpec("zzz", Pool.ALL, TimeMode.CUMULATIVE, "Zzz", "x")
    with pytest.raises(TypeError, match=r"name must be a string, got"):
        normlib.register(name, spec)


def test_register_used_as_a_decorator_without_its_name():
    """@normlib.register on a class (no name) replaced the class by a lambda and registered nothing."""
    with pytest.raises(TypeError, match=r'name must be a string \(as a decorator: @normlib.register\("name"\)\)'):
        @normlib.register
        class Mine(nn.Module):
            pass


@pytest.mark.parametrize("aliases", ["ab", None, [1]], ids=["str", "none", "ints"])
def test_aliases_must_be_a_list_of_strings(uname, aliases):
    """A string was read letter by letter ("ab": aliases "a" and "b")."""
    spec = NormSpec(uname, Pool.ALL, TimeMode.CUMULATIVE, "Zzz", "x")
    with pytest.raises(TypeError, match=r"aliases must be a list or tuple of strings"):
        normlib.register(uname, spec, aliases=aliases)
    with pytest.raises(KeyError):
        normlib.get(uname)


def test_get_takes_a_spec_and_refuses_other_objects(uname):
    """A NormSpec (which the functional API takes) gives its registered class, or one made from it; a list is
    a TypeError (str() of ["cln"] found cln)."""
    assert normlib.get(SPECS["cln"]) is normlib.get("cln")
    spec = NormSpec(uname, Pool.ALL, TimeMode.CUMULATIVE, "Unregistered", "x")
    cls = normlib.get(spec)
    assert cls.spec == spec and cls is normlib.get(spec) and cls(4)(make_x(2, 4, 5)).shape == (2, 4, 5)
    with pytest.raises(TypeError, match=r"name must be a string \(a norm's name or alias\), a NormSpec"):
        normlib.get(["cln"])


def test_spec_channel_frame_is_refused():
    with pytest.raises(ValueError, match=r"degenerate"):
        NormSpec("chframe", Pool.CHANNEL, TimeMode.FRAME, "ChFrame", "per-channel single frame")


def test_spec_decay_only_for_ema():
    with pytest.raises(ValueError, match=r"decay"):
        NormSpec("e", Pool.ALL, TimeMode.EMA, "E", "ema without a decay")
    with pytest.raises(ValueError, match=r"decay"):
        NormSpec("c", Pool.ALL, TimeMode.CUMULATIVE, "C", "cumulative with a decay", decay=0.5)


def test_spec_takes_the_enums_values():
    """Pool and TimeMode are compared by identity: their values are turned into them, not misread."""
    spec = NormSpec("s", "channel", "cumulative", "S", "per channel, cumulative")
    assert spec.pool is Pool.CHANNEL and spec.per_channel and spec.causal
    assert not NormSpec("g", "all", "global", "G", "global").causal
    assert NormSpec("e", "all", "ema", "E", "ema", decay=0.5).time is TimeMode.EMA
    with pytest.raises(ValueError, match=r"degenerate"):
        NormSpec("chframe", "channel", "frame", "ChFrame", "per-channel single frame")
    with pytest.raises(ValueError, match=r"pool must be one of \['all', 'channel'\], got 'chan'"):
        NormSpec("x", "chan", "cumulative", "X", "typo")
    with pytest.raises(ValueError, match=r"time must be one of"):
        NormSpec("x", "all", "cumul", "X", "typo")


@pytest.mark.parametrize("decay", [1.5, -0.1, float("nan")])
def test_spec_default_decay_outside_unit_interval(decay):
    with pytest.raises(ValueError, match=r"norm 'e': default decay must be a number in \[0, 1\]"):
        NormSpec("e", Pool.ALL, TimeMode.EMA, "E", "ema", decay=decay)
    with pytest.raises(ValueError, match=r"default decay=0 makes 'e' a per-channel single-frame norm"):
        NormSpec("e", Pool.CHANNEL, TimeMode.EMA, "E", "ema", decay=0.0)


@pytest.mark.parametrize("name", ["", "--", " "])
def test_names_without_a_letter_are_refused(name):
    with pytest.raises(ValueError, match=r"letter or digit"):
        NormSpec(name, Pool.ALL, TimeMode.CUMULATIVE, "X", "no name")
    with pytest.raises(ValueError, match=r"letter or digit"):
        normlib.register(name, normlib.FAMILY[0])
    with pytest.raises(ValueError, match=r"letter or digit"):
        normlib.register("usertestok", normlib.FAMILY[0], aliases=("-",))


def test_an_alias_may_not_be_another_norms_name(uname):
    spec = NormSpec(uname, Pool.ALL, TimeMode.EMA, "MyLN", "desc", decay=0.5)
    with pytest.raises(ValueError, match=r"\['gln'\] are registered norm names"):
        normlib.register(uname, spec, aliases=("GLN",), overwrite=True)
    with pytest.raises(ValueError, match=r"\['gln'\] are registered norm names"):  # said first, not "overwrite"
        normlib.register(uname, spec, aliases=("GLN",))
    assert normlib.get("gln") is normlib.GlobalLayerNorm and uname not in normlib.available()


@pytest.mark.parametrize("class_name", [3, "my norm!", "", None])
def test_spec_class_name_is_an_identifier(class_name):
    with pytest.raises(ValueError, match=r"class_name must be a Python identifier"):
        NormSpec("x", Pool.ALL, TimeMode.CUMULATIVE, class_name, "desc")
    with pytest.raises(TypeError, match=r"description must be a string"):
        NormSpec("x", Pool.ALL, TimeMode.CUMULATIVE, "MyLN", 4)


def test_the_base_class_is_no_layer():
    with pytest.raises(TypeError, match=r"NormLayer is the base class"):
        normlib.NormLayer(4)


def test_a_pinned_backend_shows_in_repr():
    assert "backend='torch'" in repr(normlib.create("cln", 4, backend="torch"))
    assert "backend" not in repr(normlib.create("cln", 4))


def test_family_specs():
    assert tuple(s.name for s in normlib.FAMILY) == NORMS
    table = {s.name: (s.pool, s.time) for s in normlib.FAMILY}
    assert table == {
        "cln": (Pool.ALL, TimeMode.CUMULATIVE), "ccln": (Pool.CHANNEL, TimeMode.CUMULATIVE),
        "gln": (Pool.ALL, TimeMode.GLOBAL), "emaln": (Pool.ALL, TimeMode.EMA),
        "frameln": (Pool.ALL, TimeMode.FRAME), "instln": (Pool.CHANNEL, TimeMode.GLOBAL),
        "ccemaln": (Pool.CHANNEL, TimeMode.EMA),
    }
    assert {s.name for s in normlib.FAMILY if s.causal} == {"cln", "ccln", "emaln", "frameln", "ccemaln"}
    assert SPECS["emaln"].resolve_decay(None) == SPECS["emaln"].decay
    assert SPECS["emaln"].resolve_decay(0.3) == 0.3
    assert SPECS["frameln"].resolve_decay(None) == 0.0 and SPECS["cln"].resolve_decay(None) == 1.0
    assert SPECS["gln"].resolve_decay(None) is None


def test_a_registered_specs_layer_pickles(uname):
    """pickle (and torch.save of a whole model) finds a class by module and name; a registered spec's class is
    no attribute of normlib.modules, so pickling raised PicklingError. It is rebuilt from the spec: the same
    class in this process, the same parameters and output."""
    import copy
    import io
    import pickle

    spec = normlib.NormSpec(uname, normlib.Pool.ALL, normlib.TimeMode.EMA, "UserEMA", "mine", decay=0.5)
    normlib.register(uname, spec)
    layer = normlib.create(uname, 4, eps=1e-5)
    with torch.no_grad():
        layer.weight.mul_(2)
    x = torch.randn(2, 4, 9)
    buf = io.BytesIO()
    torch.save(nn.Sequential(layer), buf)
    buf.seek(0)
    for back in (pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer), torch.load(buf, weights_only=False)[0]):
        assert type(back) is type(layer) and back.spec == spec and back.eps == 1e-5
        assert torch.equal(back.weight, layer.weight) and torch.equal(back(x), layer(x))
    builtin = pickle.loads(pickle.dumps(normlib.create("cln", 4)))
    assert type(builtin) is normlib.CumulativeLayerNorm
    sub = pickle.loads(pickle.dumps(_ScaledCLN(4)))  # a user's subclass keeps its class (pickled by name)
    assert type(sub) is _ScaledCLN and type(copy.deepcopy(sub)) is _ScaledCLN
    sub_of_spec = type("Sub", (type(layer),), {})
    assert type(copy.deepcopy(sub_of_spec(4))) is sub_of_spec


def test_layers_of_an_unregistered_spec_unpickle_into_one_class(uname):
    """Where the spec is not registered (another process), every layer of it comes back with one class."""
    import pickle

    spec = normlib.NormSpec(uname, normlib.Pool.CHANNEL, normlib.TimeMode.CUMULATIVE, "UserCC", "mine")
    blob = pickle.dumps([normlib.layer_class(spec)(3), normlib.layer_class(spec)(3)])
    a, b = pickle.loads(blob)
    assert type(a) is type(b) and a.spec == spec and type(a).__name__ == "UserCC"


class _ScaledCLN(normlib.CumulativeLayerNorm):
    def forward(self, x, **kw):
        return 2 * super().forward(x, **kw)

