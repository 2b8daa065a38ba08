"""normlib.stream(model): a model's normlib layers keep their states between calls. Chunk by chunk equals the whole
sequence (every causal norm, both layouts, both backends), reset and reset(mask), detach, saving and restoring the
states, lengths per call, the refusal of non-causal norms, and torch.compile without a recompilation per chunk
length."""
import io
import random

import pytest
import torch
from torch import nn

import normlib
from normlib import NormState
from conftest import CAUSAL, EMA, GLOBAL, LAYOUTS, TOL, assert_rel, assert_state_close, make_x, time_dim

F64 = torch.float64


def chunk_sizes(T, seed):
    """Random chunk sizes summing to T, with plenty of one-frame chunks."""
    rng = random.Random(seed)
    sizes = []
    while sum(sizes) < T:
        sizes.append(min(rng.choice([1, 1, 2, 3, 5, 8]), T - sum(sizes)))
    return sizes


class Net(nn.Module):
    """Pointwise (causal) mixing and two norm layers, in either layout; ``twice`` calls the first norm twice."""

    def __init__(self, name, C=5, layout="b c t", backend="torch", twice=False, dtype=F64):
        super().__init__()
        kw = dict(layout=layout, backend=backend, dtype=dtype, **({"decay": 0.8} if name in EMA else {}))
        self.layout, self.twice = layout, twice
        self.mix = nn.Linear(C, C, dtype=dtype)
        self.norm1 = normlib.create(name, C, **kw)
        self.norm2 = normlib.create(name, C, **kw)

    def _mix(self, x):
        return self.mix(x) if self.layout == "b t c" else self.mix(x.transpose(1, 2)).transpose(1, 2)

    def forward(self, x):
        h = self.norm1(self._mix(x))
        if self.twice:
            h = self.norm1(torch.tanh(h))
        return self.norm2(torch.tanh(self._mix(h)) + x)


def chunks(model, x, sizes, layout="b c t"):
    """The model over x's chunks, concatenated."""
    td = time_dim(layout)
    return torch.cat([model(c) for c in x.split(sizes, td)], td)


def streamed(model, x, sizes, layout="b c t"):
    """The model over x's chunks, in a new stream."""
    with normlib.stream(model):
        return chunks(model, x, sizes, layout)


# ---------------------------------------------------------------------------------------------------
# Chunk by chunk == the whole sequence
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda v: v.replace(" ", ""))
@pytest.mark.parametrize("name", CAUSAL)
def test_chunks_equal_the_whole_sequence(name, layout, twice):
    model = Net(name, layout=layout, twice=twice)
    x = make_x(3, 5, 40, layout, F64, offset=0.5)
    y = model(x)
    for seed in range(3):
        assert_rel(streamed(model, x, chunk_sizes(40, seed), layout=layout), y, 1e-12, f"chunks of seed {seed}")
    assert_rel(streamed(model, x, [1] * 40, layout=layout), y, 1e-12, "one-frame chunks")


@pytest.mark.parametrize("name", CAUSAL)
def test_chunks_equal_the_whole_sequence_on_triton(name):
    """The Triton kernels (in the interpreter on CPU: tiny shapes), float32."""
    model = Net(name, C=3, backend="triton", dtype=torch.float32)
    x = make_x(2, 3, 9)
    y = model(x)
    assert_rel(streamed(model, x, [1, 3, 1, 4]), y, TOL[torch.float32], "triton chunks")


def test_a_layer_called_twice_keeps_a_state_per_use():
    model = Net("cln", twice=True)
    with normlib.stream(model) as s:
        model(make_x(2, 5, 4, dtype=F64))
    assert list(s.states) == ["norm1", "norm1#1", "norm2"]
    assert all(st.w[0] == 20 for st in s.states.values())  # 4 frames of 5 channels, each use its own sequence


def test_a_layer_called_alone_in_a_stream_of_its_model():
    """A layer called by itself (not through the streamed model) threads its first state."""
    model = Net("emaln")
    x = make_x(2, 5, 12, dtype=F64)
    y = model.norm1(x)
    with normlib.stream(model):
        parts = [model.norm1(c) for c in x.split([5, 1, 6], -1)]
    assert_rel(torch.cat(parts, -1), y, 1e-12)


# ---------------------------------------------------------------------------------------------------
# reset, detach, states
# ---------------------------------------------------------------------------------------------------
def test_reset_starts_new_sequences():
    model = Net("cln")
    a, b = make_x(2, 5, 10, dtype=F64), make_x(2, 5, 7, dtype=F64, offset=3.0)
    with normlib.stream(model) as s:
        chunks(model, a, [4, 6])
        s.reset()
        assert all(st is None for st in s.states.values())
        yb = chunks(model, b, [1, 6])
    assert_rel(yb, model(b), 1e-12, "after reset")


