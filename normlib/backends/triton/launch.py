"""Launchers: tile sizes from the shape, the look-back workspace, forward and backward entry points."""
from __future__ import annotations

import contextlib
import functools
import math
import struct
import sys
import threading
import types
from typing import NamedTuple

import torch
import triton
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from triton import knobs

from .kernels import running_norm_bwd, running_norm_fwd, span_scan, sum_partials

FRAME, CUMULATIVE, EMA, GLOBAL = 0, 1, 2, 3
STRIP_PER_SM = 4  # running modes walk each sequence in one program when there are this many per SM
STRIP_PER_SM_CH = 3.5  # per-channel "b c t" walks: whole sequences from this many per SM, else segments (SEG)
# segments' walks per SM, forward and backward: pooled, per-channel "b c t", per-channel "b t c". A ccln
# "b t c" forward takes 12 where its segments stay SEG_MIN_TILES long, else the backward's 8 (H200, forward /
# step times a copy's, 8 -> 12 a SM: fp32 (16, 512, 16000) 1.90 / 6.57 -> 1.71 / 6.54, bf16 (1, 128, 256000)
# 6.88 / 25.17 -> 6.21 / 24.77; segments of 6 tiles lost, bf16 (4, 512, 4000) 5.71 -> 6.46; 12 backward walks
# lost everywhere, and so did ccemaln's forwards, whose float64 sums take more registers: (16, 512, 16000)
# fp32 2.36 -> 2.52, bf16 5.26 -> 5.66)
SEG_PER_SM = ((4, 4), (16, 16), (12, 8))
SEG_MIN_TILES = 8
# SEG and GLOBAL: above this many segments (spans) a sequence, span_scan merges their sums once (see
# there), in blocks of SCAN_ROWS; below, each walk (tile) combines them itself, in a few windows of
# records, with no launch more (not swept: the rows timed had 16 segments, or 259 and more)
SCAN_SPANS, SCAN_ROWS = 32, 512
SEG_POOLED_SEQ = 2  # pooled "b t c" forwards walk segments of at least 8 tiles up to this many sequences
GLOBAL_STRIP_BYTES = 32 << 20  # GLOBAL reads x twice in one launch below this size (L2: 50 MB H100, 60 MB H200)
# per-channel GLOBAL "b c t" above it: one program a channel walks its row twice, the second time from L2, where
# rows are this short and there are ROW_WALKS_PER_SM a SM (see row_walk)
ROW_WALK_BYTES, ROW_WALKS_PER_SM, ROW_WALK_T = 64 << 10, 4, 2048
# per-channel EMA's walks and backward take float32 statistics shifted by the tile's prefix (_chan_frames), where
# a tile decays by at most 2^-EMA32_SPAN (d^BLOCK_T >= 1/4: ccemaln's default 0.99 on [4, 128] tiles); else
# float64 sums. Statically (compile_check, Triton 3.6, fp32 "b c t" (16, 512, 16000)), warp-instructions an
# element: forward 3.41 -> 2.43, backward 4.84 -> 3.84; "b t c" spills 24-432 -> 0-56 bytes (untimed)
EMA32_SPAN = 2.0
LEAN_BYTES = {4: (24 << 20, 24 << 20), 2: (36 << 20, 18 << 20)}  # by element size, "b c t" and "b t c": a
# pooled look-back forward reads its first chunk again, rather than holding it, when its tiles in flight take
# no more than this (hold_for)
LEAN_BLOCKS = (4, 5)  # programs per SM of such a lean forward, "b c t" and "b t c" (125 and 96 registers)
UNALIGNED_BWD_C = 64  # a pooled "b c t" backward tile's channels where rows are not 16-byte aligned (choose_launch)
_OVERRIDE: dict = {}
_WORKSPACES: dict = {}
_TILES: dict = {}
_CALLS: dict = {}  # prepared calls (_Forward, _Backward), by everything that decides them
EPOCH = [0]  # bumped by _changed


@contextlib.contextmanager
def tile_size(block_t=None, block_c=None, window=None, span=None, walk=None, warps=None, strip=None,
              bwd_block_c=None, bwd_warps=None, hold=None, bwd_hold=None, bwd_strip=None, maxnreg=None,
              bwd_maxnreg=None, lone=None, stages=None, bwd_stages=None, walk_stages=None, bwd_walk_stages=None,
              ema32=None, scan_block=None, global_launches=None):
    """Force tile sizes (tests use small tiles so that the look-back runs on small inputs; forced blocks run on
    the warps their size takes, 4 or 8, unless ``warps`` is forced too); ``walk``
    makes the look-back ignore published prefixes but tile 0's, so it crosses several windows (and takes the
    look-back, not a strip or SEG walk, unless ``strip`` is forced too); ``strip``
    forces (True) or forbids (False) one program per sequence in the running modes; ``hold`` forces
    whether a pooled look-back tile holds its first chunk of channels (or reads it again); ``strip=2``
    walks the running modes in cdiv(tiles, span) segments of equal length (SEG: a first launch sums each
    segment, then one program walks each, from the sums of the segments before it, or in the backward after
    it); ``maxnreg`` caps the registers of a thread (Triton's compile option; unset: the compiler's choice),
    for timing what more programs per SM would give; ``lone=1`` compiles the check for a statistic of one
    value into pooled tiles of more channels too, for timing (it can only add the check: it is needed wherever
    it is on); ``stages=N`` software-pipelines a pooled tile's loops over its chunks of channels N deep
    (Triton's ``tl.range(num_stages=N)``: the next chunks' loads go to shared memory ahead of their use; 1,
    the default, does not); ``walk_stages=N`` pipelines a walk's loop over its tiles (strips, SEG) and the
    span sums' the same way; ``bwd_*`` set the backward's own choices (a pooled backward's BLOCK_C and hold, any
    backward's warps, strip, maxnreg and pipeline depths); ``ema32`` forces (True: only where the decay allows,
    see EMA32_SPAN) or forbids per-channel EMA's float32 statistics; ``scan_block`` sets span_scan's
    statistics a program; ``global_launches=1`` runs GLOBAL's spans and tiles in one launch where the spans fit a
    window (_steps; the default stays two, with span_scan between above 32 spans, until the one launch's device
    time is measured: its tiles hold phase 1's registers too)."""
    old = dict(_OVERRIDE)
    _changed()
    _OVERRIDE.update({k: v for k, v in dict(block_t=block_t, block_c=block_c, window=window, span=span,
                                            walk=walk, warps=warps, strip=strip, bwd_block_c=bwd_block_c,
                                            bwd_warps=bwd_warps, hold=hold, bwd_hold=bwd_hold,
                                            bwd_strip=bwd_strip, maxnreg=maxnreg,
                                            bwd_maxnreg=bwd_maxnreg, lone=lone, stages=stages,
                                            bwd_stages=bwd_stages, walk_stages=walk_stages,
                                            bwd_walk_stages=bwd_walk_stages, ema32=ema32,
                                            scan_block=scan_block, global_launches=global_launches).items()
                      if v is not None})
    try:
        yield
    finally:
        _OVERRIDE.clear()
        _OVERRIDE.update(old)
        _changed()


def _changed():
    """Launch choices may differ from here on: drop the prepared calls (their steps read _OVERRIDE) and tell the
    backend's cached call paths (EPOCH)."""
    _CALLS.clear()
    EPOCH[0] += 1


def ema32_for(per_channel, mode, log2d, block_t) -> bool:
    """Whether a per-channel EMA takes float32 statistics from its tiles' prefixes (EMA32_SPAN)."""
    return bool(per_channel and mode == EMA and -log2d * block_t <= EMA32_SPAN and _OVERRIDE.get("ema32", True))


def time_mode(decay) -> int:
    if decay is None:
        return GLOBAL
    return FRAME if decay == 0 else CUMULATIVE if decay == 1 else EMA


@functools.lru_cache(maxsize=None)
def _num_sms(device) -> int:
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


H200_SMEM = 232448  # shared memory a block may opt in to on the H200 (227 KB); the interpreter's stand-in


def _smem(device) -> int:
    """The shared memory one program may take (pipelined loops keep their loads there)."""
    if device is not None and device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 49152)
    return H200_SMEM


def _fits(stages, block_c, block_t, elem_size, backward, smem) -> bool:
    """Whether a loop pipelined ``stages`` deep fits in ``smem``: each stage past the first buffers a chunk of x
    (and of dy, backward); measured under Triton 3.6, plus a few KB of scratch (cln fp32 "b t c" [128, 128]
    backward, 2 stages: 135680 bytes)."""
    return (stages - 1) * block_c * block_t * elem_size * (2 if backward else 1) + (8 << 10) <= smem


