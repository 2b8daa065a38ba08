"""The Triton backend as PyTorch ops: opcheck, and torch.compile(fullgraph=True) over a model (interpreter
on CPU here; benchmarks/gpu_report.py runs the same on the GPU with Inductor)."""
import itertools
import warnings

import pytest
import torch
from torch import nn

import normlib
from normlib.backends import triton as tb

from conftest import TOL, rel_err

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU with TRITON_INTERPRET=1


def dev(t):
    return None if t is None else t.to(DEVICE)


def _args(per_channel, decay, state, return_state, save):
    torch.manual_seed(0)
    B, C, T = 2, 5, 19
    x, w, b = (dev(torch.randn(*shape)).requires_grad_() for shape in ((B, C, T), (C,), (C,)))
    nsc = C if per_channel else 1
    sin = None
    if state:
        sin = dev(torch.stack([torch.full((B, nsc), 7.0, dtype=torch.float64),
                               torch.randn(B, nsc, dtype=torch.float64),
                               torch.rand(B, nsc, dtype=torch.float64) * 5])).requires_grad_()
    lengths = dev(torch.tensor([T, 11]))
    with tb.tile_size(block_t=4, window=2):
        tiles = tb.launch.tiles_for(x, per_channel, decay)
    return (x, w, b, lengths, sin, per_channel, decay, 1e-5, False, return_state, save, tiles)


@pytest.mark.parametrize("per_channel,decay,state", [
    pytest.param(False, 1.0, True, id="cln-state"),
    pytest.param(True, 0.9, True, id="ccemaln-state"),
    pytest.param(True, 1.0, True, id="ccln-state"),
    pytest.param(False, None, False, id="gln"),
    pytest.param(False, 0.0, False, id="frameln"),
])
def test_opcheck(per_channel, decay, state, deterministic, monkeypatch):
    """opcheck compares eager gradients with AOTDispatcher's at 1e-7, so both run one plan: a symbolic size's (its
    dynamic test) takes the general launch choices (SEG's two phases where one segment takes one, the span scan),
    whose float32 sums group otherwise (ccln's state gradient: 3 ulps on the H100), so every call here takes them;
    and deterministic, since on a GPU the look-back's grouping varies between two launches otherwise."""
    monkeypatch.setattr(tb.launch, "statically_known_true", lambda expr: False)
    args = _args(per_channel, decay, state, return_state=decay is not None, save=True)
    torch.library.opcheck(tb.running_norm_fwd, args)


@pytest.mark.parametrize("cotangent", ["expanded", "other-layout", "dense"])
def test_backward_reads_dy_in_the_layout_of_y(cotangent, monkeypatch):
    """An expanded dy (from y.sum()) or one in another layout is copied into y's layout first: torch.compile
    hands the op a dense dy, and the same strides compile the same kernel, so eager and compiled gradients
    agree to the bit."""
    x, w, b, lengths, sin, pc, decay, eps, outside, _, _, tiles = _args(False, 1.0, False, False, True)
    seen = []
    real = tb.launch._Step.__call__

    def spy(step, env, stream, aligned):
        if "gy" in env:
            seen.append((env["gy"].stride(), env["gx"].stride()))
        return real(step, env, stream, aligned)

    monkeypatch.setattr(tb.launch._Step, "__call__", spy)
    y, _, pre = tb.launch.forward(x.detach(), w, b, lengths, None, per_channel=False, decay=1.0, eps=eps,
                                  eps_outside=False, return_state=False, save=True, tiles=tiles)
    dense = torch.randn_like(y)
    gy = {"expanded": torch.ones((), device=y.device).expand_as(y), "dense": dense,
          "other-layout": dense.transpose(1, 2).contiguous().transpose(1, 2)}[cotangent]
    opts = dict(per_channel=False, decay=1.0, eps=eps, eps_outside=False, need_weight_grads=True, tiles=tiles)
    got = tb.launch.backward(gy, None, x.detach(), w, lengths, None, pre, **opts)
    want = tb.launch.backward(gy.contiguous(), None, x.detach(), w, lengths, None, pre, **opts)
    assert seen[0][0] == seen[0][1] == y.stride()
    for a, b_ in zip(got[:3], want[:3]):
        assert torch.equal(a, b_)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(6, 6, 3, padding=1)
        self.cln = normlib.create("cln", 6, backend="triton")
        self.ema = normlib.create("ccemaln", 6, decay=0.9, backend="triton")
        self.gln = normlib.create("gln", 6, backend="triton")
        self.ccln = normlib.create("ccln", 6, layout="b t c", backend="triton")

    def forward(self, x, lengths, state):
        h, state = self.cln(self.conv(x), lengths=lengths, state=state, return_state=True)
        h = self.ccln(h.transpose(1, 2), lengths=lengths).transpose(1, 2)
        return self.gln(self.ema(h), lengths=lengths), state


