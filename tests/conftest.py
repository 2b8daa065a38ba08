"""Shared test configuration: the Triton interpreter switch, the tolerance table, ``rel_err``, the
hypothesis profiles and small helpers (the float64 oracle, random states, random lengths).

Other test files use these either as fixtures (``rel_err``, ``tol``) or as plain names:
``from conftest import rel_err, TOL``.
"""
import math
import os
import shutil

import torch  # torch does not import triton at import time

# CI has no GPU: the Triton kernels run in Triton's interpreter on CPU tensors. This must happen before
# anything imports triton (normlib's Triton backend imports it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _patch_language_once_per_launch():
    """Triton's interpreter patches ``triton.language`` for a launch's whole grid (``GridExecutor``), then
    again, never undone, at every call of a ``@triton.jit`` helper inside it (``InterpretedFunction.__call__``,
    triton 3.6 to 3.9): half of an interpreted kernel's time went to those repeats, which change nothing. A
    helper's call inside a launch that patched the same language modules skips the repeat."""
    try:
        from triton import language as tl
        from triton.runtime import interpreter as ti
        real_patch, real_call = ti._patch_lang, ti.GridExecutor.__call__
    except (ImportError, AttributeError):  # another triton: run it as it is
        return
    langs = lambda fn: frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)  # noqa: E731
    patched = []  # per launch in progress: the language modules patched so far

    def patch_lang(fn):
        if patched and langs(fn) <= patched[-1]:
            return None  # a helper's call: these are patched already, until the launch restores them
        scope = real_patch(fn)
        if patched:
            patched[-1] |= langs(fn)
        return scope

    def launch(self, *args, **kwargs):
        patched.append(frozenset())
        try:
            return real_call(self, *args, **kwargs)
        finally:
            patched.pop()

    ti._patch_lang, ti.GridExecutor.__call__ = patch_lang, launch


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_language_once_per_launch()
from hypothesis import HealthCheck, settings  # noqa: E402

import normlib  # noqa: E402
from normlib import reference  # noqa: E402

HAS_C_COMPILER = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))

# ---------------------------------------------------------------------------------------------------
# Tolerances: relative error ||out - ref|| / ||ref|| against the float64 reference, by the input dtype.
# ---------------------------------------------------------------------------------------------------
TOL = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.5e-2,
}

# Relative error allowed against the float64 reference for fp32 inputs with a DC offset.
DC_OFFSET_TOL = {0.0: 1e-5, 1e2: 1e-5, 1e4: 1e-3}


def rel_err(a, b, floor: float = 0.0) -> float:
    """||a - b|| / max(||b||, floor), computed in float64 on the CPU; NaN propagates.

    ``floor = 0`` (the default) is the plain relative error (``||a - b||`` when b is all zeros).
    ``floor = unit_floor(b)`` (sqrt of the element count) judges an output that is ~0 everywhere,
    e.g. a zero-variance input (C = 1 pooled over one frame), absolutely, on the scale of a unit-RMS one.
    """
    a = torch.as_tensor(a).detach().to("cpu", torch.float64)
    b = torch.as_tensor(b).detach().to("cpu", torch.float64)
    assert a.shape == b.shape, f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}"
    num = torch.linalg.vector_norm(a - b)
    den = max(float(torch.linalg.vector_norm(b)), floor)
    return float(num / den) if den > 0 else float(num)


def unit_floor(t) -> float:
    return float(torch.as_tensor(t).numel()) ** 0.5


def tolerance(dtype: torch.dtype) -> float:
    return TOL[dtype]


def assert_rel(out, ref, tol, what="", floor: float = 0.0):
    err = rel_err(out, ref, floor)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"  # NaN fails too


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for the test, the previous setting restored after: on a GPU the
    look-back then takes a fixed grouping, so that tests of bit-identical results hold there too."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


@pytest.fixture(name="rel_err")
def _rel_err_fixture():
    return rel_err


@pytest.fixture(name="tol")
def _tol_fixture():
    return TOL


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------------
# Hypothesis: a few hundred examples per run in total ("ci"); more with HYPOTHESIS_PROFILE=dev.
# ---------------------------------------------------------------------------------------------------
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=_HEALTH, derandomize=True,
                          print_blob=True)
