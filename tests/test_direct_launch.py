"""The direct launch of prepared calls (launch._Step): after Triton's launcher has compiled a kernel, later
launches call the compiled kernel's own launcher with every argument in Triton's order. Faked compiled kernels
stand in for the GPU's here; the GPU runs these paths in every other test."""
import inspect

import pytest
import torch
from triton.runtime.jit import JITFunction

from normlib.backends.triton import kernels, launch


class FakeCompiled:
    """What Triton's launcher returns: a compiled kernel whose ``run`` takes (grid, stream, function,
    metadata, launch metadata, two hooks, *every argument in order)."""

    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


class FakeKernel:
    """A kernel whose launcher records the keywords it got and returns ``compiled``; ``params`` and ``arg_names``
    are a real JITFunction's (the interpreter's functions have no params)."""

    def __init__(self, fn, compiled):
        jit = JITFunction(fn)
        self.params, self.arg_names, self.fn, self.compiled, self.launches = jit.params, jit.arg_names, fn, compiled, []

    def __getitem__(self, grid):
        def launch_(**kw):
            self.launches.append((grid, kw))
            return self.compiled
        return launch_


def _kernel_fn(kernel):
    return getattr(kernel, "fn", kernel)


@pytest.mark.parametrize("name", ["running_norm_fwd", "running_norm_bwd", "sum_partials", "span_scan"])
def test_a_direct_launch_passes_every_argument_where_tritons_binder_puts_it(name):
    fn = _kernel_fn(getattr(kernels, name))
    compiled = FakeCompiled()
    kernel = FakeKernel(fn, compiled)
    sig = inspect.signature(fn)
    required = [p for p in sig.parameters.values() if p.default is inspect.Parameter.empty]
    # every required argument gets a distinct value; pointers are roles bound to distinct tensors
    env = {f"t{i}": torch.empty(4) for i in range(len(required))}
    kw = {p.name: (launch._Role(f"t{i}") if p.name.endswith("_ptr") else 1000 + i) for i, p in enumerate(required)}
    step = launch._Step(kernel, 7, 3, **kw, num_warps=4)
    step(env, 123, True)  # Triton's launcher: compiles, then bound
    assert len(kernel.launches) == 1 and compiled.calls == []
    grid, got_kw = kernel.launches[0]
    assert grid == (7, 3, 1) and got_kw["num_warps"] == 4
    step(env, 123, True)  # direct
    assert len(kernel.launches) == 1 and len(compiled.calls) == 1
    call = compiled.calls[0]
    assert call[:7] == (7, 3, 1, 123, "function", "metadata", None)
    bound = sig.bind(**{k: v for k, v in got_kw.items() if k in sig.parameters})
    bound.apply_defaults()
    args = call[9:]
    assert len(args) == len(bound.arguments)
    for (k, want), got in zip(bound.arguments.items(), args):
        assert got is want or got == want, f"{name}: argument {k} got {got!r}, Triton's binder {want!r}"


def test_direct_launches_take_the_calls_own_tensors_and_fall_back_where_triton_must_decide(monkeypatch):
    """Each call's tensors reach its launch; an unaligned tensor (another specialization) or a launch hook (a
    profiler's) goes through Triton's launcher again."""
    compiled = FakeCompiled()
    kernel = FakeKernel(_kernel_fn(kernels.sum_partials), compiled)
    step = launch._Step(kernel, 2, 2, p_ptr=launch._Role("p"), gw_ptr=launch._Role("w"), gb_ptr=launch._Role("b"),
                        R=5, C=9, BLOCK_R=512, BLOCK_C=8, num_warps=4)
    envs = [{k: torch.empty(3) for k in "pwb"} for _ in range(3)]
    step(envs[0], 0, True)
    step(envs[1], 0, True)
    assert [a[9:12] for a in compiled.calls] == [(envs[1]["p"], envs[1]["w"], envs[1]["b"])]
    step(envs[2], 0, False)
    assert len(kernel.launches) == 2 and kernel.launches[1][1]["p_ptr"] is envs[2]["p"]
    hooks = launch.knobs.runtime.launch_enter_hook
    hooks.add(profiler := lambda *a: None)
    try:
        step(envs[2], 0, True)
    finally:
        hooks.remove(profiler)
    assert len(kernel.launches) == 3 and len(compiled.calls) == 1
    monkeypatch.setattr(launch.knobs.runtime, "launch_enter_hook", lambda *a: None)  # a plain function: set
    step(envs[2], 0, True)
    assert len(kernel.launches) == 4 and len(compiled.calls) == 1


def test_unaligned_first_launches_bind_nothing():
    compiled = FakeCompiled()
    kernel = FakeKernel(_kernel_fn(kernels.sum_partials), compiled)
    step = launch._Step(kernel, 1, p_ptr=launch._Role("p"), gw_ptr=launch._Role("p"), gb_ptr=launch._Role("p"),
                        R=1, C=1, BLOCK_R=512, BLOCK_C=8)
    env = {"p": torch.empty(3)}
    step(env, 0, False)
    step(env, 0, True)  # binds now
    step(env, 0, True)
    assert len(kernel.launches) == 2 and len(compiled.calls) == 1


def test_a_wrapped_kernel_binds_nothing():
    """A kernel wrapped by a test's spy (no ``params``) keeps Triton's launch path on the GPU, where its launcher
    returns a compiled kernel: the spy sees every launch (binding once raised AttributeError there)."""

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return self.kernel[grid]

    compiled = FakeCompiled()
    kernel = FakeKernel(_kernel_fn(kernels.sum_partials), compiled)
    step = launch._Step(Spy(kernel), 1, p_ptr=launch._Role("p"), gw_ptr=launch._Role("p"), gb_ptr=launch._Role("p"),
                        R=1, C=1, BLOCK_R=512, BLOCK_C=8)
    env = {"p": torch.empty(4)}
    for _ in range(3):
        step(env, 0, True)
    assert len(kernel.launches) == 3 and not compiled.calls


def test_alignment_reads_every_pointer():
    base = torch.empty(64)
    assert launch._aligned(base, None, base[4:])
    assert not launch._aligned(base, base[1:])


def test_a_bound_launch_keeps_none_of_the_first_calls_tensors():
    """The arguments bound once hold no tensor of the call that compiled the kernel (a model's activations, or
    under CUDA graphs memory of the graph's pool that would outlive the call)."""
    import gc
    import weakref

    compiled = FakeCompiled()
    kernel = FakeKernel(_kernel_fn(kernels.sum_partials), compiled)
    step = launch._Step(kernel, 1, p_ptr=launch._Role("p"), gw_ptr=launch._Role("w"), gb_ptr=launch._Role("b"),
                        R=1, C=1, BLOCK_R=512, BLOCK_C=8)
    env = {k: torch.empty(3) for k in "pwb"}
    refs = [weakref.ref(t) for t in env.values()]
    step(env, 0, True)
    kernel.launches.clear()
    del env
    gc.collect()
    assert all(r() is None for r in refs)