# strip=0: tiles with a look-back, whose launch choice reads more of x; None: the defaults (SEG per channel, on
# one warp with FLIP in "b t c")
@pytest.mark.parametrize("strip", [0, 1, None])
def test_compile_fullgraph_matches_eager(strip):
    torch.manual_seed(1)
    model = _Model().to(DEVICE)
    x = dev(torch.randn(2, 6, 23))
    lengths = dev(torch.tensor([23, 9]))
    state = normlib.NormState(torch.full((2,), 12.0, dtype=torch.float64), torch.randn(2, dtype=torch.float64),
                              torch.rand(2, dtype=torch.float64) * 12).to(DEVICE)
    with tb.tile_size(block_t=8, window=2, strip=strip):
        y_eager, s_eager = model(x, lengths, state)
        y_eager.square().sum().backward()
        g_eager = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y_comp, s_comp = compiled(x, lengths, state)
        y_comp.square().sum().backward()
    assert not [w for w in caught if "lru_cache" in str(w.message)]  # dynamo's warning of a cached call
    assert rel_err(y_comp, y_eager) < TOL[torch.float32]
    assert all(rel_err(a, b) < 1e-10 for a, b in zip(s_comp, s_eager))
    for p, g in zip(model.parameters(), g_eager):
        assert rel_err(p.grad, g) < 1e-4


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
@pytest.mark.parametrize("name", ["cln", "ccln", "gln", "frameln"])
def test_dynamic_shapes_give_the_ops_short_launch_choices(name, layout, monkeypatch):
    """Under dynamic=True the launch choices the ops take are ints but for the spans, which stay short expressions
    of T and B: next_power_of_2 of a symbolic T was some 30 nested terms, repeated in every choice made of it (a
    tile list of thousands of characters; on the H100 a forward + backward trace had not finished after 100 s)."""
    seen = []
    forward = tb.launch.forward

    def spy(*args, **kw):
        seen.append(kw["tiles"])
        return forward(*args, **kw)

    monkeypatch.setattr(tb.launch, "forward", spy)
    torch._dynamo.reset()
    layer = normlib.create(name, 8, backend="triton", layout=layout).to(DEVICE)
    compiled = torch.compile(layer, dynamic=True, backend="aot_eager", fullgraph=True)
    for T in (40, 77):
        x = torch.randn((2, 8, T) if layout == "b c t" else (2, T, 8), device=DEVICE, requires_grad=True)
        compiled(x).sum().backward()
    symbolic = [t for tiles in seen for t in tiles if type(t) is not int]
    assert symbolic  # the fake calls saw T as a symbol
    assert all(len(str(t)) < 200 for t in symbolic), max(map(str, symbolic), key=len)[:300]
    assert {i for tiles in seen for i, t in enumerate(tiles) if type(t) is not int} <= {4, 13}  # the spans


