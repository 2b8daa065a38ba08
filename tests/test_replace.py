"""normlib.replace_norms: every swap keeps the model's outputs and parameters; what it leaves, it says why;
mappings choose other targets. Foreign classes: asteroid 0.7's own (installed by `make setup` without its
dependencies) and stand-ins for SpeechBrain's, ESPnet's and the Conv-TasNet code bases' (tests/foreign_norms)."""
import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import types

import pytest
import torch
from torch import nn

import normlib
from conftest import TOL, assert_rel
from foreign_norms import espnet_tcn, kaituoxu, naplab, speechbrain_conv_tasnet, speechbrain_dual_path

F64, F32 = torch.float64, torch.float32


def randomize(model):
    """Random affine parameters (ones and zeros would hide a weight that is not carried)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=F64).to(p.dtype))
    return model


def params(model):
    return {name: (p.detach().clone(), p.requires_grad, p.device, p.dtype) for name, p in model.named_parameters()}


def check_same_outputs(model, x, dtype=F64, **kw):
    """Swap, and compare the outputs before and after (and return the report)."""
    model = model.to(dtype)
    x = x.to(dtype)
    with torch.no_grad():
        before = model(x)
    report = normlib.replace_norms(model, **kw)
    with torch.no_grad():
        after = model(x)
    assert_rel(after, before, 1e-12 if dtype == F64 else 10 * TOL[F32], "outputs after the swap")
    return report


class Net(nn.Module):
    """A conv, then one norm, on (B, C, T) (or (B, T, C) with ``channels_last``)."""

    def __init__(self, norm, C=6, channels_last=False):
        super().__init__()
        self.conv = nn.Conv1d(3, C, 3, padding=1)
        self.norm = norm
        self.channels_last = channels_last

    def forward(self, x):
        h = self.conv(x)
        if self.channels_last:
            return self.norm(h.transpose(1, 2)).transpose(1, 2)
        return self.norm(h)


X = torch.randn(3, 3, 17, generator=torch.Generator().manual_seed(0), dtype=F64)

TORCH_SWAPS = [
    pytest.param(lambda: nn.GroupNorm(1, 6), "gln", id="GroupNorm(1,C)"),
    pytest.param(lambda: nn.GroupNorm(1, 6, eps=1e-8, affine=False), "gln", id="GroupNorm(1,C)-noaffine"),
    pytest.param(lambda: nn.GroupNorm(6, 6, eps=1e-3), "instln", id="GroupNorm(C,C)"),
    pytest.param(lambda: nn.InstanceNorm1d(6, affine=True), "instln", id="InstanceNorm1d-affine"),
    pytest.param(lambda: nn.InstanceNorm1d(6), "instln", id="InstanceNorm1d"),
]


# ------------------------------------------------------------------------------------------------------
# PyTorch's norms
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("make, target", TORCH_SWAPS)
def test_torch_norms_swap_with_the_same_outputs(make, target, dtype):
    model = randomize(Net(make()))
    old = model.norm
    report = check_same_outputs(model, X, dtype)
    assert isinstance(model.norm, normlib.get(target))
    assert report.swapped == [("norm", type(old), target, model.norm)] and report.left == []
    assert model.norm.eps == old.eps and model.norm.layout == "b c t"
    assert (model.norm.weight is None) == (old.weight is None)


def test_parameters_are_carried_with_their_settings():
    model = randomize(nn.Sequential(nn.Conv1d(3, 6, 1), nn.GroupNorm(1, 6), nn.InstanceNorm1d(6, affine=True)))
    model[1].bias.requires_grad_(False)
    model[2].eval()  # the mode of each module is kept
    before = params(model)
    normlib.replace_norms(model)
    after = params(model)
    assert sorted(before) == sorted(after)  # GroupNorm and InstanceNorm1d name them weight and bias too
    for name, (value, grad, device, dtype) in before.items():
        v2, g2, d2, t2 = after[name]
        assert torch.equal(v2, value) and (g2, d2, t2) == (grad, device, dtype), name
    assert model[1].training and not model[2].training
    assert all(type(p) is nn.Parameter for p in model.parameters())


def test_device_and_dtype_are_kept():
    """On the meta device: the new parameters are made where the old ones were, in their dtype."""
    model = nn.Sequential(nn.GroupNorm(1, 8, device="meta", dtype=torch.float16))
    normlib.replace_norms(model)
    assert model[0].weight.device.type == "meta" and model[0].weight.dtype == torch.float16


def test_left_norms_say_why():
    model = nn.Sequential(nn.GroupNorm(2, 6), nn.BatchNorm1d(6), nn.InstanceNorm1d(6, track_running_stats=True),
                          nn.LayerNorm(6), nn.LayerNorm((6, 5)), nn.BatchNorm2d(6), nn.InstanceNorm2d(6),
                          nn.RMSNorm(6))
    report = normlib.replace_norms(model)
    assert report.swapped == []
    reasons = {name: (cls, why) for name, cls, why in report.left}
    assert list(reasons) == [str(i) for i in range(8)]
    assert "num_groups=2" in reasons["0"][1]
    assert "batch statistics" in reasons["1"][1] and "batch statistics" in reasons["5"][1]
    assert "track_running_stats" in reasons["2"][1]
    assert "mapping={nn.LayerNorm: 'frameln'}" in reasons["3"][1]
    assert "last 2 dims" in reasons["4"][1]
    assert "4-D or 5-D" in reasons["6"][1] and "RMS" in reasons["7"][1]
    assert [type(m) for m in model] == [cls for cls, _ in reasons.values()]  # all still there


def test_report_prints_what_was_done():
    model = nn.Sequential(nn.GroupNorm(1, 4), nn.GroupNorm(2, 4))
    report = normlib.replace_norms(model)
    assert repr(report) == "ReplaceReport(1 swapped, 1 left)"
    text = str(report)
    assert text.splitlines()[0] == "swapped 1 norm(s), left 1"
    assert "swapped 0: GroupNorm -> gln(4, eps=1e-05" in text and "layout='b c t'" in text
    assert "left    1: GroupNorm: num_groups=2" in text


def test_subclasses_are_not_swapped_unless_mapped():
    class MyGroupNorm(nn.GroupNorm):
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.Sequential(MyGroupNorm(1, 4))
    report = normlib.replace_norms(model)
    assert report.swapped == [] and "subclass of nn.GroupNorm" in report.left[0].reason
    report = normlib.replace_norms(model, {MyGroupNorm: "gln"})
    assert report.swapped[0].new == "gln"


def test_a_model_without_norms():
    model = nn.Sequential(nn.Conv1d(3, 3, 1), nn.ReLU())
    report = normlib.replace_norms(model)
    assert report.swapped == report.left == [] and str(report) == "swapped 0 norm(s), left 0"


def test_an_unknown_norm_is_reported_and_a_normlib_layer_is_not():
    class MyNorm(nn.Module):
        def forward(self, x):
            return x / x.std()

    model = nn.Sequential(MyNorm(), normlib.get("cln")(4), nn.Sequential(nn.ReLU()))
    report = normlib.replace_norms(model)
    assert report.swapped == [] and [(x.name, x.cls) for x in report.left] == [("0", MyNorm)]
    assert "not recognized" in report.left[0].reason


def test_a_shared_norm_is_swapped_once():
    shared = randomize(nn.GroupNorm(1, 4))
    inner = nn.Sequential(shared, nn.ReLU())
    model = nn.ModuleDict({"a": shared, "b": inner, "c": inner})
    model.first = shared  # the same module under a third name
    report = normlib.replace_norms(model)
    assert [s.name for s in report.swapped] == ["a"]
    new = report.swapped[0].module
    assert model["a"] is new and model["b"][0] is new and model["c"][0] is new and model.first is new
    assert len(list(model.parameters())) == 2


def test_a_model_that_is_a_norm_is_refused():
    with pytest.raises(ValueError, match="model is itself a norm"):
        normlib.replace_norms(nn.GroupNorm(1, 4))
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        normlib.replace_norms([nn.GroupNorm(1, 4)])


def test_example_inputs_leave_a_norm_called_on_other_shapes():
    class Net4d(nn.Module):
        def __init__(self):
            super().__init__()
            self.n3, self.n4, self.bn = nn.GroupNorm(1, 4), nn.GroupNorm(1, 4), nn.BatchNorm1d(4)
            self.dropout = nn.Dropout()

        def forward(self, x):
            return self.n4(self.dropout(self.n3(self.bn(x)))[..., None])[..., 0]

    model = randomize(Net4d())
    x = torch.randn(2, 4, 9)
    mean = model.bn.running_mean.clone()
    report = normlib.replace_norms(model, example_inputs=x)
    assert [s.name for s in report.swapped] == ["n3"]
    assert report.left[0].name == "n4" and "(2, 4, 9, 1)" in report.left[0].reason
    assert model.training and model.dropout.training  # the probe ran in eval mode, then gave the modes back
    assert torch.equal(model.bn.running_mean, mean)  # ... so the batch norm's statistics did not move
    # without example inputs the swap happens, and the 4-D call then fails loudly
    normlib.replace_norms(model)
    with pytest.raises(ValueError, match="3 dims"):
        model(x)


@pytest.mark.filterwarnings("ignore:input's size at dim=1 does not match num_features")
def test_example_inputs_leave_a_norm_with_its_channels_elsewhere():
    model = Net(nn.GroupNorm(1, 6))
    model.norm = nn.InstanceNorm1d(17)  # called on (B, 6, 17): its num_features are not the channels
    report = normlib.replace_norms(model, example_inputs=(X.float(),))
    assert report.swapped == [] and "channel dim" in report.left[0].reason


# ------------------------------------------------------------------------------------------------------
# mapping
# ------------------------------------------------------------------------------------------------------

def test_mapping_group_norm_to_cln_makes_the_model_causal():
    model = randomize(nn.Sequential(nn.Conv1d(3, 6, 1), nn.GroupNorm(1, 6, eps=1e-6), nn.PReLU()))
    gn = model[1]
    x = X.float().clone()
    report = normlib.replace_norms(model, {nn.GroupNorm: "cln"})
    assert report.swapped == [("1", nn.GroupNorm, "cln", model[1])]
    assert torch.equal(model[1].weight, gn.weight) and model[1].eps == 1e-6
    y = model(x)
    t = 8
    x2 = x.clone()
    x2[..., t + 1:] += 5 * torch.randn_like(x2[..., t + 1:])
    y2 = model(x2)
    assert torch.equal(y[..., :t + 1], y2[..., :t + 1])  # frames 0..t do not see later ones
    assert not torch.allclose(y[..., t + 1:], y2[..., t + 1:])
    ref = normlib.reference.cln(model[0](x).double(), gn.weight.double(), gn.bias.double(), 1e-6)
    assert_rel(model[1](model[0](x)), ref, TOL[F32], "the swapped cln")


@pytest.mark.parametrize("key", [nn.GroupNorm, "GroupNorm", "torch.nn.modules.normalization.GroupNorm"],
                         ids=["class", "name", "qualified-name"])
@pytest.mark.parametrize("target", ["cln", "c_LN", normlib.CumulativeLayerNorm,
                                    functools.partial(normlib.EMALayerNorm, decay=1.0)],
                         ids=["name", "alias", "class", "partial"])
def test_mapping_keys_and_targets(key, target):
    model = randomize(Net(nn.GroupNorm(3, 6)))  # left without a mapping; swapped when asked
    x = X.float()
    gn = model.norm
    normlib.replace_norms(model, {key: target})
    expect = normlib.reference.cln(model.conv(x).double(), gn.weight.double(), gn.bias.double(), gn.eps)
    assert_rel(model(x), expect, TOL[F32], "GroupNorm(3, C) mapped to a cumulative norm")


def test_mapping_a_partial_keeps_its_own_keywords():
    model = Net(nn.GroupNorm(1, 6, eps=1e-5))
    normlib.replace_norms(model, {nn.GroupNorm: functools.partial(normlib.EMALayerNorm, decay=0.5, eps=1e-3)})
    assert model.norm.decay == 0.5 and model.norm.eps == 1e-3


def test_mapping_a_callable_and_none():
    model = nn.Sequential(nn.GroupNorm(1, 4), nn.BatchNorm1d(4), nn.GroupNorm(4, 4))
    seen = []
    report = normlib.replace_norms(model, {nn.BatchNorm1d: lambda m: seen.append(m) or nn.Identity(),
                                           nn.GroupNorm: None})
    assert isinstance(model[1], nn.Identity) and isinstance(seen[0], nn.BatchNorm1d)
    assert report.swapped == [("1", nn.BatchNorm1d, "Identity", model[1])]
    assert [(x.name, x.reason) for x in report.left] == [("0", "kept: mapping[GroupNorm] is None"),
                                                        ("2", "kept: mapping[GroupNorm] is None")]


def test_mapping_layer_norm_to_frameln_runs_channels_last():
    model = randomize(Net(nn.LayerNorm(6, eps=1e-6), channels_last=True))
    report = check_same_outputs(model, X, F64, mapping={nn.LayerNorm: "frameln"})
    assert model.norm.layout == "b t c" and report.swapped[0].new == "frameln"
    model = randomize(Net(nn.LayerNorm(6, bias=False), channels_last=True))
    check_same_outputs(model, X, F32, mapping={nn.LayerNorm: "frameln"})
    assert model.norm.bias is None and model.norm.weight is not None


def test_mapping_normlib_layers_to_another():
    model = nn.Sequential(normlib.get("gln")(4, eps_mode="outside", layout="b t c"))
    normlib.replace_norms(model, {normlib.GlobalLayerNorm: "cln"})
    assert isinstance(model[0], normlib.CumulativeLayerNorm)
    assert (model[0].eps_mode, model[0].layout) == ("outside", "b t c")


def test_mapping_errors_name_the_argument():
    model = nn.Sequential(nn.GroupNorm(1, 4), nn.LayerNorm((4, 3)))
    with pytest.raises(ValueError, match=r"mapping\[GroupNorm\]: unknown norm 'xln'; known norms: ccemaln"):
        normlib.replace_norms(model, {nn.GroupNorm: "xln"})
    with pytest.raises(TypeError, match="mapping must be a dict"):
        normlib.replace_norms(model, [(nn.GroupNorm, "cln")])
    with pytest.raises(TypeError, match="mapping's keys must be nn.Module classes or class names"):
        normlib.replace_norms(model, {1: "cln"})
    with pytest.raises(TypeError, match=r"mapping\[GroupNorm\]: a class must be a normlib layer class"):
        normlib.replace_norms(model, {nn.GroupNorm: nn.Identity})
    with pytest.raises(TypeError, match=r"mapping\['GroupNorm'\] must be a normlib name"):
        normlib.replace_norms(model, {"GroupNorm": 3})
    with pytest.raises(TypeError, match=r"mapping\[GroupNorm\] must return an nn.Module, got int"):
        normlib.replace_norms(model, {nn.GroupNorm: lambda m: 0})
    with pytest.raises(ValueError, match=r"mapping\[LayerNorm\]: cannot read .* last 2 dims"):
        normlib.replace_norms(model, {nn.LayerNorm: "cln"})
    assert type(model[0]) is nn.GroupNorm  # checked before anything was swapped


# ------------------------------------------------------------------------------------------------------
# Other projects' classes (stand-ins, tests/foreign_norms)
# ------------------------------------------------------------------------------------------------------

FOREIGN = [
    pytest.param(lambda: naplab.cLN(6), False, "cln", "b c t", 1e-8, id="naplab-cLN"),
    pytest.param(lambda: naplab.cLN(6, eps=1e-5, trainable=False), False, "cln", "b c t", 1e-5,
                 id="naplab-cLN-fixed"),
    pytest.param(lambda: kaituoxu.GlobalLayerNorm(6), False, "gln", "b c t", 1e-8, id="kaituoxu-gLN"),
    pytest.param(lambda: kaituoxu.ChannelwiseLayerNorm(6), False, "frameln", "b c t", 1e-8, id="kaituoxu-cLN"),
    pytest.param(lambda: speechbrain_conv_tasnet.GlobalLayerNorm(6), True, "gln", "b t c", 1e-8,
                 id="speechbrain-gLN"),
    pytest.param(lambda: speechbrain_conv_tasnet.ChannelwiseLayerNorm(6), True, "frameln", "b t c", 1e-8,
                 id="speechbrain-cLN"),
    pytest.param(lambda: espnet_tcn.GlobalLayerNorm(6), False, "gln", "b c t", espnet_tcn.EPS, id="espnet-gLN"),
    pytest.param(lambda: espnet_tcn.ChannelwiseLayerNorm(6, shape="BTD"), True, "frameln", "b t c",
                 espnet_tcn.EPS, id="espnet-cLN-BTD"),
    pytest.param(lambda: speechbrain_dual_path.GlobalLayerNorm(6, 3), False, "gln", "b c t", 1e-8,
                 id="speechbrain-dualpath-gLN"),
    pytest.param(lambda: speechbrain_dual_path.GlobalLayerNorm(6, 3, eps=1e-6, elementwise_affine=False), False,
                 "gln", "b c t", 1e-6, id="speechbrain-dualpath-gLN-noaffine"),
    pytest.param(lambda: speechbrain_dual_path.CumulativeLayerNorm(6), False, "frameln", "b c t", 1e-8,
                 id="speechbrain-dualpath-CumulativeLayerNorm"),
]


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("make, channels_last, target, layout, eps", FOREIGN)
def test_foreign_norms_swap_with_the_same_outputs(make, channels_last, target, layout, eps, dtype):
    norm = make()
    model = randomize(Net(norm, channels_last=channels_last))
    trainable = [p.requires_grad for p in norm.parameters()]
    report = check_same_outputs(model, X, dtype)
    assert report.swapped == [("norm", type(norm), target, model.norm)] and report.left == []
    assert (model.norm.layout, model.norm.eps) == (layout, eps)
    assert [p.requires_grad for p in model.norm.parameters()] == trainable


def test_foreign_variants_that_do_not_fit_are_left():
    model = nn.Sequential(speechbrain_dual_path.GlobalLayerNorm(6, 4), kaituoxu.GlobalLayerNorm(1),
                          naplab.cLN(4, trainable=False))
    model[2].gain = 2 * model[2].gain  # a fixed gain other than one: carried as a frozen weight
    report = normlib.replace_norms(model)
    assert [x.name for x in report.left] == ["0", "1"]
    assert report.left[0].reason.startswith("SpeechBrain's dual-path gLN for 4-D (N, C, K, S) inputs")
    assert report.left[1].reason.startswith("one channel: its gamma of shape (1, 1, 1) does not tell its layout")
    assert report.swapped[0].name == "2" and not model[2].weight.requires_grad
    assert torch.equal(model[2].weight, torch.full((4,), 2.0))


def test_a_foreign_class_without_a_readable_eps_is_left():
    mod = types.ModuleType("no_eps_here")  # a copy of kaituoxu's class in a file without EPS
    cls = type("GlobalLayerNorm", (kaituoxu.GlobalLayerNorm,), {"__module__": mod.__name__})
    sys.modules[mod.__name__] = mod
    try:
        report = normlib.replace_norms(nn.Sequential(cls(4)))
    finally:
        del sys.modules[mod.__name__]
    assert "eps is not readable" in report.left[0].reason


# ------------------------------------------------------------------------------------------------------
# asteroid 0.7 itself
# ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def asteroid():
    """asteroid's masknn modules, imported without asteroid/__init__.py and asteroid/masknn/__init__.py: those
    import its models, losses and torchaudio, whose build from the registry does not load against a CPU torch.
    `make setup` installs asteroid 0.7.0 and asteroid-filterbanks without their dependencies."""
    spec = importlib.util.find_spec("asteroid")
    if spec is None:
        pytest.skip("asteroid is not installed (`make setup` installs asteroid 0.7.0 without its dependencies)")
    version = importlib.metadata.version("asteroid")
    if not version.startswith("0.7."):
        pytest.skip(f"asteroid {version} is installed; these tests are written against asteroid 0.7")
    before = set(sys.modules)
    root = spec.submodule_search_locations[0]
    if "asteroid" not in sys.modules:  # packages without their __init__: their submodules import as usual
        for name, path in (("asteroid", root), ("asteroid.masknn", f"{root}/masknn")):
            pkg = types.ModuleType(name)
            pkg.__path__ = [path]
            sys.modules[name] = pkg
    try:
        yield types.SimpleNamespace(norms=importlib.import_module("asteroid.masknn.norms"),
                                    convolutional=importlib.import_module("asteroid.masknn.convolutional"))
    finally:  # a later `import asteroid` in this process finds the real package
        for name in set(sys.modules) - before:
            if name == "asteroid" or name.startswith("asteroid."):
                del sys.modules[name]


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("cls, target", [("GlobLN", "gln"), ("ChanLN", "frameln"), ("CumLN", "cln"),
                                         ("FeatsGlobLN", "instln")])
def test_asteroid_norms(asteroid, cls, target, dtype):
    norm = getattr(asteroid.norms, cls)(6)
    alias = {"GlobLN": "gLN", "ChanLN": "cLN", "CumLN": "cgLN", "FeatsGlobLN": "fgLN"}[cls]
    assert asteroid.norms.get(alias) is type(norm)  # the name a model's norm_type gives
    model = randomize(Net(norm))
    report = check_same_outputs(model, X, dtype)
    assert report.swapped == [("norm", type(norm), target, model.norm)]
    assert model.norm.eps == 1e-8 and model.norm.layout == "b c t"
    assert "norm.weight" in dict(model.named_parameters()) and "norm.gamma" not in dict(model.named_parameters())


def test_asteroid_batch_norm_is_left(asteroid):
    report = normlib.replace_norms(nn.Sequential(asteroid.norms.BatchNorm(6)))
    assert report.left[0].cls.__name__ == "BatchNorm" and "batch statistics" in report.left[0].reason


@pytest.mark.parametrize("norm_type, target", [("gLN", "gln"), ("cLN", "frameln"), ("cgLN", "cln"),
                                               ("fgLN", "instln")])
def test_asteroid_tdconvnet(asteroid, norm_type, target):
    """asteroid's whole Conv-TasNet masker: the same masks before and after, every norm swapped."""
    masker = asteroid.convolutional.TDConvNet(16, 2, n_blocks=3, n_repeats=2, bn_chan=8, hid_chan=12, skip_chan=8,
                                              norm_type=norm_type, mask_act="sigmoid").double()
    randomize(masker)
    n_norms = sum(type(m).__name__ in ("GlobLN", "ChanLN", "CumLN", "FeatsGlobLN") for m in masker.modules())
    assert n_norms == 1 + 2 * 3 * 2  # the bottleneck's and two per block
    x = torch.randn(2, 16, 40, dtype=F64)
    report = check_same_outputs(masker, x, F64, example_inputs=x)
    assert len(report.swapped) == n_norms and report.left == []
    assert {s.new for s in report.swapped} == {target}
    assert report.swapped[0].name == "bottleneck.0"