def test_reset_with_a_mask_restarts_those_sequences_only():
    model = Net("ccemaln")
    a, b = make_x(3, 5, 10, dtype=F64), make_x(3, 5, 6, dtype=F64, offset=2.0)
    mask = torch.tensor([True, False, True])
    with normlib.stream(model) as s:
        chunks(model, a, [3, 7])
        s.reset(mask)
        assert all(torch.equal(st.w[mask], torch.zeros_like(st.w[mask])) for st in s.states.values())
        assert all(st.norm == "ccemaln" for st in s.states.values())  # the tag stays
        yb = chunks(model, b, [2, 1, 3])
    assert_rel(yb[mask], model(b[mask]), 1e-12, "reset sequences")
    keep = ~mask
    assert_rel(yb[keep], model(torch.cat([a[keep], b[keep]], -1))[..., 10:], 1e-12, "continued sequence")


def test_detach_cuts_the_graph_and_keeps_the_values():
    model = Net("emaln")
    x = make_x(2, 5, 12, dtype=F64).requires_grad_()
    y = model(x)
    for detach in (False, True):
        with normlib.stream(model) as s:
            y1 = model(x[..., :5])
            if detach:
                s.detach()
                assert not any(t.requires_grad for st in s.states.values() for t in st)
            y2 = model(x[..., 5:])
        assert_rel(torch.cat([y1, y2], -1), y, 1e-12)
        (g,) = torch.autograd.grad(y2.square().sum(), x)
        past = g[..., :5].abs().sum()
        assert (past == 0) if detach else (past > 0), f"detach={detach}: gradient into the first chunk {past}"


def test_states_save_restore_and_continue():
    model = Net("emaln", twice=True)
    x = make_x(2, 5, 20, dtype=F64)
    y = model(x)
    with normlib.stream(model) as s:
        model(x[..., :8])
        buf = io.BytesIO()
        torch.save(s.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert set(saved) == {"norm1", "norm1#1", "norm2"}
    assert all(st.norm == "emaln" and st.decay == 0.8 for st in saved.values())
    with normlib.stream(model) as s2:
        s2.load_state_dict(saved)
        y2 = model(x[..., 8:])
    assert_rel(y2, y[..., 8:], 1e-12, "restored stream")
    s2.load_state_dict({})  # what a fresh stream saves: every layer starts afresh
    assert all(st is None for st in s2.states.values())


def test_load_state_dict_refuses_unknown_names_and_other_norms_states():
    model = Net("cln")
    s = normlib.stream(model)
    with pytest.raises(KeyError, match=r"'norm3'.*\['norm1', 'norm2'\]"):
        s.load_state_dict({"norm3": None})
    _, other = normlib.functional.emaln(torch.randn(2, 5, 3), return_state=True)
    with pytest.raises(ValueError, match=r"states\['norm2'\] is a state of 'emaln' \(decay=0.99\); 'cln' refuses"):
        s.load_state_dict({"norm2": other})
    with pytest.raises(TypeError, match=r"states\['norm1'\] must be a normlib.NormState"):
        s.load_state_dict({"norm1": (1, 2, 3)})
    s.load_state_dict({"norm1": other.untagged()})  # untagged: taken, its shapes checked at the next call
    with pytest.raises(TypeError, match="states must be a mapping"):
        s.load_state_dict([other])
    with pytest.raises(TypeError):
        s.states["norm1"] = None  # read-only: load_state_dict sets them


def test_an_error_inside_a_stream_names_the_layer():
    model = Net("cln")
    with normlib.stream(model):
        model(make_x(2, 5, 3, dtype=F64))
        with pytest.raises(ValueError, match=r"normlib.stream, layer 'norm1': state.w must have shape \(3,\)"):
            model(make_x(3, 5, 3, dtype=F64))  # another batch without a reset


# ---------------------------------------------------------------------------------------------------
# lengths
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CAUSAL)
def test_lengths_per_call(name):
    """Sequences that end at different times: the last chunks carry lengths; an ended sequence's state passes
    through, and the stream's states are those of the whole (padded) run."""
    model = Net(name)
    x = make_x(3, 5, 20, dtype=F64)
    total = torch.tensor([20, 13, 6])
    layer = model.norm1
    y_whole, s_whole = layer(x, lengths=total, return_state=True)
    parts = []
    with normlib.stream(layer) as s:
        for lo, hi in [(0, 6), (6, 9), (9, 20)]:
            s.lengths = (total - lo).clamp(0, hi - lo)
            parts.append(layer(x[..., lo:hi]))
        s.lengths = None
        assert s.lengths is None
    assert_rel(torch.cat(parts, -1), y_whole, 1e-12)
    assert_state_close(s.states[""], s_whole, 1e-12)


def test_lengths_passed_by_the_model_win():
    layer = normlib.create("cln", 4)
    x = torch.randn(2, 4, 6)
    with normlib.stream(layer) as s:
        s.lengths = torch.tensor([6, 6])
        y = layer(x, lengths=torch.tensor([6, 2]))
    assert torch.equal(y[1, :, 2:], torch.zeros(4, 4)) and s.states[""].w.tolist() == [24, 8]