@pytest.mark.parametrize("name", ["cln", "ccln", "gln"])
def test_dynamic_shapes_compile_once_over_many_lengths(name):
    """torch.compile(dynamic=True): one graph for every T, its launch choices guarding on none of it (neither a
    length, nor its divisibility, nor a range: ccln's one segment or several, at T = 301 here)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    layer = normlib.create(name, 4, backend="triton").to(DEVICE)
    compiled = torch.compile(layer, dynamic=True, backend="aot_eager")
    for T in (40, 77, 151, 301):
        x = torch.randn(2, 4, T, device=DEVICE, requires_grad=True)
        y = compiled(x)
        assert rel_err(y, layer(x)) < TOL[torch.float32]
        gy = torch.randn_like(y)  # not y.square(): gln's dx of sum(y^2) is 0 up to rounding
        gx, = torch.autograd.grad(y, x, gy)
        want, = torch.autograd.grad(layer(x), x, gy)
        assert rel_err(gx, want) < 1e-4
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
def test_the_launch_choices_guard_on_neither_the_batch_nor_the_length(layout, monkeypatch):
    """dynamic=True's promise, at the source: the launch choices of a symbolic batch and length (every norm's time
    mode, per channel or pooled) add no guard to the shape environment, so no size starts another graph, on a GPU's
    132 SMs and at sizes that cross each choice's thresholds when concrete (hold_for's bytes, strips, segments,
    GLOBAL's one launch, instln's row walks, "b t c" frames by length)."""
    from torch._dynamo.source import LocalSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    monkeypatch.setattr(tb.launch, "_num_sms", lambda device: 132)
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC, DimDynamic.DYNAMIC])
    for (B, C, T), per_channel, decay in itertools.product(
            [(2, 64, 301), (4, 512, 4000), (1, 128, 64000), (16, 512, 16000)], (False, True), (1.0, 0.9, None, 0.0)):
        env = ShapeEnv()
        mode = FakeTensorMode(shape_env=env, static_shapes=False)
        real = torch.empty(B, T, C).transpose(1, 2) if layout == "b t c" else torch.empty(B, C, T)
        x = mode.from_tensor(real, source=LocalSource("x"), symbolic_context=dynamic)
        with mode:
            tiles = tb.launch._tiles_for(x, per_channel, decay)
        assert any(type(t) is not int for t in tiles) or decay in (None, 0.0), tiles  # the spans: symbolic
        assert not env.guards, ((B, C, T), per_channel, decay, [str(g.expr)[:200] for g in env.guards])


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
@pytest.mark.parametrize("per_channel,decay", [(False, 1.0), (True, 1.0), (False, 0.9), (True, 0.9), (False, None),
                                               (True, None), (False, 0.0)])
def test_the_traced_launches_compute_what_the_eager_ones_do(layout, per_channel, decay, monkeypatch):
    """The launches inside the ops (launch._run_traced, which Inductor takes over on a GPU: fresh zeroed
    workspace and ticket counter, dummy pointers, every argument by name) run here as plain launches of the
    interpreted kernels: forward and backward, with lengths and an incoming state, equal to the eager launches'
    to the bit. On the CPU the ops are otherwise opaque, so nothing else runs this path before a GPU does."""
    counters = []

    class Plain:  # wrap_triton's stand-in: the launch itself, and each look-back launch's counter after it
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(**kw):
                self.kernel[grid](**kw)
                if kw.get("CTR_IN_WS"):
                    counters.append(int(kw["ws_ptr"][-1]))
            return launch

    monkeypatch.setattr(torch.library, "wrap_triton", Plain)
    g = torch.Generator().manual_seed(3)
    B, C, T = 2, 5, 19
    x = torch.randn((B, T, C) if layout == "b t c" else (B, C, T), generator=g)
    x = dev(x.transpose(1, 2) if layout == "b t c" else x)
    w, b = dev(torch.randn(C, generator=g)), dev(torch.randn(C, generator=g))
    lengths = dev(torch.tensor([T, 11]))
    nsc = C if per_channel else 1
    running = decay not in (None, 0.0)
    sin = dev(torch.stack([torch.full((B, nsc), 3.0, dtype=torch.float64), torch.randn(B, nsc, dtype=torch.float64,
                           generator=g), torch.rand(B, nsc, dtype=torch.float64, generator=g)])) if running else None
    gy = torch.randn_like(x)
    with tb.tile_size(block_t=4, window=2, span=3):  # GLOBAL: 2 spans of 3 tiles, in one launch (forced below)
        tiles = tb.launch.tiles_for(x, per_channel, decay)
    opts = dict(per_channel=per_channel, decay=decay, eps=1e-5, eps_outside=False, tiles=tiles)
    got = []
    with tb.tile_size(global_launches=1):
        for traced in (False, True):
            y, sout, pre = tb.launch.forward(x, w, b, lengths, sin, return_state=running, save=True, traced=traced,
                                             **opts)
            gsout = torch.ones_like(sout) if running else None
            grads = tb.launch.backward(gy, gsout, x, w, lengths, sin, pre, need_weight_grads=True, traced=traced,
                                       **opts)
            got.append([t for t in (y, sout, pre, *grads) if t is not None])
    assert len(got[0]) == len(got[1])
    for i, (a, t) in enumerate(zip(*got)):
        assert torch.equal(a, t), i
    # look-back launches and GLOBAL's one launch count their tickets in the word after the records (one zeroed
    # buffer): every program took one, and the last moved the counter to the next epoch
    p = tb.launch.plan(tuple(x.shape), per_channel, decay, tiles)
    one_global = decay is None and p.nspan <= p.window  # GLOBAL's one launch (its spans fit a window)
    assert one_global or decay is not None
    assert counters == ([1 << 32] * 2 if (running or one_global) and not tiles[7] else []), counters


@pytest.mark.parametrize("layout", ["b c t", "b t c"])
def test_a_traced_call_guards_on_neither_the_batch_nor_the_length(layout, monkeypatch):
    """Past the launch choices: the traced forward and backward of a symbolic batch and length, whose every
    tensor wrap_triton's tracing checks for contiguity, add no guard but the int32 bounds of the grids and T
    (on the H100 a (2, NT, C) buffer guarded on NT == 1, so T = 40 then 77 made two graphs; a scan's program
    count guarded on B < 132)."""
    from torch._dynamo.source import LocalSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    monkeypatch.setattr(tb.launch, "_num_sms", lambda device: 132)
    real = tb.launch._run_traced

    def touch(steps, need, env, device):
        for t in env.values():
            if isinstance(t, torch.Tensor):
                t.is_contiguous()
        return real(steps, need, env, device)

    monkeypatch.setattr(tb.launch, "_run_traced", touch)
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC, DimDynamic.DYNAMIC])
    for per_channel, decay in itertools.product((False, True), (1.0, 0.9, None, 0.0)):
        env = ShapeEnv()
        mode = FakeTensorMode(shape_env=env, static_shapes=False)
        real_x = torch.empty(2, 40, 4).transpose(1, 2) if layout == "b t c" else torch.empty(2, 4, 40)
        x = mode.from_tensor(real_x, source=LocalSource("x"), symbolic_context=dynamic)
        with mode:
            w = torch.empty(4)
            tiles = tb.launch._tiles_for(x, per_channel, decay)
            opts = dict(per_channel=per_channel, decay=decay, eps=1e-5, eps_outside=False, tiles=tiles, traced=True)
            y, _, pre = tb.launch.forward(x, w, w, None, None, return_state=False, save=True, **opts)
            tb.launch.backward(torch.empty_like(y), None, x, w, None, None, pre, need_weight_grads=True, **opts)
        bad = [str(g.expr) for g in env.guards if "2147" not in str(g.expr)]
        assert not bad, (per_channel, decay, bad)


def test_concrete_sizes_take_no_symbolic_min_or_max(monkeypatch):
    """Concrete sizes' launch choices call neither torch.sym_max nor torch.sym_min: dynamo of torch 2.11 rejects
    them on two ints ("torch.* op returned non-Tensor"), which broke every compiled graph at the norm on the H100
    (the compiled Conv-TasNet ran eager, 2.3 times slower than with the traced formula)."""
    def refuse(*args):
        raise AssertionError(f"torch.sym_max/sym_min of {args}")

    monkeypatch.setattr(torch, "sym_max", refuse)
    monkeypatch.setattr(torch, "sym_min", refuse)
    monkeypatch.setattr(tb.launch, "_num_sms", lambda device: 132)
    for (B, C, T), per_channel, decay, layout in itertools.product(
            [(2, 64, 301), (4, 512, 4000), (1, 128, 64000)], (False, True), (1.0, 0.9, None, 0.0), ("b c t", "b t c")):
        x = torch.empty((B, T, C) if layout == "b t c" else (B, C, T), device="meta")
        x = x.transpose(1, 2) if layout == "b t c" else x
        assert all(type(t) is int for t in tb.launch._tiles_for(x, per_channel, decay))


@pytest.mark.parametrize("name", ["cln", "ccln", "gln", "ccemaln", "instln"])
def test_the_launch_choices_of_a_symbolic_length_are_right_at_any_length(name, monkeypatch):
    """What a symbolic T gets (statically_known_true settles nothing: the span scan and SEG's two phases
    whatever the number of spans, the forward's own span, BLOCK_R at its cap), run on concrete lengths of one
    tile to many segments, forward and every gradient against the float64 reference."""
    monkeypatch.setattr(tb.launch, "statically_known_true", lambda expr: False)
    for T in (1, 3, 40, 301):
        x = dev(torch.randn(2, 4, T, dtype=torch.float32) + 3.0)
        w, b = dev(torch.randn(4)), dev(torch.randn(4))
        gy = torch.randn_like(x)
        with tb.tile_size(block_t=4, window=2):
            got = [t.detach().requires_grad_() for t in (x, w, b)]
            y = normlib.functional.norm(name, *got, backend="triton")
            grads = torch.autograd.grad(y, got, gy)
        want = [t.double().requires_grad_() for t in (x, w, b)]
        yr = normlib.reference.REFERENCES[name](*want)
        wgrads = torch.autograd.grad(yr, want, gy.double())
        assert rel_err(y, yr) < 1e-5, T
        for g, r in zip(grads, wgrads):
            assert rel_err(g, r) < 1e-4, T


@pytest.mark.parametrize("backend,dynamic", [("aot_eager", False), ("eager", False), ("aot_eager", True)])
def test_like_layers_share_one_traced_region(backend, dynamic):
    """Under torch.compile the op is a nested compile region: three like layers call one subgraph, which Inductor
    compiles once (the forward and its backward) rather than three times. backend="eager" traces the op plainly
    (torch cannot run the backward of a region there), and so does dynamic=True (eps is a symbolic float there,
    which torch 2.11's region rejects). All train as eager does."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    record.__name__ = backend  # Dynamo names a callable backend by it: the name the region's choice reads
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(*[normlib.create("cln", 4, backend="triton") for _ in range(3)]).to(DEVICE)
    x = torch.randn(2, 4, 10, device=DEVICE, requires_grad=True)
    torch.compile(model, backend=record, fullgraph=True, dynamic=dynamic)(x).square().sum().backward()
    got = x.grad
    x.grad = None
    model(x).square().sum().backward()
    assert rel_err(got, x.grad) < 1e-5
    calls = [n for n in graphs[0].graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == (3 if backend == "aot_eager" and not dynamic else 0)
    assert len({n.args[1] for n in calls}) == (1 if calls else 0)
    # a new eps recompiles, Dynamo making it a symbolic float (automatic dynamic): the region takes it as a
    # constant (torch 2.11's region rejects a symbolic float) and stays
    for layer in model:
        layer.eps = 1e-3
    y = torch.compile(model, backend=record, fullgraph=True, dynamic=dynamic)(x)
    assert rel_err(y, model(x)) < TOL[torch.float32]
    calls = [n for n in graphs[-1].graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == (3 if backend == "aot_eager" and not dynamic else 0)
    # the choice itself, read at trace time (torch 2.13 would inline a region of a symbolic eps by itself)
    torch._dynamo.reset()
    region = torch.compile(lambda t: t * (2.0 if tb._in_a_region() else 3.0), backend=backend, dynamic=dynamic)
    assert region(torch.ones(2)).tolist() == ([2.0, 2.0] if backend == "aot_eager" and not dynamic else [3.0, 3.0])