settings.register_profile("dev", max_examples=500, deadline=None, suppress_health_check=_HEALTH,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(factor: float) -> int:
    """The loaded profile's max_examples scaled by ``factor`` (for tests that need more or fewer)."""
    return max(1, int(settings.default.max_examples * factor))


# ---------------------------------------------------------------------------------------------------
# The family and helpers.
# ---------------------------------------------------------------------------------------------------
SPECS = {s.name: s for s in normlib.FAMILY}
NORMS = ("cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln")
CAUSAL = tuple(n for n in NORMS if SPECS[n].causal)
GLOBAL = tuple(n for n in NORMS if not SPECS[n].causal)
EMA = tuple(n for n in NORMS if SPECS[n].time is normlib.TimeMode.EMA)
RUNNING = tuple(n for n in CAUSAL if SPECS[n].time is not normlib.TimeMode.FRAME)  # the state matters
LAYOUTS = ("b c t", "b t c")
LOW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


STATE_DTYPE = torch.float64  # states are float64 whatever the input dtype


def stats_dtype(dtype):
    """The precision the backends compute statistics in (the tolerance a returned state is held to)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def state_shape(name, B, C):
    return (B, C) if SPECS[name].per_channel else (B,)


def time_dim(layout):
    return 2 if layout == "b c t" else 1


def make_x(B, C, T, layout="b c t", dtype=torch.float32, generator=None, scale=1.0, offset=0.0):
    shape = (B, C, T) if layout == "b c t" else (B, T, C)
    x = torch.randn(shape, dtype=torch.float64, generator=generator) * scale + offset
    return x.to(dtype)


def make_affine(C, dtype, generator=None, bias=True):
    w = (1 + 0.5 * torch.randn(C, dtype=torch.float64, generator=generator)).to(dtype)
    b = (0.5 * torch.randn(C, dtype=torch.float64, generator=generator)).to(dtype) if bias else None
    return w, b


def make_state(name, B, C, dtype=STATE_DTYPE, generator=None, empty_rows=()):
    """A plausible incoming state: weight > 0, any mean, m2 >= 0; rows in ``empty_rows`` have weight 0."""
    shape = state_shape(name, B, C)
    n = 1 if SPECS[name].per_channel else C
    w = n * (0.5 + 4 * torch.rand(shape, dtype=torch.float64, generator=generator))
    m = torch.randn(shape, dtype=torch.float64, generator=generator)
    m2 = w * (0.2 + torch.rand(shape, dtype=torch.float64, generator=generator))
    for b in empty_rows:
        w[b], m2[b] = 0, 0
    return normlib.NormState(w, m, m2).to(dtype)


def make_lengths(B, T, generator=None):
    """Random lengths in [0, T], with at least one full and (for B > 1) one short sequence."""
    lengths = torch.randint(0, T + 1, (B,), generator=generator)
    lengths[0] = T
    if B > 1:
        lengths[1] = int(torch.randint(0, T, (1,), generator=generator)) if T > 0 else 0
    return lengths


def run(name, x, weight=None, bias=None, eps=1e-8, *, backend="torch", **kw):
    """The torch backend (by default) through the public functional API."""
    return getattr(normlib.functional, name)(x, weight, bias, eps, backend=backend, **kw)


def ref(name, x, weight=None, bias=None, eps=1e-8, *, layout="b c t", decay=None, eps_mode="inside",
        lengths=None, state=None, return_state=False):
    """The float64 oracle: normlib.reference on float64 copies, in the input's layout.

    Returns y in float64 (and the float64 state with ``return_state``).
    """
    f64 = lambda t: None if t is None else t.to(torch.float64)  # noqa: E731 (keeps autograd)
    xv = f64(x)
    kw = dict(eps_mode=eps_mode, lengths=lengths, layout=layout)
    if name in EMA:
        kw["decay"] = SPECS[name].decay if decay is None else decay
    if SPECS[name].causal:
        kw.update(state=None if state is None else state.to(torch.float64), return_state=return_state)
    out = getattr(reference, name)(xv, f64(weight), f64(bias), eps, **kw)
    return out


def assert_state_close(out, expected, tol, what="state", floor=False):
    """Each field within ``tol`` (relative; with ``floor``, judged absolutely where a field is ~0)."""
    assert isinstance(out, normlib.NormState), f"{what}: got {type(out).__name__}"
    assert out.shape == expected.shape, f"{what}: shape {tuple(out.shape)} vs {tuple(expected.shape)}"
    for field, a, b in zip(normlib.NormState._fields, out, expected):
        assert_rel(a, b, tol, f"{what}.{field}", unit_floor(b) if floor else 0.0)


def padding_mask(lengths, layout, B, C, T):
    """True at the padding frames of a (B, C, T) or (B, T, C) tensor."""
    pad = torch.arange(T)[None, :] >= lengths.cpu()[:, None]  # (B, T)
    pad = pad[:, None, :].expand(B, C, T)
    return pad if layout == "b c t" else pad.transpose(1, 2)


class PoisonedTorch:
    """Stands in for ``torch`` inside the Triton launcher: fresh float buffers (empty, empty_like) come
    back NaN, so an element a kernel forgets to write fails the comparison."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def _nan(t):
        return t.fill_(math.nan) if t.is_floating_point() else t

    def empty_like(self, *args, **kwargs):
        return self._nan(self._real.empty_like(*args, **kwargs))

    def empty(self, *args, **kwargs):
        return self._nan(self._real.empty(*args, **kwargs))


@pytest.fixture
def poisoned_buffers(monkeypatch):
    from normlib.backends.triton import launch

    monkeypatch.setattr(launch, "torch", PoisonedTorch(torch))
    # the span records outlive a call (kept per stream): NaN before each call too, so that a record read before
    # this call writes it fails, even where an earlier call of the same shape left the right values there
    kept = launch._span_records
    monkeypatch.setattr(launch, "_span_records", lambda *args: kept(*args).fill_(math.nan))