def test_asteroid_tdconvnet_made_causal(asteroid):
    masker = asteroid.convolutional.TDConvNet(16, 2, n_blocks=2, n_repeats=1, bn_chan=8, hid_chan=12, skip_chan=8,
                                              norm_type="gLN", causal=True)
    report = normlib.replace_norms(masker, {"GlobLN": "cln"})
    assert len(report.swapped) == 5 and {s.new for s in report.swapped} == {"cln"}
    x = torch.randn(1, 16, 30)
    x2 = x.clone()
    x2[..., 20:] = torch.randn(1, 16, 10)
    with torch.no_grad():
        assert torch.equal(masker(x)[..., :20], masker(x2)[..., :20])


# ------------------------------------------------------------------------------------------------------
# The guide's first example prints what the page says
# ------------------------------------------------------------------------------------------------------

def test_the_guide_example():
    import contextlib
    import io
    import pathlib
    import re

    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide" / "replace.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    said = []  # what the page says each print shows: its trailing comments, and comment lines after a print
    for line in code.splitlines():
        if line.startswith("# "):
            said.append(line[2:])
        elif line.startswith("print(") and "#" in line:
            said.append(line.split("#", 1)[1].strip())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/guide/replace.md", "exec"), {})
    assert out.getvalue().split("\n")[:-1] == said