def test_bad_lengths_and_masks_are_named():
    s = normlib.stream(Net("cln"))
    with pytest.raises(ValueError, match=r"lengths must be a \(B,\) integer tensor.*torch.float32"):
        s.lengths = torch.ones(2)
    with pytest.raises(ValueError, match=r"lengths must be a \(B,\) integer tensor.*shape \(2, 2\)"):
        s.lengths = [[1, 2], [3, 4]]
    with pytest.raises(TypeError, match="lengths must be"):
        s.lengths = "abc"
    with pytest.raises(ValueError, match=r"mask must be a \(B,\) bool tensor.*torch.int64"):
        s.reset(torch.tensor([0, 1]))
    with normlib.stream(Net("cln")) as s:
        s.model(torch.randn(2, 5, 3, dtype=F64))
        with pytest.raises(ValueError, match=r"mask has 3 items but layer 'norm1' streams 2 sequences"):
            s.reset([True, False, True])


# ---------------------------------------------------------------------------------------------------
# What a stream refuses; outside it nothing changes
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GLOBAL)
def test_a_non_causal_norm_is_refused_by_name(name):
    model = nn.Sequential(normlib.create("cln", 4), nn.Sequential(nn.Identity(), normlib.create(name, 4)))
    with pytest.raises(ValueError, match=rf"layer '1.1' is '{name}', which is not causal"):
        normlib.stream(model)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        normlib.stream(lambda x: x)


@torch.no_grad()  # the same path with and without a state: on the CPU, autograd with one takes the general path
def test_outside_the_context_nothing_changes():
    model = Net("emaln")
    x = make_x(2, 5, 9, dtype=F64)
    y, y1 = model(x), model.norm1(x)
    with normlib.stream(model) as s:
        model(x[..., :4])
        before = s.states["norm1"]
        # a call with state= or return_state=True is the caller's to thread: the stream leaves it alone
        y_own, st = model.norm1(x, return_state=True)
        assert torch.equal(y_own, y1) and st.norm == "emaln"
        assert s.states["norm1"] is before
    assert all("_stream" not in vars(m) for m in model.modules())
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert torch.equal(model(x), y)


def test_one_stream_per_layer_at_a_time():
    model = Net("cln")
    with normlib.stream(model):
        with pytest.raises(RuntimeError, match=r"layer '' \(the model itself\) is in another stream"):
            with normlib.stream(model.norm1):
                pass
    with normlib.stream(model.norm1):  # free again
        pass


# ---------------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------------
def test_compiled_model_streams_without_a_recompilation_per_chunk_length():
    """A compiled model in a stream: a few graphs while it warms up (no state yet, then states, a dynamic T,
    one-frame chunks, a new stream's first chunk of another length), then none for new chunk lengths or new
    streams; fullgraph: no graph break."""
    torch._dynamo.reset()
    model = Net("emaln", dtype=torch.float32)
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # dynamo's graphs, not Inductor's time
    x = make_x(2, 5, 80)
    y = model(x)
    with normlib.stream(compiled):
        chunks(compiled, x[..., :29], [7, 13, 5, 1, 2, 1])
    with normlib.stream(compiled):
        chunks(compiled, x[..., :9], [8, 1])
    with torch._dynamo.config.patch(error_on_recompile=True):
        for sizes, streaming in (([9, 4, 17, 1, 3, 11, 6, 29], compiled), ([3, 77], model)):  # either's stream
            with normlib.stream(streaming):
                assert_rel(chunks(compiled, x, sizes), y, TOL[torch.float32], f"compiled stream {sizes}")


def test_the_guide_runs():
    """docs/guide/stream.md's examples, in order, print what the page says."""
    import contextlib
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide" / "stream.md"
    out, scope = io.StringIO(), {}
    with contextlib.redirect_stdout(out):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            exec(compile(block, str(page), "exec"), scope)
    printed = out.getvalue().splitlines()
    assert printed[0] == "True"
    assert printed[1] == "tensor([640., 400.], dtype=torch.float64)"
    assert printed[2] == "emaln 0.9"
    assert printed[3].startswith("state is a state of 'emaln' (decay=0.9); 'cln' refuses it")


def test_a_copy_made_inside_a_stream_is_in_no_stream():
    import copy
    import pickle

    model = Net("cln")
    x = make_x(2, 5, 6, dtype=F64)
    with normlib.stream(model):
        model(x[..., :3])
        for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert twin.norm1._stream is None and twin.norm2._stream is None
            assert torch.equal(twin(x), twin(x))  # no state kept: the same output twice


def test_compiled_training_with_detach_matches_eager():
    """Truncated BPTT through a compiled model in a stream: each window's loss and gradients are the eager
    stream's."""
    torch._dynamo.reset()
    model = Net("cln", dtype=torch.float32)
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # dynamo's graphs (aot_eager: 30 s more)
    x = make_x(2, 5, 24)

    def windows(m):
        out = []
        with normlib.stream(m) as s:
            for xs in x.split(8, -1):
                loss = m(xs).sin().sum()
                out.append((loss.detach(), torch.autograd.grad(loss, list(model.parameters()))))
                s.detach()
        return out

    for (la, ga), (le, ge) in zip(windows(compiled), windows(model)):
        assert_rel(la, le, TOL[torch.float32])
        for a, e in zip(ga, ge):
            assert_rel(a, e, 1e-4)
