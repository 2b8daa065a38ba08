"""The GPU-free parts of the benchmark tools, so that a launcher change cannot break them unseen."""
import compile_check


def test_compile_check_enumerates_each_kernels_own_tiles():
    """compile_check compiles what the launchers pick: the forward and the backward with their own tiles
    (FRAME's "b c t" fp32 forward in 256 channels, its backward in 128)."""
    todo = list(compile_check.configs())
    frame = [(k.fn.__name__, c["BLOCK_C"], c["BLOCK_T"]) for k, c, ints, dt, warps, _ in todo
             if (ints["B"], ints["C"], ints["T"]) == (16, 512, 16000) and dt == "fp32" and c["MODE"] == 0
             and c["POOL_ALL"] and ints["sxt"] == 1]
    assert set(frame) == {("running_norm_fwd", 256, 32), ("running_norm_bwd", 128, 32)}
    assert {k.fn.__name__ for k, *_ in todo} == {"running_norm_fwd", "running_norm_bwd"}