def choose_tiles(C, T, per_channel, channels_last, device, mode=CUMULATIVE, elem_size=4):
    """(BLOCK_C, BLOCK_T, num_warps), from the H200 sweeps (benchmarks/tools/sweep.py; docs/developer/kernels.md): rows of at
    128 bytes or more along the contiguous dim, 4 warps. A pooled tile spans all channels and is visited in
    chunks of BLOCK_C, so its registers do not grow with C. FRAME's pooled tiles are [128, 32]: all 512
    channels at once spilled (frameln (16, 512, 16000) "b t c" backward: 0.30 of a copy at [512, 32], 0.78
    at [128, 32]); in "b c t" their rows are 128 bytes whatever the dtype ([128, 64] in bf16: frameln
    (16, 512, 16000) forward 0.46 -> 0.50 of a copy, backward 0.38 -> 0.42; (1, 128, 256000) 0.51 -> 0.55,
    0.48 -> 0.55). Per-channel GLOBAL tiles (instln) in "b c t" are 4 times larger: with no look-back to
    hide, a [4, 128] tile's per-program setup was most of its instructions (2.3 warp-instructions per
    element against 0.9 at [8, 256] forward, 2.2 against 1.1 backward, `compile_check.py --resources`;
    "b t c" gains less, and its strip walk would spill). Pooled "b t c" running and GLOBAL tiles take
    [128, 32] on long sequences (cln (16, 512, 16000): 0.59 of a copy forward, 0.64 backward; the only
    length swept there) but longer ones on short sequences, whose tiles all run at once and wait on the
    look-back chain, or walk it in fewer steps (device time of a CUDA graph on the H200, forward / training
    step, times a copy's, 32 -> 64 -> 128 frames: cln fp32 (80, 64, 301)
    3.46 / 12.8 -> 2.94 / 10.5 -> 2.66 / 9.5, (64, 128, 500) bf16 3.97 / 15.4 -> 3.66 / 15.2 -> 3.18 /
    12.8; (4, 512, 4000) 2.50 / 8.0 -> 2.09 / 6.9 -> 2.27 / 7.1)."""
    c2 = triton.next_power_of_2(max(C, 1))
    # per-channel "b t c" running norms walk segments (strip_for) on one warp, whose 32 lanes each load 16
    # bytes of channels (4 fp32, 8 in 16 bits) and hold all the tile's frames of them, so that no scan
    # crosses lanes: [128, 8] in fp32 (ccln forward 3.27 -> 2.14 warp-instructions per element, ccemaln
    # 4.66 -> 2.06), [256, 4] in 16 bits, where [128, 8] split each lane's frames over 2 lanes (bf16 ccln
    # forward 2.91 -> 2.51, backward 3.49 -> 2.35 with FLIP; [256, 8] spilled; H200, forward / step times a
    # copy's, [128, 8] -> [256, 4]: ccln (16, 512, 16000) 4.82 / 19.65 -> 3.90 / 15.08). With 128 channels
    # [128, 4] (ccemaln: [128, 8] spilled); with 64 or fewer 4 frames would put one frame in a lane, and 8
    # were faster (bf16 (80, 64, 301): ccln 5.31 / 14.7 at [64, 8], 6.89 / 19.0 at [64, 4]).
    warps = None
    if per_channel:
        if channels_last and mode in (CUMULATIVE, EMA):  # SEG walks: each thread holds its channels' frames
            vec = 16 // elem_size
            block_c, block_t, warps = min(32 * vec, c2), _pow2_min(T, 32 // vec if c2 >= 16 * vec else 8), 1
        elif channels_last:  # rows of 128 bytes (instln bf16 (16, 512, 16000) [32, 64] -> [64, 64]: forward
            # 739 -> 539 µs, backward 545 -> 508)
            block_c, block_t = min(128 // elem_size, c2), _pow2_min(T, 64)
        else:
            grow = 2 if mode == GLOBAL else 1
            block_c, block_t = min(4 * grow, c2), _pow2_min(T, 128 * grow)
    elif channels_last:  # short sequences: longer tiles, a shorter chain to wait on (a symbolic T: 64)
        frames = 32 if mode == FRAME or _sure(T > 4096) else 128 if _sure(T <= 512) else 64
        block_c, block_t = min(c2, 128), _pow2_min(T, frames)
    elif mode == FRAME:
        block_c, block_t = min(c2, 128), _pow2_min(T, 128 // elem_size)
    else:
        block_c, block_t = min(c2, 128), _pow2_min(T, 64)
    if "block_c" in _OVERRIDE or "block_t" in _OVERRIDE:  # forced tiles: warps by their size, unless forced too
        warps = None
    block_c = _OVERRIDE.get("block_c", block_c)
    block_t = _OVERRIDE.get("block_t", block_t)
    return block_c, block_t, _OVERRIDE.get("warps", warps or (8 if block_c * block_t > 8192 else 4))


def _sure(cond) -> bool:
    """A launch choice's test: its truth for int sizes; for symbolic ones (torch.compile's dynamic shapes) whether it
    holds at every size, without a guard, so that one graph serves every length (the choice for "not known" is
    the one the test's False gives: each site picks its sense so that it is the general one)."""
    return statically_known_true(cond)


def _max(a, b):
    """max of two sizes; torch.sym_max where one is symbolic (no guard, so no recompile for a new length). Dynamo
    of torch 2.11 rejects torch.sym_max of two ints ("torch.* op returned non-Tensor"), a graph break in every
    compiled call on a GPU, so plain ints take Python's."""
    return torch.sym_max(a, b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else max(a, b)


def _min(a, b):
    """min of two sizes, as _max."""
    return torch.sym_min(a, b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else min(a, b)


def _pow2_min(n, cap: int) -> int:
    """min(next_power_of_2(max(n, 1)), cap), cap a power of 2; for a symbolic n (torch.compile's dynamic shapes)
    cap, without a guard (a longer tile is masked): triton.next_power_of_2 of it was a sympy expression of some 30
    nested terms, which every launch choice made of it repeated (tile lists of thousands of characters, and a
    backward trace that had not finished after 100 s on the H100). Under dynamo a symbolic size passes
    isinstance(n, int), so both take the comparisons, of which statically_known_true settles only the concrete."""
    p = cap
    while p > 1 and statically_known_true(n <= p // 2):
        p //= 2
    return p


def window_for(per_channel, n_seq, num_sms) -> int:
    """Look-back window (records read per poll): about the number of one sequence's tiles in flight
    (tickets go tile-major, so with ``n_seq`` sequences a tile's in-flight predecessors are about 2 x SMs
    / n_seq back). A poll that meets only aggregates walks one more window, so few sequences need wide
    windows; many need few. Pooled: 32 to 128 records (with one or two sequences 128 beat 256 on the H200:
    cln (1, 128, 256000) 202 against 251 µs fp32, 281 against 389 "b t c"). Per channel: always 4 records
    of BLOCK_C channels, whose polls cost L2 traffic of their own; wider ones were slower on the H200
    (ccln (2, 256, 64000) "b t c": 511 µs at 4, 764 at 32)."""
    if per_channel:
        return 4
    return max(_pow2_min(_max(1, 2 * num_sms // _max(1, n_seq)), 128), 32)


def strip_for(mode, n_seq, n_tiles, per_channel, channels_last, num_sms, nbytes) -> tuple[int, int]:
    """How the forward and the backward walk time in the running modes: 0, look-back tiles; 1, one program
    walks each of ``n_seq`` sequences (or channel blocks) of ``n_tiles`` tiles, when they fill the GPU by
    themselves; 2, segmented walks (SEG). For GLOBAL, 1 when x is small enough to be read again from L2 and
    there are enough sequences to share the SMs, which saves a launch (small calls are host-bound): at least
    one a SM, or 32 of at most 8 tiles (instln (4, 512, 4000) "b t c", 64 channel blocks of 63 tiles, forward
    on the H200: 146 µs as strips, 69 in two launches; 256 of 16 tiles in "b c t": 43 against 67). A SEG
    forward whose backward walks whole sequences (1) walks one segment a sequence: the same walk, whose next
    tile's load the compiler issues before the step's work, where the strip's sinks it to the step's end
    (ccln (4, 512, 4000) fp32 forward 2.58 -> 2.06 times a copy's time, bf16 5.26 -> 5.12, (16, 512, 16000)
    1.74 -> 1.65 and 3.42 -> 3.36; its backward lost: 3.75 -> 4.40). Multiples of a copy's time on the H200,
    forward (step), look-back -> SEG:
    - per-channel "b c t", 16 walks per SM: ccln fp32 (2, 256, 64000) 4.84 -> 2.76 (11.2 -> 8.5), (1, 128,
      256000) 7.96 -> 2.79 (16.7 -> 8.6); at 3.9 sequences per SM, (4, 512, 4000), whole-sequence walks
      beat both: 4.03 -> 2.02 (9.6 -> 6.3), SEG at 8 per SM 2.79;
    - per-channel "b t c", always, 8 walks per SM, on one-warp tiles (choose_tiles), forward and backward,
      [128, 8]: ccln fp32 (16, 512, 16000) 3.33 -> 1.90 (11.5 -> 7.8), (2, 256, 64000) 5.13 -> 2.64 (15.8 ->
      9.4), (4, 512, 4000) 4.09 -> 2.60 (13.8 -> 9.1), bf16 (16, 512, 16000) 8.0 -> 4.8 (26.2 -> 19.6);
      ccemaln fp32 (2, 256, 64000) 8.75 -> 3.00 (21.3 -> 9.7); (80, 64, 301) ccln 4.6 -> 3.8 (17.2 -> 12.9);
    - pooled "b t c", 4 walks per SM, forward only (its backward lost: x and dy are read twice): cln fp32
      (1, 128, 256000) 4.17 -> 2.23, bf16 7.96 -> 3.50, (2, 256, 64000) 2.62 -> 2.30 (segments of 8
      tiles), but (4, 512, 4000) 2.14 -> 3.21 (segments of one tile);
    - pooled "b c t" loses everywhere (cln (2, 256, 64000) 1.85 -> 3.22): x is read twice, where the
      look-back reads it once and is not far from its floor."""
    if mode == GLOBAL:  # a strip program walks its sequence twice: with fewer than the SMs, only short ones
        return (int(_sure(nbytes <= GLOBAL_STRIP_BYTES) and _sure(n_seq >= 32)
                    and (_sure(n_seq >= num_sms) or _sure(n_tiles <= 8))),) * 2
    if mode not in (CUMULATIVE, EMA):
        return 0, 0
    if per_channel:
        return (2, 1) if not channels_last and _sure(n_seq >= STRIP_PER_SM_CH * num_sms) else (2, 2)
    if _sure(n_seq >= STRIP_PER_SM * num_sms):
        return 1, 1
    seg_len = triton.cdiv(n_tiles, _max(1, SEG_PER_SM[0][0] * num_sms // _max(1, n_seq)))
    return (2, 0) if channels_last and _sure(n_seq <= SEG_POOLED_SEQ) and _sure(seg_len >= 8) else (0, 0)


def hold_for(B, C, T, block_t, channels_last, num_sms, elem_size) -> bool:
    """Whether a pooled look-back forward tile holds its first chunk of channels in registers through the
    look-back, or reads it again (from L2, kept there by a hint) to write it. Reading it again frees the
    registers that set the occupancy (cln "b c t" [128, 64]: 197 -> 125 in fp32, 233 -> 128 in bf16, so 2
    -> 4 programs per SM), but keeps every chunk of the tiles in flight in L2. Measured on the H200 (cln
    forward, fraction of a copy, held -> read again, MB in flight when read again):
    fp32 (1, 128, 256000) 0.36 -> 0.42 (17 MB), emaln (2, 256, 64000) "b t c" 0.38 -> 0.40 (22 MB),
    (2, 256, 64000) 0.54 -> 0.50-0.55 (35 MB), (16, 256, 16000) 0.59 -> 0.40 (35 MB), (16, 512, 16000)
    "b t c" 0.50 -> 0.39 (43 MB) and "b c t" 0.70 -> 0.54 (69 MB); bf16 (16, 512, 16000) 0.41 -> 0.49 (35 MB).
    Held 16-bit tiles carry half the bytes for the same latency, so they gain from occupancy up to a larger
    footprint than fp32 ones, in "b c t"; in "b t c" they lose from less: bf16 (16, 512, 16000) 0.30 -> 0.19
    (22 MB), (4, 512, 4000) 0.31 either way (17 MB), (64, 128, 500) 0.25 -> 0.32 (8 MB)."""
    tiles = B * triton.cdiv(T, block_t)
    # int(): torch 2.11's dynamo rejects a bool index
    in_flight = _min(tiles, LEAN_BLOCKS[int(channels_last)] * num_sms) * C * block_t * elem_size
    return not _sure(in_flight <= LEAN_BYTES[elem_size][int(channels_last)])  # a symbolic T: held


def row_walk(B, C, T, per_channel, channels_last, mode, num_sms, nbytes, elem_size) -> bool:
    """Whether a per-channel GLOBAL "b c t" norm (instln) too large for GLOBAL_STRIP_BYTES walks each channel's
    row in one program of [1, ROW_WALK_T] tiles, twice (statistics, then output), forward and backward: the
    rows in flight are few enough that the second pass reads them from L2, so x is read from DRAM about once,
    where the two launches read it twice. H200, instln (16, 512, 16000) "b c t" (ab.py, fractions of a copy,
    forward / backward), two launches of [8, 256] -> row walks of [1, 1024] (two processes) and [1, 2048]
    (one): fp32 0.52 / 0.50 -> 0.65 / 0.61 and 0.66 / 0.61; bf16 0.50 / 0.40-0.57 -> 0.55 / 0.58 and
    0.66 / 0.61. Not timed on longer rows (fewer of which fit L2) or on "b t c" (a row there is strided)."""
    return (per_channel and mode == GLOBAL and not channels_last and _sure(nbytes > GLOBAL_STRIP_BYTES)
            and _sure(T * elem_size <= ROW_WALK_BYTES) and _sure(B * C >= ROW_WALKS_PER_SM * num_sms))


def _forced_walk(mode, forced) -> int:
    """A forced strip as the mode allows it: FRAME never walks, GLOBAL walks whole sequences (no SEG)."""
    return 0 if mode == FRAME else min(int(forced), 1) if mode == GLOBAL else int(forced)


def choose_launch(B, C, T, per_channel, channels_last, mode, num_sms, nbytes, elem_size=4, aligned=True):
    """(BLOCK_C, BLOCK_T, num_warps, strip, hold, backward BLOCK_C, backward num_warps, backward hold,
    backward strip) for a (B, C, T) input. The backward may chunk a pooled tile's channels differently and run on other
    warps: it reads only the tiles' prefixes, which do not depend on them, and recomputes the shift K, which
    _shift sums exactly in float64 (per-channel tiles keep one BLOCK_C). FRAME's pooled
    "b c t" forward takes 8192 values a tile ([256, 32] in fp32: frameln (16, 512, 16000) 0.72 -> 0.80 of a
    copy on the H200); its backward keeps [128, 32] (0.64 there, and 0.66 at [256, 32]: within the
    backward's run-to-run spread). A pooled strip walk
    prefetches the next tile, so its tiles spread over 8 warps: [128, 64] at 4 warps spilled 0.6-2 KB per thread under Triton 3.6
    and the GLOBAL backward took 330 µs on (64, 128, 500) fp32 (a copy: 13 µs); at 8 warps 80 bytes, and
    116 µs. Smaller tiles ([128, 32]) spill nothing but double the walk's steps (forward 43 µs against 34).
    FRAME's pooled tiles read their first chunk again rather than hold it (lean): held, the backward's chunk of x
    and dy stayed live through the loop over the others and spilled (bf16 [128, 64] with affine: 592 bytes a
    thread; lean, 245 registers and none). Device time on the H200 (CUDA graphs, affine), held -> lean: training
    step bf16 (16, 512, 16000) 861 -> 700 µs "b c t", 850 -> 713 "b t c", (2, 256, 64000) 237 -> 187 and 222 ->
    191; fp32 within 3 %; forward fp32 (16, 512, 16000) 311 -> 299 "b c t", 321 -> 276 "b t c", bf16 243 -> 191
    and 196 -> 150, but fp32 "b c t" (4, 512, 4000) 20.5 -> 23.2. That loss is where every tile runs in one
    wave of lean programs and their bytes exceed hold_for's budget, so that the whole of x is read again at once
    and misses L2: a FRAME "b c t" forward holds there (fp32, lean -> held: (4, 512, 4000) 23.6 -> 20.4 µs,
    (8, 512, 2000) 24.1 -> 21.4; bf16 (4, 512, 4000), 16 MB, 15.6 against 16.0 held; in "b t c" holding lost,
    fp32 (4, 512, 4000) 19.8 -> 27.1, and so it did on every shape of one chunk or of several waves, e.g. fp32
    "b c t" (2, 256, 6400) 8.0 -> 11.2 and (16, 256, 2000) 21.0 -> 22.6)."""
    bc_b, bt, warps = choose_tiles(C, T, per_channel, channels_last, None, mode, elem_size)
    rows = row_walk(B, C, T, per_channel, channels_last, mode, num_sms, nbytes, elem_size)
    if rows:
        bc_b = _OVERRIDE.get("block_c", 1)
        bt = _OVERRIDE.get("block_t", _pow2_min(T, ROW_WALK_T))
        warps = _OVERRIDE.get("warps", 4)
    bc = bc_b
    if mode == FRAME and not per_channel and not channels_last:  # forward: 8192 values a tile, whatever the dtype
        bc = _OVERRIDE.get("block_c", min(triton.next_power_of_2(max(C, 1)), max(bc_b, 8192 // bt)))
    ncb = triton.cdiv(C, bc) if per_channel else 1
    strip, strip_b = strip_for(mode, B * ncb, triton.cdiv(T, bt), per_channel, channels_last, num_sms, nbytes)
    strip, strip_b = (1, 1) if rows else (strip, strip_b)
    if "strip" in _OVERRIDE:  # forced: forward and backward alike
        strip = strip_b = _forced_walk(mode, _OVERRIDE["strip"])
    elif _OVERRIDE.get("walk"):  # a forced look-back walk needs the look-back (per channel, SEG is the default)
        strip = strip_b = 0
    if "bwd_strip" in _OVERRIDE:
        strip_b = _forced_walk(mode, _OVERRIDE["bwd_strip"])
    warps_b = warps
    if not per_channel:  # a pooled walk holds two tiles
        warps = _OVERRIDE.get("warps", 8) if strip else warps
        warps_b = _OVERRIDE.get("warps", 8) if strip_b else warps_b
    if not (per_channel or channels_last or aligned or strip_b) and mode != FRAME:
        # rows that are not 16-byte aligned load one element at a time, each with its own 64-bit address: a
        # [128, 64] backward tile spilled 164 words a thread. H100, backward µs at (4, 512, 3999), [128, 64] ->
        # [64, 64]: cln fp32 147 -> 84, bf16 114 -> 68, gln 120 -> 85 (aligned T = 4000: 58, 46, 62 at [128, 64],
        # which stays there)
        bc_b = min(bc_b, UNALIGNED_BWD_C)
    bc_b = bc if per_channel else _OVERRIDE.get("bwd_block_c", bc_b)
    lean = not per_channel and mode in (CUMULATIVE, EMA) and not strip
    # FRAME's pooled tiles have no look-back to hold their first chunk through: they read it again, but for a
    # "b c t" forward whose tiles all run in one wave (see the docstring); per-channel and GLOBAL forward tiles
    # hold theirs (GLOBAL's forward timed the same either way)
    frame = not per_channel and mode == FRAME
    big = hold_for(B, C, T, bt, channels_last, num_sms, elem_size)
    one_wave = _sure(B * triton.cdiv(T, bt) <= LEAN_BLOCKS[int(channels_last)] * num_sms)
    hold = _OVERRIDE.get("hold", (not channels_last and one_wave and big) if frame else (not lean or big))
    # no pooled backward tile holds (a strip walk holds its tiles whatever the flag): in the look-back, freeing 26
    # to 118 registers (255 with a spill -> 223 in "b c t") measured 0.44 -> 0.50 of a copy in "b t c" and 0.34
    # -> 0.38 in bf16; GLOBAL's training step (CUDA graphs, affine) fell up to 4.7 %, bf16 (16, 512, 16000)
    # 813 -> 793 µs "b c t" and 801 -> 772 "b t c", fp32 (4, 512, 4000) 90.2 -> 86.0 and 88.7 -> 84.7
    return (bc, bt, warps, strip, bool(hold), bc_b, _OVERRIDE.get("bwd_warps", warps_b),
            bool(_OVERRIDE.get("bwd_hold", per_channel or bool(strip_b))), strip_b)


def stages_for(C, block_c, block_t, per_channel, channels_last, mode, strip, hold, elem_size, backward=False,
               smem=H200_SMEM) -> int:
    """How deep a pooled look-back tile software-pipelines its loops over chunks of channels (forward and
    backward alike; ``hold``: the forward's, see hold_for): 2 in "b t c" with at least 4 chunks, in fp32, or
    in 16 bits where the forward is lean; else 1 (none). The next chunk's loads go to shared memory (LDGSTS)
    while this one is merged, so a tile waits on DRAM once a loop rather than once a chunk. H200, CUDA graphs,
    forward / training step (µs), 1 -> 2: cln fp32 "b t c" (16, 512, 16000) 516 / 1349 -> 444 / 1200,
    (4, 512, 4000) 37.8 / 105.2 -> 29.6 / 93.7 (emaln alike); bf16 (4, 512, 4000), lean, 21.4 / 65.2 -> 19.2 /
    59.3. Lost elsewhere: bf16 held (16, 512, 16000) 326 / 962 -> 352 / 1016; every "b c t" row (fp32 (16,
    512, 16000) 367 / 1018 -> 400 / 1131; frameln 296 -> 362); SEG walks (fp32 "b t c" (2, 256, 64000)
    forward 164 -> 207) and tiles of one or two chunks. GLOBAL timed the same either way (stays 1); 3 chunks
    untimed (stays 1); 3 stages lost to 2. Only where the buffers fit the device's shared memory (``smem``:
    a [128, 128] fp32 backward takes 133 KB, over an RTX 4090's 99)."""
    running = mode in (CUMULATIVE, EMA)
    chunks = triton.cdiv(C, block_c)
    deep = not per_channel and running and channels_last and not strip and chunks >= 4
    ok = deep and (elem_size == 4 or not hold) and _fits(2, block_c, block_t, elem_size, backward, smem)
    return 2 if ok else 1


def walk_stages_for(per_channel, channels_last, mode, strip, backward, block_c=0, block_t=0, elem_size=4,
                    smem=H200_SMEM) -> int:
    """How deep a walk (strip or SEG) software-pipelines its loop over its tiles: 3 for per-channel running
    walks in "b t c", and for EMA's per-channel forward walks in "b c t"; else 1 (none). Loads of the next
    two tiles go to shared memory while this one is computed. H200, CUDA graphs, forward / training step
    (µs), 1 -> 3: ccln "b t c" (16, 512, 16000) fp32 511 / 1664 -> 456 / 1469, bf16 445 / 1837 -> 373 / 1446,
    (2, 256, 64000) fp32 151 / 504 -> 136 / 445; ccemaln "b t c" fp32 (16, 512, 16000) 562 / 2403 -> 518 /
    2130, bf16 (2, 256, 64000) 187 / 774 -> 170 / 657; ccemaln "b c t" forward fp32 (16, 512, 16000) 718 ->
    593, (2, 256, 64000) 250 -> 215. Lost: ccln "b c t" (fp32 (16, 512, 16000) forward 331 -> 331, step 1125 ->
    1212; bf16 319 -> 341 and 1093 -> 1151) and ccemaln's "b c t" backward on (2, 256, 64000) (step 706 -> 707
    with a 35 µs faster forward); 2 stages lost to 3 nearly everywhere. Pooled walks untimed but cln "b t c"'s SEG
    forward (2, 256, 64000), unchanged (164 µs): 1. Only where the buffers fit ``smem`` (see stages_for)."""
    if not per_channel or mode not in (CUMULATIVE, EMA) or not strip:
        return 1
    deep = channels_last or (mode == EMA and not backward)
    return 3 if deep and _fits(3, block_c, block_t, elem_size, backward, smem) else 1


class Plan(NamedTuple):
    mode: int
    block_c: int
    block_t: int
    warps: int
    ncb: int  # channel blocks
    sc: int  # statistics per frame and tile: 1 (pooled) or block_c
    nt: int  # tiles along time
    window: int
    span: int  # GLOBAL: tiles per first-launch program
    nspan: int
    log2d: float


def tiles_for(x, per_channel, decay=None) -> list[int]:
    """The launch choices for x, as ints an op can carry: [block_c, block_t, warps, window, span, walk,
    deterministic, strip, hold, backward block_c, backward warps, backward hold, backward strip, backward
    span, maxnreg, backward maxnreg (0: the compiler's choice), lone (whether a statistic can hold one value:
    per channel, or C = 1), stages, backward stages (pooled chunk loops' pipeline depth, stages_for; 1: none),
    walk stages, backward walk stages (a walk's loop over its tiles, walk_stages_for; 1: none)]. Forward and backward take the same list, so
    they always agree on the tiling (``backward_tiles`` gives the backward's view of it). Eager calls look them
    up in a cache (the host path of a small call is longer than its kernel)."""
    if torch.compiler.is_compiling():
        return _tiles_for(x, per_channel, decay)
    key = (x.shape, x.stride(), x.dtype, per_channel, time_mode(decay), x.device,
           torch.are_deterministic_algorithms_enabled(),
           tuple(_OVERRIDE.items()))
    tiles = _TILES.get(key)
    if tiles is None:
        if len(_TILES) > 4096:  # many distinct shapes (variable-length streams): start over
            _TILES.clear()
        tiles = _TILES[key] = _tiles_for(x, per_channel, decay)
    return list(tiles)


def _tiles_for(x, per_channel, decay) -> list[int]:
    B, C, T = x.shape
    channels_last = x.stride(1) == 1 and x.stride(2) != 1
    # dynamo traces through an lru_cache, warning of a risk: it gets the uncached function
    sms = (_num_sms.__wrapped__ if torch.compiler.is_compiling() else _num_sms)(x.device)
    es = x.element_size()
    # rows of "b c t" as Triton sees them; symbolic sizes (dynamic shapes) are taken as aligned: a guard would
    # recompile for a new T
    aligned = not any(statically_known_true(v * es % 16 != 0) for v in (T, x.stride(0), x.stride(1)))
    bc, bt, warps, strip, hold, bc_b, warps_b, hold_b, strip_b = choose_launch(
        B, C, T, per_channel, channels_last, time_mode(decay), sms, x.numel() * es, es, aligned)
    ncb = triton.cdiv(C, bc) if per_channel else 1
    window = _OVERRIDE.get("window", window_for(per_channel, B * ncb, sms))
    row = SEG_PER_SM[int(per_channel) * (1 + int(channels_last))]  # int(): dynamo rejects a bool index
    if time_mode(decay) == EMA:  # see SEG_PER_SM
        row = (row[1], row[1])
    per_sm = (row[0] if strip == 2 else 4, row[1] if strip_b == 2 else 4)  # each pass's own: SEG or not
    nt = triton.cdiv(T, bt)
    span_f, span_b = (_max(1, triton.cdiv(nt, _max(1, k * sms // _max(1, B * ncb))))
                      for k in per_sm)
    if strip == 2 and strip_b == 1:  # see strip_for: whole sequences
        span_f = span_b = _max(1, nt)
    if statically_known_true(span_f < SEG_MIN_TILES):  # a symbolic T keeps its own: a guard would recompile
        span_f = span_b
    span, span_b = (_OVERRIDE.get("span", v) for v in (span_f, span_b))
    deterministic = torch.are_deterministic_algorithms_enabled()
    agg_only = bool(_OVERRIDE.get("walk")) and not deterministic  # a walk would hide the prefix it waits for
    mode, smem = time_mode(decay), _smem(x.device)
    stages = _OVERRIDE.get("stages", stages_for(C, bc, bt, per_channel, channels_last, mode, strip, hold, es,
                                                False, smem))
    stages_b = _OVERRIDE.get("bwd_stages", stages_for(C, bc_b, bt, per_channel, channels_last, mode, strip_b, hold,
                                                      es, True, smem))
    walk_f = _OVERRIDE.get("walk_stages", walk_stages_for(per_channel, channels_last, mode, strip, False, bc, bt, es,
                                                          smem))
    walk_b = _OVERRIDE.get("bwd_walk_stages", walk_stages_for(per_channel, channels_last, mode, strip_b, True, bc_b,
                                                              bt, es, smem))
    return [bc, bt, warps, window, span, int(agg_only), int(deterministic), int(strip), int(hold), bc_b, warps_b,
            int(hold_b), strip_b, span_b, int(_OVERRIDE.get("maxnreg", 0)), int(_OVERRIDE.get("bwd_maxnreg", 0)),
            int(per_channel or C == 1 or bool(_OVERRIDE.get("lone"))), int(stages), int(stages_b),
            int(walk_f), int(walk_b)]


def backward_tiles(tiles) -> list[int]:
    """The backward's launch choices: the list with its own BLOCK_C, warps, span, strip and hold in their
    places."""
    return [tiles[9], tiles[1], tiles[10], tiles[3], tiles[13], tiles[5], tiles[6], tiles[12], tiles[11]]


def plan(shape, per_channel, decay, tiles) -> Plan:
    if all(type(v) is int for v in shape):  # not symbolic: cached
        return _plan_cached(tuple(shape), per_channel, decay, tuple(tiles))
    return _plan(shape, per_channel, decay, tiles)


def _plan(shape, per_channel, decay, tiles) -> Plan:
    B, C, T = shape
    mode = time_mode(decay)
    bc, bt, warps, window, span = tiles[:5]
    nt = triton.cdiv(T, bt)
    return Plan(mode, bc, bt, warps, triton.cdiv(C, bc) if per_channel else 1, bc if per_channel else 1, nt,
                window, span, triton.cdiv(nt, span), math.log2(decay) if mode == EMA else 0.0)


_plan_cached = functools.lru_cache(maxsize=4096)(_plan)


def prefix_numel(shape, per_channel, decay, tiles) -> int:
    """Size of the float32 prefix buffer the forward saves for the backward."""
    p = plan(shape, per_channel, decay, tiles)
    return shape[0] * p.ncb * p.nt * 3 * p.sc


def _workspace(device, n_words, stream=None):
    """The look-back records (zeroed once, grown on demand) and the ticket counter of a device's current
    stream: launches on two streams may run at once, and sharing them would mix their tickets and records."""
    key = (device, _stream_key(device) if stream is None else stream)
    pair = _PAIRS.get(key)
    if pair is None or pair[0].numel() < n_words:  # (the pair: one lookup a call, not two _kept calls)
        pair = _PAIRS[key] = _kept(key, n_words, device), _kept(key + ("ctr",), 1, device, least=1)
    return pair


_PAIRS: dict = {}  # (device, stream) -> the records and counter of _WORKSPACES, as _workspace returns them


def _span_records(device, n_floats, stream):
    """The span records of a stream's SEG and GLOBAL launches (float32, written before they are read in each
    call, so never zeroed again): kept and grown as the look-back's, with no allocation a call."""
    key = (device, stream, "span")
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel() < n_floats:
        ws = _WORKSPACES[key] = _kept(key + ("words",), (n_floats + 1) // 2, device).view(torch.float32)
    return ws


def _kept(key, n, device, least=1 << 12):
    """A buffer of at least n int64 zeros that outlives the call, grown (doubled) on demand."""
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel() < n:
        if ws is not None:  # launches on the stream may still read it, and a graph may hold its address
            _RETIRED.append(ws)
        ws = _WORKSPACES[key] = _persistent_zeros(max(n, least, 2 * (ws.numel() if ws is not None else 0)), device)
    return ws


_RETIRED: list = []


def _persistent_zeros(n, device):
    """int64 zeros that outlive any CUDA graph being warmed up or captured: on a GPU they are made by a helper
    thread on a side stream, since cudagraph trees send the capturing thread's allocations to the graph's pool,
    where a tensor kept past the call is an error ("tensors in the cudagraph pool not tracked as outputs")."""
    if device.type != "cuda":
        return torch.zeros(n, dtype=torch.int64, device=device)
    if torch.cuda.is_current_stream_capturing():
        # a stream's first launch inside a capture (torch.cuda.graph captures on a stream of its own, after a
        # warm-up on another): a helper thread's allocation there invalidates a capture in "global" mode, the
        # default. Made here, in the graph's pool; the graph records the zeroing, so that every replay starts from
        # zeroed records and ticket, as the first launch did
        return torch.zeros(n, dtype=torch.int64, device=device)
    out = []

    def make():
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            with torch.cuda.stream(side):
                out.append(torch.zeros(n, dtype=torch.int64, device=device))
            side.synchronize()

    helper = threading.Thread(target=make)
    helper.start()
    helper.join()
    if not out:
        raise RuntimeError(f"normlib: could not allocate the look-back workspace on {device}")
    return out[0]


def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


def _stream_key(device) -> int:
    """The current stream of ``device`` (x's: made current by _device_guard), as the raw handle Triton takes."""
    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


def _device_guard(device):
    """Triton launches on the current CUDA device: make it x's where another one is current (a model split
    over GPUs), or the kernel would run on the other device's stream while x's stream owns the buffers. None
    where x's device is current: no context to enter on a call's path (a nullcontext cost more than the check)."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return None


# ---------------------------------------------------------------------------------------------------
# Prepared calls: what the host decides from shapes, strides, dtypes and flags, decided once
# ---------------------------------------------------------------------------------------------------
class _Role(str):
    """A tensor argument of a prepared launch, by name: each call binds it to its own tensor of that name."""


class _Step:
    """One kernel launch of a prepared call: every argument fixed but its tensors (``_Role``). The first launch
    goes through Triton's launcher, which compiles the kernel and returns it; later ones call that compiled
    kernel's own launcher with the arguments in order, without Triton's per-call binding and specialization of
    some 45 arguments. Only where the call's tensors are 16-byte aligned (Triton specializes on it, and the
    ints are fixed by the key) and no launch hook (a profiler's) is set; else Triton's path."""

    __slots__ = ("kernel", "grid", "kw", "roles", "bound")

    def __init__(self, kernel, n, m=1, **kw):
        self.kernel, self.grid, self.kw = kernel, (_grid(n), m, 1), kw
        self.roles = tuple((k, v) for k, v in kw.items() if type(v) is _Role)
        self.bound = None

    def __call__(self, env, stream, aligned):
        b = self.bound
        hook = knobs.runtime.launch_enter_hook  # an empty HookChain, unless a profiler has added one
        if b is not None and aligned and (hook is None or not getattr(hook, "calls", True)):
            run, function, meta, fixed, slots = b
            args = fixed.copy()
            for i, role in slots:
                args[i] = env[role]
            run(*self.grid, stream, function, meta, None, None, None, *args)
            return
        kw = dict(self.kw)
        for name, role in self.roles:
            kw[name] = env[role]
        compiled = self.kernel[self.grid](**kw)
        if b is None and aligned:
            self.bound = _bind(self.kernel, compiled, kw, self.roles)


def _bind(kernel, compiled, kw, roles):
    """(launcher, function, metadata, the arguments in the kernel's order, the tensors' places in it) of a
    compiled kernel; None where there is none (Triton's interpreter) or the kernel is wrapped (a test's spy,
    which must see every launch)."""
    params = getattr(kernel, "params", None)
    try:
        run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return None
    if params is None:
        return None
    where = dict(roles)
    fixed, slots = [], []
    for i, param in enumerate(params):
        name = kernel.arg_names[i]
        if name in where:  # the call's own tensor goes here: none is kept
            slots.append((i, where[name]))
            fixed.append(None)
        else:
            fixed.append(kw[name] if name in kw else param.default)
    return run, function, meta, fixed, tuple(slots)


def _aligned(*tensors) -> bool:
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return not bits & 15


def _steps(kernel, p: Plan, tiles, shape, device, per_channel, backward=False, maxnreg=0, lone=True, stages=1,
           walk_stages=1, **kw):
    """The launches of a call, and the workspace they take (None, ("span", float32 words) or ("lookback", int64
    words)): one launch with the look-back, or GLOBAL's two, or a plain grid for FRAME, or a strip walk of each
    sequence, or SEG's two (segment sums, then walks of the segments), with span_scan between where there are
    many segments."""
    B = shape[0]
    strip = bool(tiles[7])
    flags = dict(POOL_ALL=not per_channel, MODE=p.mode, EMA32=ema32_for(per_channel, p.mode, p.log2d, p.block_t),
                 BLOCK_C=p.block_c, BLOCK_T=p.block_t, WINDOW=p.window,
                 DETERMINISTIC=bool(tiles[6]), AGG_ONLY=bool(tiles[5]), STRIP=strip, HOLD=bool(tiles[8]),
                 LONE=bool(lone), STAGES=stages, WALK_STAGES=walk_stages, num_warps=p.warps,
                 **({"maxnreg": maxnreg} if maxnreg else {}))
    sizes = dict(B=B, C=shape[1], T=shape[2], NCB=p.ncb, NT=p.nt, NSPAN=p.nspan, log2d=p.log2d)
    kw = dict(kw, **sizes, **flags)
    x, ws, ctr = _Role("none"), _Role("ws"), _Role("ctr")  # x: no workspace (any tensor the kernel ignores)
    spans = ("span", B * p.ncb * p.nspan * 3 * p.sc)
    if p.mode == GLOBAL and strip:  # one launch: each program sums its sequence, then normalizes it
        return [_Step(kernel, B * p.ncb, **kw, ws_ptr=x, ctr_ptr=x, PHASE=2, SPAN=1)], None
    # a symbolic count of spans (dynamic shapes) takes the scan, and SEG both phases, whatever it comes to: each is
    # right for any count (one span's scan is empty), where a guard on it would recompile at a new range of T
    many = not statically_known_true(p.nspan <= SCAN_SPANS)
    if p.mode == GLOBAL and statically_known_true(p.nspan <= p.window) and _OVERRIDE.get("global_launches") == 1:
        # one launch: its first programs (by ticket) sum a span each, the others own a tile and wait for their
        # sequence's spans, which each reads in one window (as a look-back's). The launches made gln's forward the
        # heaviest call on the host (33.9 µs, cln 20.4: at (4, 512, 4000) on an H100, 63 spans of one tile, three
        # launches); forced only (tile_size) until its device time is measured: its tiles hold phase 1's
        # registers too (pooled "b c t" fp32: 168 / 196 against 110 to 128 / 150, fewer tiles an SM)
        return [_Step(kernel, B * p.ncb * (p.nspan + p.nt), **kw, ws_ptr=ws, ctr_ptr=ctr, PHASE=3, SPAN=p.span)], \
            ("lookback", B * p.ncb * p.nt * 6 * p.sc)
    if p.mode == GLOBAL:
        scanned = many
        steps = [_Step(kernel, B * p.ncb * p.nspan, **kw, ws_ptr=ws, ctr_ptr=x, PHASE=1, SPAN=p.span,
                       SCANNED=False)]
        if scanned:
            steps.append(_scan_step(p, B, backward, 1, True, device))
        steps.append(_Step(kernel, B * p.ncb * p.nt, **kw, ws_ptr=ws, ctr_ptr=x, PHASE=2, SPAN=p.span,
                           SCANNED=scanned))
        return steps, spans
    if p.mode == FRAME:
        return [_Step(kernel, B * p.ncb * p.nt, **kw, ws_ptr=x, ctr_ptr=x, PHASE=0, SPAN=1)], None
    if tiles[7] == 2:  # SEG: each program sums a segment, then each walks one (one segment: nothing to sum)
        scanned = many
        steps = []
        for phase in (2,) if statically_known_true(p.nspan <= 1) else (1, 2):
            if phase == 2 and scanned:
                steps.append(_scan_step(p, B, backward, p.block_t * triton.cdiv(p.nt, p.nspan), False,
                                        device))
            steps.append(_Step(kernel, B * p.ncb * p.nspan, **kw, ws_ptr=ws, ctr_ptr=x, PHASE=phase, SPAN=1,
                               SEG=True, SCANNED=phase == 2 and scanned))
        return steps, spans
    if strip:  # one program per sequence walks its tiles
        return [_Step(kernel, B * p.ncb, **kw, ws_ptr=x, ctr_ptr=x, PHASE=0, SPAN=1)], None
    return [_Step(kernel, B * p.ncb * p.nt, **kw, ws_ptr=ws, ctr_ptr=ctr, PHASE=0, SPAN=1)], \
        ("lookback", B * p.ncb * p.nt * 6 * p.sc)


MAX_PROGRAMS = 2**31 - 1  # a CUDA grid's first dimension


def _grid(n):
    """A launch of n programs: a tile, a walk or a span each, which CUDA caps (B = 2^31 sequences of a few
    values would pass every other check)."""
    if n > MAX_PROGRAMS:
        raise ValueError(f"backend='triton' launches one program per tile here, and this input needs {n} "
                         f"(more than 2^31 - 1): split the batch, or use backend='torch'")
    return n


def _scan_step(p: Plan, B, backward, span_frames, whole, device):
    """span_scan over the span records of each of the B x NCB sequences (whole: GLOBAL's, all of them)."""
    # 4 statistics a program, or 1 where that leaves SMs idle: each program walks every span in turn (ccln
    # (1, 128, 256000) bf16 "b t c": 32 programs of 4 over 1561 spans took 58 of the forward's 204 µs)
    full = _sure(B * p.ncb * triton.cdiv(p.sc, 4) >= _num_sms(device))  # a symbolic batch: 1 (a guard recompiles)
    bs = min(p.sc, _OVERRIDE.get("scan_block", 4 if full else 1))
    return _Step(span_scan, B * p.ncb, triton.cdiv(p.sc, bs), ws_ptr=_Role("ws"), NSPAN=p.nspan,
                 log2d=p.log2d, SPAN_FRAMES=span_frames, SC=p.sc, BLOCK_R=_pow2_min(p.nspan, SCAN_ROWS),
                 BLOCK_S=bs, LINEAR=backward, ALL=whole, num_warps=4)


def _run(steps, need, env, device, aligned):
    """Run a prepared call's launches on x's device and its current stream, with their workspace."""
    if aligned is None:
        return _run_traced(steps, need, env, device)
    guard = _device_guard(device)
    if guard is not None:
        with guard:
            return _run(steps, need, env, device, aligned)
    stream = _stream_key(device)
    if need is not None:
        if need[0] == "span":
            env["ws"] = _span_records(device, need[1], stream)
        else:
            env["ws"], env["ctr"] = _workspace(device, need[1], stream)
    for step in steps:
        step(env, stream, aligned)


def _run_traced(steps, need, env, device):
    """The launches of a call inside the PyTorch ops (a ``triton_op``): through ``wrap_triton``, which
    torch.compile traces into launches of Inductor's own, and with a workspace of fresh zeros (its ticket counter
    in the word after the records), a buffer of the compiled graph like any other (CUDA graphs replay its
    zeroing)."""
    if need is not None and need[0] == "span":
        env["ws"] = torch.empty(need[1], dtype=torch.float32, device=device)
    elif need is not None:  # the records, then the ticket counter (CTR_IN_WS): one buffer, one fill a launch
        env["ws"] = torch.zeros(need[1] + 1, dtype=torch.int64, device=device)
        env["ctr"] = env["none"]
    if isinstance(env.get("x", env.get("parts")), FakeTensor):  # shapes only (the ops' fake implementation)
        return
    for step in steps:
        kw = dict(step.kw)
        for name, role in step.roles:
            kw[name] = env[role]
            if role == "ctr":
                kw["CTR_IN_WS"] = True
        for name, param in zip(getattr(step.kernel, "arg_names", ()), getattr(step.kernel, "params", ())):
            kw.setdefault(name, param.default)  # Inductor binds every argument by name, defaults too
        torch.library.wrap_triton(step.kernel)[step.grid](**kw)


MAX_FRAMES = 2**31 - 2**12  # frame indices are int32 in the kernels, up to the last tile's end
MAX_TILE_C, MAX_TILE_T = 8192, 4096  # beyond any tile's channels and frames (a masked lane's offset is computed)


def vec_for(shape, strides) -> dict:
    """VEC_T and VEC_C (_vec_for), cached where the sizes are ints."""
    if all(type(v) is int for v in (*shape, *(v for st in strides for v in st))):
        return _vec_for_cached(tuple(shape), tuple(map(tuple, strides)))
    return {}  # symbolic sizes (torch.compile's dynamic shapes): a hint would guard on T's divisibility


def _vec_for(shape, strides) -> dict:
    """VEC_T and VEC_C for tensors of this (B, C, T) shape and these strides (x's, y's, ...): where all of
    them run along T (C), the largest of 8, 4, 2 dividing T (C) and every stride of the other dims, so
    that their rows load as vectors (1 where Triton sees multiples of 16 by itself: no extra compile). And
    WIDE (the kernels' _wide): False where every offset inside one sequence, masked tile lanes past C and T
    included, fits int32."""
    _B, C, T = shape
    reach = max((C + MAX_TILE_C) * abs(st[1]) + (T + MAX_TILE_T) * abs(st[2]) for st in strides)
    out = {} if reach >= 2**31 else {"WIDE": False}
    for dim, key in ((2, "VEC_T"), (1, "VEC_C")):
        if all(st[dim] == 1 for st in strides):
            rest = [shape[dim]] + [st[d] for st in strides for d in range(3) if d != dim]
            if any(v % 16 for v in rest):
                vec = next(v for v in (8, 4, 2, 1) if all(r % v == 0 for r in rest))
                if vec > 1:
                    out[key] = vec
                break
    return out


_vec_for_cached = functools.lru_cache(maxsize=4096)(_vec_for)  # on every launch: a small call's host path is
# longer than its kernel


def check_input(x):
    """What the Triton backend takes beyond the common checks: x is the (B, C, T) view."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"backend='triton' takes float16, bfloat16 or float32 inputs, got {x.dtype}")
    if x.shape[2] >= MAX_FRAMES:
        raise ValueError(f"backend='triton' takes sequences of fewer than 2^31 - 2^12 frames, got T={x.shape[2]} "
                         "(backend='torch' takes any)")


def _like_strides(shape, strides):
    """The strides of torch.empty_like of a tensor of this shape and these strides (x's own where they are dense)."""
    return torch.empty_like(torch.empty_strided(shape, strides, device="meta")).stride()


def _prepared(cls, *key):
    if not all(type(v) is int for v in (*key[0], *key[1])):  # symbolic sizes (torch.compile's dynamic shapes)
        return cls(*key)
    call = _CALLS.get(key)
    if call is None:
        if len(_CALLS) > 4096:  # many distinct shapes (variable-length streams): start over
            _CALLS.clear()
        call = _CALLS[key] = cls(*key)
    return call


class _Forward:
    """``forward`` for one signature: shape, strides, dtype, device, options, which inputs are given, tiles."""

    def __init__(self, shape, strides, dtype, device, per_channel, decay, eps, eps_outside, has_w, has_b,
                 has_len, has_sin, return_state, save, tiles):
        B, C, T = shape
        p = self.p = plan(shape, per_channel, decay, tiles)
        self.shape, self.device = (B, C, T), device
        self.nsc, self.return_state, self.numel = C if per_channel else 1, return_state, B * C * T
        self.has_sin = has_sin and p.mode != FRAME  # FRAME ignores the incoming state's statistics
        # FRAME writes none of the prefixes and GLOBAL only tile 0's entries: zeros there, not garbage
        self.pre = (prefix_numel(shape, per_channel, decay, tiles), p.mode in (CUMULATIVE, EMA)) if save else None
        ys = _like_strides(shape, strides)
        R = _Role
        self.steps, self.need = _steps(
            running_norm_fwd, p, tiles, shape, device, per_channel, maxnreg=tiles[14], lone=tiles[16],
            stages=tiles[17], walk_stages=tiles[19], x_ptr=R("x"), y_ptr=R("y"), w_ptr=R("w"), b_ptr=R("b"),
            len_ptr=R("len"), sin_ptr=R("sin"), sout_ptr=R("sout"), pre_ptr=R("pre"), sxb=strides[0],
            sxc=strides[1], sxt=strides[2], syb=ys[0], syc=ys[1], syt=ys[2], eps=eps,
            log2d_lo=p.log2d - _f32(p.log2d), HAS_W=has_w, HAS_B=has_b, HAS_LEN=has_len, HAS_SIN=self.has_sin,
            STORE_SOUT=return_state, STORE_PREFIX=save, EPS_OUTSIDE=eps_outside,
            **vec_for(shape, (tuple(strides), ys)))

    def __call__(self, x, weight, bias, lengths, sin, traced=False):
        """``traced``: inside the PyTorch ops (see _run_traced)."""
        y = torch.empty_like(x)
        sout = pre = None
        if self.return_state:  # rows with lengths == 0 keep the incoming state (or the empty one)
            sout = sin.clone() if sin is not None else \
                torch.zeros(3, self.shape[0], self.nsc, dtype=torch.float64, device=x.device)
        if self.pre is not None:
            pre = (torch.empty if self.pre[1] else torch.zeros)(self.pre[0], dtype=torch.float32, device=x.device)
        if not self.numel:
            return y.zero_(), sout, pre
        sin = sin if self.has_sin else None
        none = _dummy(x) if traced else y
        env = {"x": x, "y": y, "w": _or(weight, none), "b": _or(bias, none), "len": _or(lengths, none),
               "sin": _or(sin, none), "sout": _or(sout, none), "pre": _or(pre, none), "none": none}
        _run(self.steps, self.need, env, self.device, None if traced else _aligned(x, weight, bias, lengths, sin))
        return y, sout, pre


class _Backward:
    """``backward`` for one signature, as _Forward."""

    def __init__(self, shape, strides, dtype, device, per_channel, decay, eps, eps_outside, has_w, has_len,
                 has_sin, has_gsout, need_weight_grads, tiles):
        B, C, T = shape
        maxnreg, lone, stages, walk_stages = tiles[15], tiles[16], tiles[18], tiles[20]
        tiles = backward_tiles(tiles)
        p = self.p = plan(shape, per_channel, decay, tiles)
        self.shape, self.device, self.nsc, self.numel = (B, C, T), device, C if per_channel else 1, B * C * T
        self.gs = _like_strides(shape, strides)  # dx's strides, and dy's (see __call__)
        self.has_sin, self.has_gsout, self.need_w = has_sin, has_gsout, need_weight_grads
        R, gs = _Role, self.gs
        self.steps, self.need = _steps(
            running_norm_bwd, p, tiles, shape, device, per_channel, backward=True, maxnreg=maxnreg, lone=lone,
            stages=stages, walk_stages=walk_stages, x_ptr=R("x"), gy_ptr=R("gy"), gx_ptr=R("gx"), w_ptr=R("w"),
            len_ptr=R("len"), sin_ptr=R("sin"), gsout_ptr=R("gsout"), gsin_ptr=R("gsin"), pre_ptr=R("pre"),
            gwp_ptr=R("gwp"), gbp_ptr=R("gbp"), sxb=strides[0], sxc=strides[1], sxt=strides[2], sgb=gs[0],
            sgc=gs[1], sgt=gs[2], sdb=gs[0], sdc=gs[1], sdt=gs[2], eps=eps, HAS_W=has_w, HAS_LEN=has_len,
            HAS_SIN=has_sin and p.mode != FRAME, HAS_GSOUT=has_gsout, STORE_GW=need_weight_grads,
            EPS_OUTSIDE=eps_outside, **vec_for(shape, (tuple(strides), gs, gs)),
            FLIP=per_channel and p.warps == 1 and p.mode in (CUMULATIVE, EMA))  # frames in lanes: _cumsum
        if need_weight_grads and C:  # then dweight and dbias from the per-tile partials (see weight_grads)
            self.steps.append(_Step(sum_partials, triton.cdiv(C, 8), 2, p_ptr=R("parts"), gw_ptr=R("gw"),
                                    gb_ptr=R("gb"), R=B * p.nt, C=C, BLOCK_R=512, BLOCK_C=8, num_warps=4))

    def __call__(self, gy, gsout, x, weight, lengths, sin, pre, traced=False):
        B, C, T = self.shape
        gx = torch.empty_like(x)
        if gy.stride() != self.gs and any(n > 1 and a != b for n, a, b in zip(self.shape, gy.stride(), self.gs)):
            # dy in y's layout: an expanded dy (the cotangent of y.sum()) or another layout would compile another
            # specialization, whose rounding differs from what torch.compile's AOT (which makes dy dense) gets
            gy = torch.empty_like(x).copy_(gy)
        gsin = torch.zeros(3, B, self.nsc, dtype=torch.float64, device=x.device) if sin is not None else None
        gwp = gw = gb = None
        if self.need_w:  # outputs may not alias
            # (B * NT) rows, not (B, NT): a traced contiguity check of a size-NT dim guards on NT == 1, a new graph
            # at T = 65 (torch 2.11, dynamic=True); B * NT >= 2 settles it without a guard
            gwp = torch.empty(2, B * self.p.nt, C, dtype=torch.float32, device=x.device)
            gw = torch.empty(C, dtype=torch.float32, device=x.device)
            gb = torch.empty(C, dtype=torch.float32, device=x.device)
        aligned = None if traced else True
        if self.numel:
            none = _dummy(x) if traced else gx
            env = {"x": x, "gy": gy, "gx": gx, "w": _or(weight, none), "len": _or(lengths, none),
                   "sin": _or(sin if self.p.mode != FRAME else None, none), "gsout": _or(gsout, none),
                   "gsin": _or(gsin if self.p.mode != FRAME else None, none), "pre": pre,
                   "gwp": gwp[0] if gwp is not None else none, "gbp": gwp[1] if gwp is not None else none,
                   "gw": gw, "gb": gb, "parts": gwp, "none": none}
            _run(self.steps, self.need, env, self.device,
                 aligned and _aligned(x, gy, weight, lengths, sin, gsout))
        elif gwp is not None:
            gx.zero_()
            gwp.zero_()
            _run(self.steps[-1:], None, {"parts": gwp, "gw": gw, "gb": gb}, self.device, aligned)
        else:
            gx.zero_()
        if gsin is not None and gsout is not None:  # a sequence with no value passed its state straight through
            if not self.numel:  # T = 0 or C = 0
                gsin = gsin + gsout
            elif lengths is not None:
                gsin = torch.where((lengths == 0).view(1, B, 1), gsin + gsout, gsin)
        if gsin is not None:  # a state's weight is a count, which nothing differentiable moves: no gradient
            gsin[0] = 0
        return gx, gw, gb, gsin


def forward(x, weight, bias, lengths, sin, *, per_channel, decay, eps, eps_outside, return_state, save,
            tiles, traced=False):
    """y, the outgoing state as a (3, B, C|1) float64 tensor (or None) and, with ``save``, the tiles'
    prefixes that ``backward`` needs (or None). ``sin`` is the incoming state stacked the same way."""
    weight, bias, lengths, sin = (_dense(t) for t in (weight, bias, lengths, sin))
    call = _prepared(_Forward, x.shape, x.stride(), x.dtype, x.device, per_channel, decay, eps, eps_outside,
                     weight is not None, bias is not None, lengths is not None, sin is not None, return_state, save,
                     tuple(tiles))
    return call(x, weight, bias, lengths, sin, traced)


def backward(gy, gsout, x, weight, lengths, sin, pre, *, per_channel, decay, eps, eps_outside,
             need_weight_grads, tiles, traced=False):
    """Gradients of ``forward``: (dx, dweight, dbias, dstate as (3, B, C|1) float64, or None where not
    asked). ``gsout`` is the (3, B, C|1) gradient of the returned state, or None."""
    weight, lengths, sin, gsout = (_dense(t) for t in (weight, lengths, sin, gsout))
    call = _prepared(_Backward, x.shape, x.stride(), x.dtype, x.device, per_channel, decay, eps, eps_outside,
                     weight is not None, lengths is not None, sin is not None, gsout is not None, need_weight_grads,
                     tuple(tiles))
    return call(gy, gsout, x, weight, lengths, sin, pre, traced)


def weight_grads(parts):
    """dweight and dbias, float32, from (2, rows, C) float32 per-tile partials, in a fixed order (so
    deterministic). Blocks of 8 channels by 512 rows: (16, 512, 16000)'s 4000 x 512 partials take 128
    programs of 8 loads each, (64, 128, 500)'s 512 x 128 take 32 programs of one."""
    _, R, C = parts.shape
    gw, gb = (torch.empty(C, dtype=torch.float32, device=parts.device) for _ in range(2))  # outputs may not alias
    if C:
        step = _Step(sum_partials, triton.cdiv(C, 8), 2, p_ptr=_Role("parts"), gw_ptr=_Role("gw"),
                     gb_ptr=_Role("gb"), R=R, C=C, BLOCK_R=512, BLOCK_C=8, num_warps=4)
        _run([step], None, {"parts": parts, "gw": gw, "gb": gb}, parts.device, False)
    return gw, gb


def _dense(t):
    """Small side tensors (weights, lengths, stacked states) are indexed as contiguous by the kernels."""
    return t.contiguous() if t is not None else None


def _dummy(x):
    """A tensor for the pointers a traced launch ignores, of x's dtype (the specialization eager calls compile,
    which pass y) and apart from every tensor the kernel writes, whose copies Inductor would otherwise keep."""
    return x.new_empty(16)


def _or(t, dummy):
    return t if t is not None else dummy


class _Launcher(types.ModuleType):
    """This module: assigning one of its names (a threshold or a helper, as an A/B run or a test does) drops
    the launch choices that ``tiles_for`` cached under the old one (its key holds the input, not them) and the
    prepared calls."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name not in ("_TILES", "_CALLS", "EPOCH"):
            _TILES.clear()
            _changed()


sys.modules[__name__].__class__ = _Launcher
