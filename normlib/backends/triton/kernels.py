"""The running-statistics kernel template: one forward and one backward kernel for every norm.

Constexpr flags select the norm and the call:
- POOL_ALL: statistics over all C channels of a frame (one (w, m, M2) per frame) or per channel;
- MODE: 0 FRAME, 1 CUMULATIVE, 2 EMA (decay d in (0, 1)), 3 GLOBAL;
- HAS_W / HAS_B (affine), HAS_LEN (lengths), HAS_SIN (incoming state), STORE_SOUT (outgoing state),
  STORE_PREFIX (each tile's incoming prefix, for the backward), EPS_OUTSIDE;
- layout through strides: a "b t c" input is a (B, C, T) view with stride 1 on C, read in place;
- VEC_T (VEC_C): rows run along T (C), and T (C) and the other two dims' strides are multiples of it.
  Triton sees multiples of 16 by itself; without the hint, "b c t" rows of T = 500 loaded one element at
  a time (cln's pooled backward: 255 registers and a spill, 6456 SASS instructions; with it, 220 and
  4016, as at T = 512).
- WIDE: a sequence's per-element offsets need int64 (it spans 2^31 elements or more); else they are int32.

A program owns one tile of (BLOCK_C channels x BLOCK_T frames) and keeps it in registers: the forward
reads x once and writes y once; the backward reads x and dy once and writes dx once. Tiles of a sequence
get their prefix (forward: merged statistics of earlier frames; backward: decayed suffix sums of later
frames) by decoupled look-back: each tile publishes the summary of its own frames (its aggregate), then
combines its predecessors' summaries, walking back until one has published its inclusive prefix. Tiles
take their index from an atomic ticket, so a tile only ever waits on tiles that have already started: no
deadlock, whatever the scheduler does.

Published words carry a tag in their upper 32 bits (the launch's epoch + 1) beside the float bits, so a
reader tells a word written by this launch from a stale one without a fence or a workspace reset; the
epoch comes from the ticket counter itself (epoch << 32 | ticket), which the last ticket advances.

Statistics are float32 Chan merges of x - K, K a per-sequence (per-channel) shift: frame 0's mean (summed
in float64, so that the backward's chunks find the same K) or value, or an incoming state's mean where the
state outweighs the sequence (_shift); an incoming float64 state is shifted by K in float64. FRAME shifts
each frame by its own channel 0
instead, so a frame far from frame 0 loses no digits of its small spread. GLOBAL runs the same tile code in two launches (PHASE 1: per-span
summaries; PHASE 2: reduce them and finish), with span_scan between for many spans, or, where the launcher is
told to, in one (PHASE 3: the first tickets publish the spans' summaries, tagged; the later ones wait for their
sequence's, reduce them and finish). STRIP walks a whole sequence in one program and carries the prefix; SEG
walks it in NSPAN segments, one program each, after a PHASE 1 launch has summed every segment, so no
program waits on another. The backward's math is derived in docs/math.md.

The file reads in sections (banners below): scan and merge primitives; the look-back; shifts, loads and
stores; states in and out; statistics of frames and tiles; tile order; the forward kernel
(``running_norm_fwd``); the backward kernel (``running_norm_bwd``); reductions after a launch
(``sum_partials``, ``span_scan``). It stays one file: ``benchmarks/tools/ab.py`` and ``compile_check.py``
swap and compile it as a unit.
"""
import triton
import triton.language as tl

# L2 hints for a tile's reads and writes (HINT below). A pooled tile reads its chunks of channels twice: to
# merge their statistics, then to write them. Without hints the stream of writes and of other tiles' reads
# evicted a chunk before its second read: ncu counted 1.39 times x read from DRAM in cln's forward on
# (16, 512, 16000) fp32, and 1.05 times with them (0.64 -> 0.70 of a copy).
ONCE = tl.constexpr(1)  # the values' last read in this kernel, or an output: evicted first
AGAIN = tl.constexpr(2)  # a chunk the tile reads again: kept (evict_last) until then


# ---------------------------------------------------------------------------------------------------
# Scan and merge primitives: Chan's merge with decay, its linear twin, scans and sums of a tile
# ---------------------------------------------------------------------------------------------------
@triton.jit
def merge(w1, m1, q1, d1, w2, m2, q2, d2):
    """Chan's merge of an older summary (1) with a newer one (2); d is the summary's decay (d^L)."""
    wo = d2 * w1
    w = wo + w2
    delta = m2 - m1
    inv = 1.0 / tl.where(w > 0, w, 1.0)
    frac = w2 * inv
    m = tl.where(wo >= w2, m1 + delta * frac, m2 - delta * (wo * inv))  # from the heavier side: exact
    return w, m, d2 * q1 + q2 + delta * delta * wo * frac, d1 * d2     # when the other weighs nothing


@triton.jit
def lin(u1, v1, z1, d1, u2, v2, z2, d2):
    """Decayed sums: the older summary (1) decays by the newer one's d before adding."""
    return d2 * u1 + u2, d2 * v1 + v2, d2 * z1 + z2, d1 * d2


@triton.jit
def _combine(a, b, c, d, e, f, g, h, LINEAR: tl.constexpr):
    if LINEAR:
        return lin(a, b, c, d, e, f, g, h)
    else:
        return merge(a, b, c, d, e, f, g, h)


@triton.jit
def _scan(w, m, q, d, N: tl.constexpr, SC: tl.constexpr, AXIS: tl.constexpr, LINEAR: tl.constexpr,
          REVERSE: tl.constexpr, FLIP: tl.constexpr = False):
    """Inclusive scan of [N, SC] (AXIS 0) or [SC, N] (AXIS 1) summaries; REVERSE scans from the end
    (the later element is the older one). With SC == 1 it scans a 1D vector: Triton 3.6's scan lowering
    asserts on some layouts of a unit dim; a scan over one element is skipped (it is the identity). FLIP
    (with REVERSE, SC > 1) reverses, scans forward and reverses back (see _cumsum)."""
    if N == 1:
        return w, m, q, d
    elif FLIP and REVERSE and SC > 1:
        w, m, q, d = _scan(tl.flip(w, AXIS), tl.flip(m, AXIS), tl.flip(q, AXIS), tl.flip(d, AXIS), N, SC, AXIS,
                           LINEAR, False)
        return tl.flip(w, AXIS), tl.flip(m, AXIS), tl.flip(q, AXIS), tl.flip(d, AXIS)
    elif SC == 1:
        t = (tl.reshape(w, [N]), tl.reshape(m, [N]), tl.reshape(q, [N]), tl.reshape(d, [N]))
        if LINEAR:
            w, m, q, d = tl.associative_scan(t, axis=0, combine_fn=lin, reverse=REVERSE)
        else:
            w, m, q, d = tl.associative_scan(t, axis=0, combine_fn=merge, reverse=REVERSE)
        shape: tl.constexpr = [N, 1] if AXIS == 0 else [1, N]
        return tl.reshape(w, shape), tl.reshape(m, shape), tl.reshape(q, shape), tl.reshape(d, shape)
    else:
        if LINEAR:
            return tl.associative_scan((w, m, q, d), axis=AXIS, combine_fn=lin, reverse=REVERSE)
        else:
            return tl.associative_scan((w, m, q, d), axis=AXIS, combine_fn=merge, reverse=REVERSE)


@triton.jit
def _cumsum(v, N: tl.constexpr, SC: tl.constexpr, REVERSE: tl.constexpr, FLIP: tl.constexpr = False):
    """Inclusive running sums along axis 1 of [SC, N] (REVERSE: from the end), as _scan for SC == 1.
    FLIP does a reverse scan as reverse, scan forward, reverse back: free where each lane holds all of its
    rows' N frames (per-channel tiles on one warp: "b t c" [128, 8]), where Triton 3.6's reverse scan
    exchanges every value across the warp's lanes (320 shuffles for a [128, 8] tile); where frames span
    many lanes and warps ("b c t" [4, 128]) the flips go through shared memory."""
    if N == 1:
        return v
    elif FLIP and REVERSE and SC > 1:
        return tl.flip(tl.cumsum(tl.flip(v, 1), axis=1), 1)
    elif SC == 1:
        return tl.reshape(tl.cumsum(tl.reshape(v, [N]), axis=0, reverse=REVERSE), [1, N])
    else:
        return tl.cumsum(v, axis=1, reverse=REVERSE)


# ---------------------------------------------------------------------------------------------------
# The look-back: packed tagged words, tickets, published records, the walk back and the span records
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _f32(v):
    """A float argument as float32: Triton's launcher passes a Python float as fp32, Inductor's as fp64 (whose
    arithmetic would promote the statistics and fail to compile)."""
    return tl.cast(v, tl.float32)


@triton.jit
def _pack(v, tag):
    # [tag | float bits] in one int64 word: a single-copy-atomic load sees both or neither
    return (tag.to(tl.int64) << 32) | (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _unpack(word):
    return (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True), (word >> 32).to(tl.int32)


@triton.jit
def _group_sum(v, POOL_ALL: tl.constexpr):
    """[BLOCK_C, BLOCK_T] -> [SC, BLOCK_T]: sum over the channels that are pooled."""
    if POOL_ALL:
        return tl.sum(v, axis=0, keep_dims=True)
    else:
        return v


@triton.jit
def _pick(v, at):
    """The column of a [SC, BLOCK_T] tensor where ``at`` ([1, BLOCK_T]) holds, as [SC] (0 if none)."""
    return tl.sum(tl.where(at, v, 0.0), axis=1)


@triton.jit
def _ticket(ctr_ptr, n_tiles):
    """(tile index in start order, this launch's tag). The last ticket moves the counter to a new epoch."""
    ticket = tl.atomic_add(ctr_ptr, 1)
    tile_id = (ticket & 0xFFFFFFFF).to(tl.int32)
    tag = ((ticket >> 32) & 0x3FFFFFFF).to(tl.int32) + 1
    next_epoch = (tl.full([], 1, tl.int64) << 32) - (n_tiles + tl.zeros([], tl.int64))
    tl.atomic_add(ctr_ptr, next_epoch, mask=tile_id == n_tiles - 1)
    return tile_id, tag


@triton.jit
def _publish(prec, a, b, c, tag, SLOT: tl.constexpr, SC: tl.constexpr):
    """Write a summary into a record: SLOT 0 is the aggregate, SLOT 1 the inclusive prefix."""
    tl.store(prec + (3 * SLOT + 0) * SC, _pack(a, tag))
    tl.store(prec + (3 * SLOT + 1) * SC, _pack(b, tag))
    tl.store(prec + (3 * SLOT + 2) * SC, _pack(c, tag))


@triton.jit
def _read_records(p, msk, SC: tl.constexpr):
    """A block of records: its 6 values (aggregate, inclusive prefix) and their 6 tags."""
    a0, t0 = _unpack(tl.load(p + 0 * SC, mask=msk, other=0, volatile=True))
    a1, t1 = _unpack(tl.load(p + 1 * SC, mask=msk, other=0, volatile=True))
    a2, t2 = _unpack(tl.load(p + 2 * SC, mask=msk, other=0, volatile=True))
    a3, t3 = _unpack(tl.load(p + 3 * SC, mask=msk, other=0, volatile=True))
    a4, t4 = _unpack(tl.load(p + 4 * SC, mask=msk, other=0, volatile=True))
    a5, t5 = _unpack(tl.load(p + 5 * SC, mask=msk, other=0, volatile=True))
    return a0, a1, a2, a3, a4, a5, t0, t1, t2, t3, t4, t5


@triton.jit
def _lookback(ws_ptr, rec0, tile, tag, d_tile, offs_s, SC: tl.constexpr, WINDOW: tl.constexpr,
              AGG_ONLY: tl.constexpr, DETERMINISTIC: tl.constexpr, LINEAR: tl.constexpr):
    """The exclusive prefix of ``tile`` (> 0, in start order) from its predecessors' records.

    A record is 6*SC int64 words: the aggregate (3 values) then the inclusive prefix (3 values); every
    aggregate spans one full tile (decay d_tile). Returns three [SC] values.
    """
    offs_w = tl.arange(0, WINDOW)
    acc_a = tl.zeros([SC], dtype=tl.float32)
    acc_b = tl.zeros([SC], dtype=tl.float32)
    acc_c = tl.zeros([SC], dtype=tl.float32)
    acc_d = tl.full([SC], 1.0, dtype=tl.float32)
    hi = tile  # the window covers tiles hi - WINDOW .. hi - 1
    done = 0
    while done == 0:
        j = hi - WINDOW + offs_w  # [WINDOW]
        ok_j = j >= 0
        p = ws_ptr + rec0 + tl.maximum(j, 0).to(tl.int64)[:, None] * (6 * SC) + offs_s[None, :]
        m2d = ok_j[:, None] & (offs_s[None, :] >= 0)  # [WINDOW, SC]
        aa, ab, ac, ia, ib, ic, t0, t1, t2, t3, t4, t5 = _read_records(p, m2d, SC)
        agg_ok = tl.min(((t0 == tag) & (t1 == tag) & (t2 == tag)).to(tl.int32), axis=1)  # [WINDOW]
        inc_ok = tl.min(((t3 == tag) & (t4 == tag) & (t5 == tag)).to(tl.int32), axis=1)
        agg_ok = tl.where(ok_j, agg_ok, 1)
        inc_ok = tl.where(ok_j, inc_ok, 0)
        if AGG_ONLY:  # tests: ignore published prefixes but tile 0's, so the walk crosses windows
            inc_ok = tl.where(j == 0, inc_ok, 0)
        if DETERMINISTIC:  # a fixed grouping: only the prefix of the window-aligned tile below counts
            inc_ok = tl.where(j == ((tile - 1) // WINDOW) * WINDOW, inc_ok, 0)
        k = tl.max(tl.where(inc_ok > 0, offs_w, -1), axis=0)  # newest published prefix in the window
        ready = tl.min(tl.where(offs_w > k, agg_ok, 1), axis=0)
        if DETERMINISTIC:  # wait for that prefix: walking past it would never meet another
            ready = tl.where(k >= 0, ready, 0)
        if ready > 0:
            # Triton may give several warps their own copy of a small [WINDOW, SC] block, and a volatile
            # load can see a word published in one copy and not yet in another; the decision above came
            # from one copy. Read the words again: they were seen in L2, so every copy now gets them.
            aa, ab, ac, ia, ib, ic, t0, t1, t2, t3, t4, t5 = _read_records(p, m2d, SC)
            use_inc = (offs_w == k)[:, None]
            keep = (offs_w >= k)[:, None] & ok_j[:, None]
            sa = tl.where(keep, tl.where(use_inc, ia, aa), 0.0)
            sb = tl.where(keep, tl.where(use_inc, ib, ab), 0.0)
            sc = tl.where(keep, tl.where(use_inc, ic, ac), 0.0)
            sd = tl.where(keep & (offs_w > k)[:, None], d_tile, 1.0) + tl.zeros([WINDOW, SC], tl.float32)
            sa, sb, sc, sd = _scan(sa, sb, sc, sd, WINDOW, SC, 0, LINEAR, False)
            last = (offs_w == WINDOW - 1)[:, None]
            ta = tl.sum(tl.where(last, sa, 0.0), axis=0)
            tb = tl.sum(tl.where(last, sb, 0.0), axis=0)
            tc = tl.sum(tl.where(last, sc, 0.0), axis=0)
            td = tl.sum(tl.where(last, sd, 0.0), axis=0)
            acc_a, acc_b, acc_c, acc_d = _combine(ta, tb, tc, td, acc_a, acc_b, acc_c, acc_d, LINEAR)
            if k >= 0:
                done = 1
            else:
                hi = hi - WINDOW
    return acc_a, acc_b, acc_c


@triton.jit
def _prefix(ws_ptr, rec0, k, tag, ca, cb, cc, aa, ab, ac, d_tile, offs_s, SC: tl.constexpr, WINDOW: tl.constexpr,
            AGG_ONLY: tl.constexpr, DETERMINISTIC: tl.constexpr, LINEAR: tl.constexpr, STRIP: tl.constexpr):
    """A tile's exclusive prefix and its inclusive one (the exclusive combined with the tile's aggregate
    a), [SC] each. The exclusive prefix is the carry c: the previous tile's inclusive prefix (STRIP walks
    a sequence in one program) or the sequence's start (tile k == 0 in walk order); other tiles publish
    their aggregate and look back. Look-back tiles publish their inclusive prefix for their successors."""
    prec = ws_ptr + rec0 + k.to(tl.int64) * (6 * SC) + offs_s
    if STRIP:
        pa, pb, pc = ca, cb, cc
    elif k == 0:
        pa, pb, pc = ca, cb, cc
    else:
        _publish(prec, aa, ab, ac, tag, 0, SC)
        pa, pb, pc = _lookback(ws_ptr, rec0, k, tag, d_tile, offs_s, SC, WINDOW, AGG_ONLY, DETERMINISTIC, LINEAR)
    ia, ib, ic, _ = _combine(pa, pb, pc, 1.0, aa, ab, ac, d_tile, LINEAR)
    if not STRIP:
        _publish(prec, ia, ib, ic, tag, 1, SC)
    return pa, pb, pc, ia, ib, ic


@triton.jit
def _span_reduce(ws_ptr, rec0, n, d_rec, offs_s, SC: tl.constexpr, WINDOW: tl.constexpr,
                 LINEAR: tl.constexpr, TAGGED: tl.constexpr = False, tag=0):
    """Combine the first n span summaries of one sequence in order, [SC] each; each span decays what came
    before it by d_rec (GLOBAL: 1; a segmented walk's forward: d^(frames of a span)). TAGGED: GLOBAL's one
    launch, whose spans publish as they finish (int64 words, _publish): wait until every word holds ``tag``."""
    ra = tl.zeros([SC], dtype=tl.float32)
    rb = tl.zeros([SC], dtype=tl.float32)
    rc = tl.zeros([SC], dtype=tl.float32)
    rd = tl.full([SC], 1.0, dtype=tl.float32)
    for j0 in range(0, n, WINDOW):
        offs_j = j0 + tl.arange(0, WINDOW)
        pj = ws_ptr + rec0 + offs_j.to(tl.int64)[:, None] * (3 * SC) + offs_s[None, :]
        mj = (offs_j < n)[:, None] & (offs_s[None, :] >= 0)
        if TAGGED:
            ready = 0
            while ready == 0:
                ja, ta = _unpack(tl.load(pj + 0 * SC, mask=mj, other=0, volatile=True))
                jb, tb = _unpack(tl.load(pj + 1 * SC, mask=mj, other=0, volatile=True))
                jc, tc = _unpack(tl.load(pj + 2 * SC, mask=mj, other=0, volatile=True))
                ready = tl.min(tl.min((((ta == tag) & (tb == tag) & (tc == tag)) | ~mj).to(tl.int32), axis=1), axis=0)
            # read again: a warp's own copy of the block may have missed words another copy saw (as _lookback)
            ja, ta = _unpack(tl.load(pj + 0 * SC, mask=mj, other=0, volatile=True))
            jb, tb = _unpack(tl.load(pj + 1 * SC, mask=mj, other=0, volatile=True))
            jc, tc = _unpack(tl.load(pj + 2 * SC, mask=mj, other=0, volatile=True))
        else:
            ja = tl.load(pj + 0 * SC, mask=mj, other=0.0)
            jb = tl.load(pj + 1 * SC, mask=mj, other=0.0)
            jc = tl.load(pj + 2 * SC, mask=mj, other=0.0)
        jd = tl.where(mj, d_rec, 1.0)  # a record past n is empty and decays nothing
        ja, jb, jc, jd = _scan(ja, jb, jc, jd, WINDOW, SC, 0, LINEAR, False)
        lastj = (tl.arange(0, WINDOW) == WINDOW - 1)[:, None]
        ra, rb, rc, rd = _combine(ra, rb, rc, rd, tl.sum(tl.where(lastj, ja, 0.0), axis=0),
                                  tl.sum(tl.where(lastj, jb, 0.0), axis=0),
                                  tl.sum(tl.where(lastj, jc, 0.0), axis=0),
                                  tl.sum(tl.where(lastj, jd, 0.0), axis=0), LINEAR)
    return ra, rb, rc, rd


@triton.jit
def _span_suffix(ws_ptr, rec0, s, NSPAN, log2d_span, offs_s, SC: tl.constexpr, WINDOW: tl.constexpr):
    """The decayed sums of the spans after span s, seen from the end of span s: sum over j > s of
    d_span^(j - s - 1) times span j's sums (a segmented backward's carry; linear, so in any order)."""
    ra = tl.zeros([SC], dtype=tl.float32)
    rb = tl.zeros([SC], dtype=tl.float32)
    rc = tl.zeros([SC], dtype=tl.float32)
    for j0 in range(s + 1, NSPAN, WINDOW):
        offs_j = j0 + tl.arange(0, WINDOW)
        pj = ws_ptr + rec0 + offs_j.to(tl.int64)[:, None] * (3 * SC) + offs_s[None, :]
        mj = (offs_j < NSPAN)[:, None] & (offs_s[None, :] >= 0)
        wj = tl.exp2(log2d_span * (offs_j - s - 1).to(tl.float32))[:, None]
        ra += tl.sum(wj * tl.load(pj + 0 * SC, mask=mj, other=0.0), axis=0)
        rb += tl.sum(wj * tl.load(pj + 1 * SC, mask=mj, other=0.0), axis=0)
        rc += tl.sum(wj * tl.load(pj + 2 * SC, mask=mj, other=0.0), axis=0)
    return ra, rb, rc


# ---------------------------------------------------------------------------------------------------
# Shifts, loads and stores of a tile
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _state_index(b64, offs_c, m_c, B, C, POOL_ALL: tl.constexpr, SC: tl.constexpr):
    """State fields are [B] (pooled) or [B, C]: (offsets, mask, entries per field)."""
    if POOL_ALL:
        offs_s = tl.arange(0, SC)
        return b64 + offs_s, offs_s >= 0, B
    else:  # B * C in int64 (b64 * 0 + B: B may be a constexpr 1): the M2 field starts past 2^31 at B*C >= 2^30
        return b64 * C + offs_c, m_c, (b64 * 0 + B) * C


@triton.jit
def _shift(x_ptr, b64, sxb, sxc, offs_c, C, length, sin_ptr, s_off, s_ok, NS, log2d, BLOCK_C: tl.constexpr,
           POOL_ALL: tl.constexpr, MODE: tl.constexpr, HAS_SIN: tl.constexpr):
    """K, [SC, 1]: frame 0's mean (pooled) or value (per channel), 0 if frame 0 is padding (and in FRAME,
    which shifts frame by frame: _frame_shift); or the incoming state's mean where the state still outweighs
    the sequence's frames at its last frame (decayed, in EMA, as they are). States are shifted by it in
    float64. A heavy state holds the running means near its own, and the backward's dL/dm_in is w_in times
    their small distance from it: taken from means relative to frame 0's, whose float32 rounding w_in
    multiplied, ccln's was 2 % off at w_in = 2e6. Where the state fades or is light, the means go to the data,
    and x - K would carry the state's distance from it: frame 0's shift stays (a heavy EMA state that faded
    over 128 frames, 1e4 from the data, put y 1e-5 off; one 300 away and light, 3x its error)."""
    if POOL_ALL:  # 4 chunks of channels per load, as one wait; a scalar sum, whose layout nothing follows.
        # In float64, where it is exact (C float32 values of like size) in any order: the backward recomputes
        # K in its own chunks, and a float32 sum's rounding differed with BLOCK_C (dx 4e-4 off at DC 1e5)
        ks = tl.zeros([], tl.float64)
        for c0 in range(0, C if MODE != 0 else 0, 4 * BLOCK_C):
            cc = offs_c[:, None] + c0 + BLOCK_C * tl.arange(0, 4)[None, :]
            ok = (cc < C) & (tl.zeros([1, 1], tl.int32) < length)
            ks += tl.sum(tl.load(x_ptr + b64 * sxb + cc.to(tl.int64) * sxc, mask=ok, other=0.0).to(tl.float64))
        K = tl.zeros([1, 1], tl.float32) + (ks / C).to(tl.float32)
    elif MODE == 0:
        K = tl.zeros([BLOCK_C, 1], tl.float32)
    else:
        ok = (offs_c < C) & (tl.zeros_like(offs_c) < length)
        K = tl.load(x_ptr + b64 * sxb + offs_c.to(tl.int64) * sxc, mask=ok, other=0.0).to(tl.float32)[:, None]
    if HAS_SIN and MODE != 0:
        # at frame length - 1 the state weighs w_in d^length, the frames n0 (1 - d^length) / (1 - d)
        d_all = tl.exp2(log2d * length)
        w_end = tl.load(sin_ptr + s_off, mask=s_ok, other=0.0).to(tl.float32) * d_all
        m_in = tl.load(sin_ptr + NS + s_off, mask=s_ok, other=0.0).to(tl.float32)
        frames = length * 1.0
        if MODE == 2:
            one_d = 1.0 - tl.exp2(log2d)
            frames = tl.where(one_d > 0, (1.0 - d_all) / tl.maximum(one_d, 1e-30), frames)
        n0 = C * 1.0 if POOL_ALL else 1.0  # a frame's weight
        K = tl.where((w_end >= n0 * frames)[:, None], m_in[:, None], K)
    return K


@triton.jit
def _frame_shift(p, m_t, K, MODE: tl.constexpr):
    """The shift of a tile's frames: K, or in FRAME each frame's channel 0 ([1, BLOCK_T]; p holds their
    addresses), a value inside the frame's own spread."""
    if MODE == 0:
        return tl.load(p, mask=m_t[None, :], other=0.0).to(tl.float32)
    else:
        return K


@triton.jit
def _load_raw(p, sxc, c0, offs_c, C, m_t, HINT: tl.constexpr = 0):
    """Channels c0 + offs_c of a tile as float32 (0 outside the mask) and the mask. ``p`` holds the
    [1, BLOCK_T] addresses of channel 0; HINT is ONCE, AGAIN or 0 (none)."""
    msk = ((offs_c + c0) < C)[:, None] & m_t[None, :]
    pc = p + (offs_c + c0)[:, None] * sxc
    if HINT == AGAIN:
        v = tl.load(pc, mask=msk, other=0.0, eviction_policy="evict_last")
    elif HINT == ONCE:
        v = tl.load(pc, mask=msk, other=0.0, eviction_policy="evict_first")
    else:
        v = tl.load(pc, mask=msk, other=0.0)
    return v.to(tl.float32), msk


@triton.jit
def _load(p, sxc, c0, offs_c, C, m_t, K, HINT: tl.constexpr = 0):
    """_load_raw's values minus K, 0 outside the mask: (values, mask)."""
    v, msk = _load_raw(p, sxc, c0, offs_c, C, m_t, HINT)
    return tl.where(msk, v - K, 0.0), msk


@triton.jit
def _reread(k, CL, LEAN: tl.constexpr, BLOCK_C: tl.constexpr):
    """The k-th chunk a pooled backward tile reads again to write it: the chunk it read last first, the
    likeliest to still be in L2 (cln (16, 512, 16000) on the H200: 0.58 -> 0.60 of a copy in "b c t", 0.44 ->
    0.48 in "b t c"; the forward keeps its L2 hints' order: reversed, its lean bf16 "b c t" fell from 0.49
    to 0.41). Without LEAN the tile holds chunk 0 and reads the others (k from 1)."""
    FIRST: tl.constexpr = 0 if LEAN else 1
    return (tl.cdiv(CL, BLOCK_C) - 1 + FIRST - k) * BLOCK_C


@triton.jit
def _frame_mask(it, T, length, BLOCK_T: tl.constexpr):
    """The frames of tile ``it`` that hold data (none for a tile before the first)."""
    offs_t = it * BLOCK_T + tl.arange(0, BLOCK_T)
    return (offs_t >= 0) & (offs_t < T) & (offs_t < length)


@triton.jit
def _load_tile(base, st, sc, it, T, length, offs_c, C, K, BLOCK_T: tl.constexpr, HINT: tl.constexpr,
               SHIFT: tl.constexpr = True):
    """Tile ``it``'s first chunk of channels (values minus K, or as read without SHIFT; mask); nothing is read
    outside 0 .. NT - 1, so a strip can ask for the tile after its last (or before its first) while it
    computes this one."""
    offs_t = it * BLOCK_T + tl.arange(0, BLOCK_T)
    p = base + offs_t[None, :] * st
    if SHIFT:
        return _load(p, sc, 0, offs_c, C, _frame_mask(it, T, length, BLOCK_T), K, HINT)
    else:
        return _load_raw(p, sc, 0, offs_c, C, _frame_mask(it, T, length, BLOCK_T), HINT)


@triton.jit
def _store(p, syc, v, c0, offs_c, C, in_t, HINT: tl.constexpr):
    """Write channels c0 + offs_c of a tile; ``p`` holds the [1, BLOCK_T] addresses of channel 0."""
    msk = ((offs_c + c0) < C)[:, None] & in_t[None, :]
    pc = p + (offs_c + c0)[:, None] * syc
    if HINT == ONCE:
        tl.store(pc, v.to(p.dtype.element_ty), mask=msk, eviction_policy="evict_first")
    else:
        tl.store(pc, v.to(p.dtype.element_ty), mask=msk)


@triton.jit
def _write_y(py, syc, xk, msk, mean, r, c0, offs_c, C, in_t, w_ptr, b_ptr, HAS_W: tl.constexpr,
             HAS_B: tl.constexpr, HINT: tl.constexpr, PAD: tl.constexpr):
    """y = (x - mean) * rstd (* weight + bias) for channels c0 + offs_c; padding frames (PAD: lengths
    given; without them the store's mask is msk) get 0."""
    y = (xk - mean) * r
    if HAS_W:
        y = y * tl.load(w_ptr + c0 + offs_c, mask=(c0 + offs_c) < C, other=1.0).to(tl.float32)[:, None]
    if HAS_B:
        y = y + tl.load(b_ptr + c0 + offs_c, mask=(c0 + offs_c) < C, other=0.0).to(tl.float32)[:, None]
    if PAD:
        y = tl.where(msk, y, 0.0)
    _store(py, syc, y, c0, offs_c, C, in_t, HINT)


@triton.jit
def _gamma(w_ptr, c0, offs_c, C, HAS_W: tl.constexpr):
    """The affine weight of channels c0 + offs_c (1 without one)."""
    if HAS_W:
        return tl.load(w_ptr + c0 + offs_c, mask=(c0 + offs_c) < C, other=0.0).to(tl.float32)
    else:
        return tl.full(offs_c.shape, 1.0, tl.float32)


@triton.jit
def _write_gx(pgx, sdc, xk, msk, gy, mean, r, U, V, c0, offs_c, C, in_t, w_ptr, gwp_ptr, gbp_ptr, pgw,
              HAS_W: tl.constexpr, STORE_GW: tl.constexpr, PAD: tl.constexpr):
    """dL/dx of channels c0 + offs_c (0 at padding: PAD, as in _write_y) and their per-tile dweight, dbias
    partials."""
    g = gy * _gamma(w_ptr, c0, offs_c, C, HAS_W)[:, None]
    # the backward's reads and writes go unhinted: with the forward's hints, emaln's (2, 256, 64000) "b t c"
    # backward fell from 0.42 to 0.24 of a copy on the H200 (and cln's (16, 512, 16000) rose from 0.58 to 0.63)
    gx = g * r + U + xk * V
    if PAD:  # a padding frame's r may be inf (eps = 0)
        gx = tl.where(msk, gx, 0.0)
    _store(pgx, sdc, gx, c0, offs_c, C, in_t, 0)
    if STORE_GW:
        xhat = tl.where(msk, (xk - mean) * r, 0.0)
        m_c = (c0 + offs_c) < C
        tl.store(gwp_ptr + pgw + c0, tl.sum(gy * xhat, axis=1), mask=m_c)
        tl.store(gbp_ptr + pgw + c0, tl.sum(gy, axis=1), mask=m_c)


# ---------------------------------------------------------------------------------------------------
# States in and out
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _state_mean(sin_ptr, s_off, s_ok, NS, K):
    """The incoming state's mean relative to K, [SC]: the difference taken in float64."""
    m64 = tl.load(sin_ptr + NS + s_off, mask=s_ok, other=0.0)
    return (m64 - tl.sum(K, axis=1).to(tl.float64)).to(tl.float32)


@triton.jit
def _with_state(pw, pm, pq, iw, im, iq, t0, log2d, HAS_SIN: tl.constexpr):
    """A tile's prefix of the sequence's frames before t0 with the incoming state (iw, im, iq) merged in, [SC]
    each: the state has decayed by d^t0."""
    if HAS_SIN:
        pw, pm, pq, _d = merge(iw, im, iq, 1.0, pw, pm, pq, tl.exp2(log2d * t0.to(tl.float32)))
    return pw, pm, pq


@triton.jit
def _own_end(fn, fm, fq, pw, pm, pq, k, log2d, BLOCK_T: tl.constexpr):
    """The statistics of a sequence's frames alone at frame t0 + k of a tile, [SC] each: the prefix (pw, pm, pq)
    of the frames before t0 merged with the tile's frames 0..k, whose (n, mean, M2) are fn, fm, fq. Frame tau
    weighs d^(k - tau), at most 1: two passes over the tile, in float32."""
    ts = tl.arange(0, BLOCK_T)[None, :]
    dk = tl.where(ts <= k, tl.exp2(log2d * (k - ts).to(tl.float32)), 0.0)
    g = dk * fn
    w = tl.sum(g + tl.zeros_like(fm), axis=1)
    mean = tl.sum(g * fm, axis=1) / tl.where(w > 0, w, 1.0)
    dev = fm - mean[:, None]
    q = tl.sum(g * dev * dev + dk * fq, axis=1)
    ow, om, oq, _d = merge(pw, pm, pq, 1.0, w, mean, q, tl.exp2(log2d * (k + 1).to(tl.float32)))
    return ow, om, oq


@triton.jit
def _store_state(sout_ptr, s_off, s_ok, NS, w, m, q):
    """The outgoing state's fields, [SC] each, in float64 (m already is)."""
    tl.store(sout_ptr + s_off, w.to(tl.float64), mask=s_ok)
    tl.store(sout_ptr + NS + s_off, m, mask=s_ok)
    # M2 = Q - S mu may round below 0: the next call refuses a negative state.m2
    tl.store(sout_ptr + 2 * NS + s_off, _at_least(q.to(tl.float64), 0.0), mask=s_ok)


@triton.jit
def _state_out(sin_ptr, s_off, s_ok, NS, ow, om, oq, length, log2d, log2d_lo):
    """The outgoing state in float64, [SC] each: the incoming state merged with the summary (ow, om, oq) of the
    frames 0 .. length - 1 alone (om a float64 mean, shift added back). A float32 merge rounded the state each
    call, which an EMA keeps for 1 / (1 - d) calls: emaln at d = 0.999 in one-frame chunks was 1e-5 off.
    d^length takes log2(d) as its float32 value plus log2d_lo, the rest: a CUDA launch passes a float as
    float32, whose rounding put d^length 5e-10 off at 12 frames, the same way on every call."""
    l2d = (tl.zeros_like(ow) + log2d).to(tl.float64) + log2d_lo  # float32 in the interpreter too
    w, m, q, _d = merge(tl.load(sin_ptr + s_off, mask=s_ok, other=0.0), tl.load(sin_ptr + NS + s_off, mask=s_ok,
                        other=0.0), tl.load(sin_ptr + 2 * NS + s_off, mask=s_ok, other=0.0), 1.0,
                        ow.to(tl.float64), om, oq.to(tl.float64), tl.exp2(l2d * length))
    return w, m, q


# ---------------------------------------------------------------------------------------------------
# Statistics of frames and tiles: counts, local sums, per-channel walks, moments, rstd
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _count(msk, m_t, c0, C, BLOCK_C: tl.constexpr, POOL_ALL: tl.constexpr):
    """The valid values of each frame of channels c0 .. c0 + BLOCK_C - 1, [SC, BLOCK_T]: pooled, counted
    from the bounds rather than by a reduction over the channels."""
    if POOL_ALL:
        return tl.where(m_t, tl.minimum(C - c0, BLOCK_C), 0).to(tl.float32)[None, :]
    else:
        return msk.to(tl.float32)


@triton.jit
def _frame_stats(xk, msk, m_t, c0, C, BLOCK_C: tl.constexpr, POOL_ALL: tl.constexpr):
    """f_t = (n, m_f, M2_f) of each frame, [SC, BLOCK_T]; padding frames weigh 0."""
    if POOL_ALL:
        fn = _count(msk, m_t, c0, C, BLOCK_C, POOL_ALL)
        fm = _group_sum(xk, POOL_ALL) / tl.where(fn > 0, fn, 1.0)
        dev = tl.where(msk, xk - fm, 0.0)
        return fn, fm, _group_sum(dev * dev, POOL_ALL)
    else:  # a frame of one channel is one value (xk is 0 at padding)
        return msk.to(tl.float32), xk, tl.zeros(xk.shape, tl.float32)


@triton.jit
def _tile_frames(xk, msk, px, sxc, offs_c, C, m_t, K, CL, BLOCK_C: tl.constexpr, POOL_ALL: tl.constexpr,
                 STAGES: tl.constexpr):
    """The frames' (n, mean, M2) of a tile whose first chunk of channels (xk, msk) is loaded: its other chunks
    (pooled) are read and merged in, and stay in L2 to be read again."""
    sw, sm, sq = _frame_stats(xk, msk, m_t, 0, C, BLOCK_C, POOL_ALL)
    for c0 in tl.range(BLOCK_C, CL, BLOCK_C, num_stages=STAGES):
        xc, mc = _load(px, sxc, c0, offs_c, C, m_t, K, AGAIN)
        cw_, cm_, cq_ = _frame_stats(xc, mc, m_t, c0, C, BLOCK_C, POOL_ALL)
        sw, sm, sq, _d = merge(sw, sm, sq, 1.0, cw_, cm_, cq_, 1.0)
    return sw, sm, sq


@triton.jit
def _frame_weight(fn, m_t, POOL_ALL: tl.constexpr):
    """Each frame's weight as [1, BLOCK_T]: its count of valid values (pooled), or 1 at a valid frame
    (per channel, the same for every channel)."""
    if POOL_ALL:
        return fn
    else:
        return m_t[None, :].to(tl.float32)


@triton.jit
def _valid_frames(t0, T, length, BLOCK_T: tl.constexpr):
    """How many frames of the tile starting at t0 are valid (they are a prefix of it): from the bounds, not
    by a reduction over the tile (ccln's walk: 30 instructions and 3 barriers a step)."""
    return tl.minimum(tl.maximum(tl.minimum(T, length) - t0, 0), BLOCK_T)


@triton.jit
def _local_sums(n, fm, fq, log2d, nv, BLOCK_T: tl.constexpr, SC: tl.constexpr, POOL_ALL: tl.constexpr,
                MODE: tl.constexpr):
    """Running sums of a tile's frames from its first one, D = d^(t+1) (the decay of an incoming prefix), a
    shift L and the tile's aggregate (w, mean, M2) in float32: (W, S1, S2, D, L, aw, am, aq), for _with_prefix.

    Pooled and EMA: float64 sums of the K-shifted values, W = sum d^(t-tau) n, S1 = sum d^(t-tau) n m,
    S2 = sum d^(t-tau) (M2 + n m^2) over the frames' (n, m, M2) ([1, BLOCK_T] pooled, [SC, BLOCK_T] per
    channel, where ``n`` is [1, BLOCK_T]): a scan of additions, where a scan of Chan merges costs a division
    per step. Per-channel CUMULATIVE (CHAN) look-back tiles (walks and the backward know their prefix first:
    _chan_frames): float32 count and sums of x - L over frames 0..t, L the tile's first value; as L is
    one of the values, sum (x - L)^2 is at most (1 + n) times M2 (n frames), so M2 from these sums loses at
    most log2(1 + BLOCK_T) bits, and no float64 runs per element."""
    ts = tl.arange(0, BLOCK_T)[None, :]
    D = 1.0  # CUMULATIVE: nothing decays
    if MODE == 2:
        D = tl.exp2(log2d * (ts + 1).to(tl.float32))
    d = tl.exp2(log2d)
    m = fm.to(tl.float64)
    if POOL_ALL:
        s1 = n.to(tl.float64) * m
        w, s1, s2, _d = _scan(n.to(tl.float64), s1, fq.to(tl.float64) + s1 * m,
                              d + tl.zeros([SC, BLOCK_T], tl.float32), BLOCK_T, SC, 1, True, False)
    elif MODE == 1:  # the nv valid frames are a prefix of the tile: W counts them (no scan, no layout change)
        w = (tl.minimum(ts + 1, nv) + tl.zeros([SC, BLOCK_T], tl.int32)).to(tl.float32)  # [SC, ...]: no
        # layout conversion of a [1, BLOCK_T] tensor on the way
        L = _pick(fm, ts == 0)
        u = tl.where(n > 0, fm - L[:, None], 0.0)
        s1, s2 = _cumsum(u, BLOCK_T, SC, False), _cumsum(u * u, BLOCK_T, SC, False)
        # the tile's totals as plain sums (a pick of the last frame costs a select per element)
        a1, a2 = tl.sum(u, axis=1), tl.sum(u * u, axis=1)
        nvf = nv.to(tl.float32) + tl.zeros([SC], tl.float32)
        ainv = 1.0 / tl.maximum(nvf, 1.0)
        return w, s1, s2, D, L[:, None], nvf, L + a1 * ainv, _at_least(a2 - a1 * a1 * ainv, 0.0)
    else:  # m is 0 at padding
        w, s1, s2, _d = _scan(n.to(tl.float64) + tl.zeros([SC, BLOCK_T], tl.float64), m, m * m,
                              d + tl.zeros([SC, BLOCK_T], tl.float32), BLOCK_T, SC, 1, True, False)
    is_last = (ts == BLOCK_T - 1)
    aw, am, aq, _v, _r = _moments(_pick(w + tl.zeros([SC, BLOCK_T], tl.float64), is_last), _pick(s1, is_last),
                                  _pick(s2, is_last))
    return w, s1, s2, D, tl.zeros([SC, 1], tl.float32), aw, am, aq


@triton.jit
def _at_least(v, lo):
    """max(v, lo) that keeps a NaN, as torch's clamp does (PTX's max returns the other operand): a NaN in x or
    in a state gives NaN statistics, not a variance of 0 and finite garbage."""
    return tl.maximum(v, lo, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _recip(w):
    """1 / w for w >= 0 (0 gives a finite 2^127, which multiplies the zero sums of an empty prefix and tile):
    rsqrt squared (2 ulp each) and a Newton step, which leaves about 1 ulp, where Triton's division (2 ulp)
    first scales its argument into range: 5 instructions against 10 with the select that kept w = 0 out
    (compile_check, ccln's walk and backward, loop instructions a tile: "b c t" fp32 253 -> 232 and 423 ->
    396, "b t c" 1251 -> 1094 and 2008 -> 1854)."""
    r = tl.math.rsqrt(tl.maximum(w, 1.1754944e-38))
    r = r * r
    return r + r * (1.0 - w * r)


@triton.jit
def _chan_frames(x, n, nv, pw, pm, pq, first, log2d, LIGHT: tl.constexpr, BLOCK_T: tl.constexpr, SC: tl.constexpr,
                 MODE: tl.constexpr = 1, ca_w=0.0, ca_m=0.0, AGG_SHIFT: tl.constexpr = False):
    """Per-channel running statistics (CUMULATIVE, or EMA32's EMA) of every frame of a tile whose incoming
    prefix (pw, pm, pq) [SC] is known (a walk's carry, or the prefix the forward saved for the backward):
    (w, mean, M2, var, 1/w) [SC, BLOCK_T] and the tile's aggregate (aw, am, aq) [SC]. Float32 running sums
    S1, S2 of x - s, s the prefix's mean (0 for an empty prefix: x is shifted by its sequence's first frame),
    give in closed form Chan's merge of the prefix with frames 0..t (k of them): W = pw + k, mean = s + S1 / W,
    M2 = pq + S2 - S1^2 / W; S2 - S1^2 / W loses at most log2(1 + k / pw) bits, as _local_sums' shift does with
    log2(1 + k) (frames from the tile's first value). Against _local_sums and _with_prefix, half the
    arithmetic a frame (ccln's walk: 13 instructions an element less) and no select.
    EMA: frame tau weighs d^(t - tau) at frame t and the prefix d^(t + 1); the sums are d^t times running
    sums of d^-tau (x_tau - s), d^-tau at most 4 (the launcher sets EMA32 where d^BLOCK_T >= 1/4), so the
    prefix keeps a quarter of its weight over the tile and the bound above holds with k / pw at most four times
    larger; where the EMA forgets faster, the float64 sums of _local_sums run instead.
    LIGHT (an incoming state): a sequence's first tile (``first``) has the state as its prefix, which may
    weigh less than the tile's frames; one far from the data lost up to 17 bits (w_in = 1e-3, 1e3 away: y and
    dx 1e-2 off). There s is 0 (frame 0's value) and e = pm - s enters as a frame of weight pw: mean = s +
    (pw e + S1) / W, M2 = pq + pw e^2 + S2 - (pw e + S1)^2 / W: pw e^2 cancels down to pw k e^2 / W, less than
    a bit when pw < k.
    AGG_SHIFT (a walk with an incoming state): the tile's aggregate, which joins the carry of the frames alone
    (ca_w, ca_m), takes its sums of x - sa, sa that carry's mean (the tile's first frame where it is empty),
    rather than of x - s: s, the mean of the state merged in, may sit far from the data (a state of weight 6e6, 1e4 away: the aggregates' M2 a2 - a1 am lost 17 bits
    and the carry's M2 was 40 off where it is 5, dx 5e-5 off on the H100).
    No branch: a runtime one, compiled into every tile, cost ccln's "b t c" backward 30-45 % on the H200."""
    ts = tl.arange(0, BLOCK_T)[None, :]
    nvf = nv.to(tl.float32) + tl.zeros([SC], tl.float32)
    s = tl.where(pw > 0, pm, 0.0)
    if LIGHT:
        s = tl.where(first & (pw < nvf), 0.0, s)
    u = tl.where(n > 0, x - s[:, None], 0.0)
    if AGG_SHIFT:
        sa = tl.where(ca_w > 0, ca_m, tl.sum(tl.where(ts == 0, x, 0.0), axis=1))
        v = tl.where(n > 0, x - sa[:, None], 0.0)
    if MODE == 2:
        up = tl.exp2(-log2d * ts.to(tl.float32))  # d^-t
        dn = tl.exp2(log2d * ts.to(tl.float32))  # d^t
        D = dn * tl.exp2(log2d)  # the prefix's decay at frame t
        uu = u * up
        qq = u * uu
        s1, s2 = _cumsum(uu, BLOCK_T, SC, False) * dn, _cumsum(qq, BLOCK_T, SC, False) * dn
        # the frames' weight 1 + d + ... + d^t, the same in every tile: past its valid frames too, where it is
        # too large, but only padding follows them (a per-element scan of the valid frames cost 13 % more
        # instructions in ccemaln's "b c t" walk)
        g = _cumsum(dn, BLOCK_T, 1, False)
        w = pw[:, None] * D + g
        dl = tl.exp2(log2d * (BLOCK_T - 1))  # the tile's totals, seen from its last frame
        aw = tl.where(nvf > 0, tl.sum(dn), 0.0)  # (a tile of no valid frame weighs nothing)
        if AGG_SHIFT:
            vv = v * up
            a1, a2 = tl.sum(vv, axis=1) * dl, tl.sum(v * vv, axis=1) * dl
        else:
            a1, a2 = tl.sum(uu, axis=1) * dl, tl.sum(qq, axis=1) * dl
    else:
        D = 1.0
        s1, s2 = _cumsum(u, BLOCK_T, SC, False), _cumsum(u * u, BLOCK_T, SC, False)
        w = pw[:, None] + (tl.minimum(ts + 1, nv) + tl.zeros([SC, BLOCK_T], tl.int32)).to(tl.float32)
        if AGG_SHIFT:
            a1, a2 = tl.sum(v, axis=1), tl.sum(v * v, axis=1)
        else:
            a1, a2 = tl.sum(u, axis=1), tl.sum(u * u, axis=1)  # the tile's totals as plain sums, as _local_sums
        aw = nvf
    rw = _recip(w)
    c = pq[:, None] * D
    if LIGHT:
        e = pm - s  # 0 but where a light state was shifted away
        s1 = s1 + (pw * e)[:, None] * D
        c = c + (pw * e * e)[:, None] * D
    a = s1 * rw
    m2 = _at_least(c + s2 - s1 * a, 0.0)
    am = a1 / tl.where(aw > 0, aw, 1.0)
    return w, s[:, None] + a, m2, m2 * rw, rw, aw, (sa if AGG_SHIFT else s) + am, _at_least(a2 - a1 * am, 0.0), s, a


@triton.jit
def _moments(w, s1, s2):
    """Float64 sums (W, S1, S2) -> float32 (w, mean, M2, var, 1/w). 1/W: float32, then a float64 Newton
    step."""
    wf = w.to(tl.float32)
    # as _recip; a valid frame has w >= 1 (it weighs 1 itself); only past a sequence's end can an EMA weight
    # decay below the smallest normal float, where the clamp leaves 1/W wrong, and those frames are padding
    r = tl.math.rsqrt(tl.maximum(wf, 1.1754944e-38))
    inv = (r * r).to(tl.float64)
    inv = inv * (2.0 - w * inv)  # where w is 0, so are the sums: mean and M2 come out 0
    mean = s1 * inv
    m2 = s2 - s1 * mean
    return wf, mean.to(tl.float32), m2.to(tl.float32), (m2 * inv).to(tl.float32), inv.to(tl.float32)


@triton.jit
def _with_prefix(lw, l1, l2, D, L, pw, pm, pq, CHAN: tl.constexpr):
    """(w, mean, M2, var, 1/w) at every frame: _local_sums' sums with the tile's incoming prefix [SC]
    decayed in (CHAN: the frames' own (mean, M2) from their sums, then Chan's merge, in float32; one
    reciprocal, of n w, gives both 1/n and 1/w)."""
    if CHAN:
        w0 = pw[:, None] * D
        w = w0 + lw
        n1 = tl.maximum(lw, 1.0)
        w1 = tl.where(w > 0, w, 1.0)
        r = 1.0 / (n1 * w1)
        rw = n1 * r
        a = l1 * (w1 * r)  # the frames' mean - L
        l2 = _at_least(l2 - l1 * a, 0.0)
        f = lw * rw
        l1 = L + a
        delta = l1 - pm[:, None]
        m2 = pq[:, None] * D + l2 + w0 * f * delta * delta
        mean = tl.where(w0 >= lw, pm[:, None] + delta * f, l1 - delta * (w0 * rw))  # from the heavier side,
        return w, mean, m2, m2 * rw, rw  # as in merge: an empty prefix (any mean) leaves l1 exact
    w0 = pw.to(tl.float64)[:, None]
    m0 = pm.to(tl.float64)[:, None]
    return _moments(lw + w0 * D, l1 + w0 * m0 * D, l2 + (pq.to(tl.float64)[:, None] + w0 * m0 * m0) * D)


@triton.jit
def _tile_sum(v, POOL_ALL: tl.constexpr):
    """[BLOCK_C, BLOCK_T] -> [SC]: sum over the tile's frames (and channels, when pooled)."""
    return tl.sum(_group_sum(v, POOL_ALL), axis=1)


@triton.jit
def _rstd(var, eps, EPS_OUTSIDE: tl.constexpr):
    if EPS_OUTSIDE:  # sqrt of at least the smallest normal float, so that eps = 0 gives no 0 * inf
        return 1.0 / (tl.sqrt(_at_least(var, 1.1754944e-38)) + eps)
    else:
        return tl.math.rsqrt(_at_least(var, 0.0) + eps)


@triton.jit
def _one_value(r, w, t0, MODE: tl.constexpr, LONE: tl.constexpr):
    """r, but 1 where a statistic holds one value (weight w <= 1: frame 0 with no incoming state or one of
    weight 0, per channel or over one channel; in FRAME, a frame of one channel). That value is its own mean,
    so it normalizes to exactly 0 whatever r is, and nothing can move it off 0; r = 1 keeps the backward's
    terms there at the scale of dy, where terms of 1/sqrt(eps) cancelled in float32 (ccln with eps outside: dx
    off by 20 %; with an empty incoming state, 100 %) and eps = 0 gave 0 * inf. Only tile 0 can hold one. (A
    state's weight gets no gradient, or r would reach it here: the launcher zeroes it. A state of weight below
    2^-24 / decay also passes for empty: y at frame 0 then moves by at most 2.4e-4.)
    LONE (per channel, or C = 1) compiles the check in: a pooled tile of more channels cannot hold one, and
    the check took its bf16 "b t c" forward from 96 to 116 registers (327 -> 407 µs at (16, 512, 16000))."""
    if not LONE:
        return r
    one = t0 == 0
    if MODE == 0:
        one = t0 >= 0
    if one:
        r = tl.where(w > 1, r, 1.0)
    return r


@triton.jit
def _multiple(v, A: tl.constexpr):
    """v, which the launcher found to be a multiple of A, in a form the compiler knows to be one."""
    if A > 1:
        v = v // A * A
    return v


@triton.jit
def _wide(v, WIDE: tl.constexpr):
    """A stride of a tile's per-element offsets, in int64 where one sequence spans 2^31 elements or more (WIDE,
    the launcher's vec_for); else as passed, int32, whose offsets cost an instruction an address where int64's
    cost three or four: unaligned rows load one element at a time, each from its own offset (cln (4, 512, 3999)
    fp32, static: forward 2.70 -> 2.18 warp-instructions an element and no spill, backward 4.82 -> 4.02 and
    252 -> 168 registers)."""
    if WIDE:  # one return: Triton types both returns of a function, taken or not
        v = v + tl.zeros([], tl.int64)
    return v


@triton.jit
def _welford(p, sxc, offs_c, C, m_t, K, k, sm, sq, MASKED: tl.constexpr):
    """Welford's update of each slot's (mean - K, M2) with its value in the tile at ``p`` (the k-th it takes):
    every slot of a full tile is valid (a row past C updates only itself, and weighs 0 in the end)."""
    v, msk = _load_raw(p, sxc, 0, offs_c, C, m_t)
    d = v - K - sm
    mn = sm + d * (1.0 / (k + 1.0))
    q = sq + d * (v - K - mn)
    if MASKED:
        return tl.where(msk, mn, sm), tl.where(msk, q, sq)
    return mn, q


@triton.jit
def _slot_sums(xb, sxt, sxc, offs_c, C, T, length, K, tile0, n_sum, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
               WALK_STAGES: tl.constexpr):
    """Per-channel GLOBAL statistics (w, mean - K, M2) [BLOCK_C] of tiles tile0 .. tile0 + n_sum - 1: each
    (channel, frame) slot of the [BLOCK_C, BLOCK_T] tile runs Welford's update over its values, a tile at a
    time, and Chan's merge joins the slots once at the end. Valid frames are a prefix, so the full tiles come
    first and take no mask, and a slot's count is the number of tiles its frame is valid in. A two-pass mean
    and M2 per tile, merged into a running summary, cost two reductions over each tile (instln "b t c"
    bf16 (16, 512, 16000), Triton 3.6: 921 -> 337 instructions a warp and tile, 168 -> 96 registers)."""
    sm = tl.zeros([BLOCK_C, BLOCK_T], tl.float32)
    sq = tl.zeros([BLOCK_C, BLOCK_T], tl.float32)
    frames = tl.maximum(tl.minimum(T, length) - tile0 * BLOCK_T, 0)  # valid frames from tile0 on
    n_full = tl.minimum(frames // BLOCK_T, n_sum)
    for k in tl.range(n_full, num_stages=WALK_STAGES):
        offs_t = (tile0 + k) * BLOCK_T + tl.arange(0, BLOCK_T)
        sm, sq = _welford(xb + offs_t[None, :] * sxt, sxc, offs_c, C, offs_t >= 0, K, k, sm, sq, False)
    if n_full < n_sum:  # the tile that holds the last valid frame, if any
        offs_t = (tile0 + n_full) * BLOCK_T + tl.arange(0, BLOCK_T)
        m_t = (offs_t < T) & (offs_t < length)
        sm, sq = _welford(xb + offs_t[None, :] * sxt, sxc, offs_c, C, m_t, K, n_full, sm, sq, True)
    kv = tl.minimum(tl.cdiv(tl.maximum(frames - tl.arange(0, BLOCK_T), 0), BLOCK_T), n_sum)  # tiles valid a slot
    w = (kv[None, :] * (offs_c < C).to(tl.int32)[:, None]).to(tl.float32)
    w, sm, sq, _d = tl.reduce((w, sm, sq, tl.full([BLOCK_C, BLOCK_T], 1.0, tl.float32)), 1, merge)
    return w, sm, sq


# ---------------------------------------------------------------------------------------------------
# Tile order
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _span_sums(xb, sxt, sxc, offs_c, C, T, length, K, s, span_len, n_sum, d_tile, log2d, CL, BLOCK_C: tl.constexpr,
               BLOCK_T: tl.constexpr, SC: tl.constexpr, POOL_ALL: tl.constexpr, MODE: tl.constexpr,
               WALK_STAGES: tl.constexpr):
    """Welford's summary (w, mean, M2; [SC] each, relative to K) of n_sum tiles from tile s * span_len: a span of
    GLOBAL, a segment of SEG (EMA: each frame weighs d^(frames after it)), or a strip's whole sequence."""
    gw = tl.zeros([SC], dtype=tl.float32)
    gm = tl.zeros([SC], dtype=tl.float32)
    gq = tl.zeros([SC], dtype=tl.float32)
    fw = 1.0
    if MODE == 2:
        fw = tl.exp2(log2d * (BLOCK_T - 1 - tl.arange(0, BLOCK_T)).to(tl.float32))[None, :]
    if MODE == 3 and not POOL_ALL:  # instln: each slot of the tile keeps its own Welford sums (pooled "b c t"
        # tiles sum their channels within a thread: there the slots took 9 % more instructions)
        gw, gm, gq = _slot_sums(xb, sxt, sxc, offs_c, C, T, length, K, s * span_len, n_sum, BLOCK_C, BLOCK_T,
                                WALK_STAGES)
    else:
        for k in tl.range(n_sum, num_stages=WALK_STAGES):
            offs_t = (s * span_len + k) * BLOCK_T + tl.arange(0, BLOCK_T)
            m_t = (offs_t < T) & (offs_t < length)
            for c0 in range(0, CL, BLOCK_C):
                xk, msk = _load(xb + offs_t[None, :] * sxt, sxc, c0, offs_c, C, m_t, K)
                n = tl.sum(_count(msk, m_t, c0, C, BLOCK_C, POOL_ALL) * fw, axis=1)
                mk = _tile_sum(xk * fw, POOL_ALL) / tl.where(n > 0, n, 1.0)
                dev = tl.where(msk, xk - mk[:, None], 0.0)
                # the tile's first chunk brings the decay of the tiles before it; its other chunks, none
                gw, gm, gq, _gd = merge(gw, gm, gq, 1.0, n, mk, _tile_sum(dev * dev * fw, POOL_ALL),
                                       tl.where(c0 == 0, d_tile, 1.0))
    return gw, gm, gq


@triton.jit
def _grad_sums(xb, sxt, sxc, gyb, sgt, sgc, w_ptr, offs_c, C, T, length, K, mean1, r1, s, span_len, n_sum, CL,
               HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, SC: tl.constexpr,
               POOL_ALL: tl.constexpr, WALK_STAGES: tl.constexpr):
    """GLOBAL's backward: A = sum(g) and Bt = sum(g * xhat) over n_sum tiles from tile s * span_len, [SC] each.
    Per channel, each slot of the tile sums its own values, reduced once after the loop, not twice a tile
    (instln "b t c" bf16: 565 -> 431 instructions a warp and tile); pooled tiles reduce each tile (slots of
    [128, 64] took 255 registers and spilled)."""
    SLOTS: tl.constexpr = not POOL_ALL
    sa = tl.zeros([BLOCK_C, BLOCK_T] if SLOTS else [SC], dtype=tl.float32)
    sb = tl.zeros([BLOCK_C, BLOCK_T] if SLOTS else [SC], dtype=tl.float32)
    for k in tl.range(n_sum, num_stages=WALK_STAGES):
        offs_t = (s * span_len + k) * BLOCK_T + tl.arange(0, BLOCK_T)
        m_t = (offs_t < T) & (offs_t < length)
        for c0 in range(0, CL, BLOCK_C):
            xk, msk = _load(xb + offs_t[None, :] * sxt, sxc, c0, offs_c, C, m_t, K)
            g, _m = _load_raw(gyb + offs_t[None, :] * sgt, sgc, c0, offs_c, C, m_t)
            g = g * _gamma(w_ptr, c0, offs_c, C, HAS_W)[:, None]
            xhat = tl.where(msk, (xk - mean1[:, None]) * r1[:, None], 0.0)
            if SLOTS:
                sa += g
                sb += g * xhat
            else:
                sa += _tile_sum(g, POOL_ALL)
                sb += _tile_sum(g * xhat, POOL_ALL)
    if SLOTS:
        sa, sb = _tile_sum(sa, POOL_ALL), _tile_sum(sb, POOL_ALL)
    return sa, sb


@triton.jit
def _tile(ctr_ptr, len_ptr, B, C, T, NCB, NT, NSPAN, MODE: tl.constexpr, POOL_ALL: tl.constexpr,
          HAS_LEN: tl.constexpr, BLOCK_C: tl.constexpr, SC: tl.constexpr, REVERSE: tl.constexpr,
          STRIP: tl.constexpr, PHASE: tl.constexpr):
    """Which tile this program owns and what every tile needs first: (it, vt, seq, tag, b64, offs_c, m_c,
    offs_s, length, s_off, s_ok, NS, CL, span). A pooled tile spans all C channels and is visited in chunks of
    BLOCK_C, c0 in range(0, CL, BLOCK_C); a per-channel tile is one chunk (CL = BLOCK_C). Look-back modes take tile-major tickets (tile i of every
    sequence before tile i + 1 of any; REVERSE hands them out from the end, vt counting from there);
    other modes a 1D grid in the same order (a second grid dim stops at 65535). GLOBAL in one launch (PHASE 3)
    takes tickets too: the first B * NCB * NSPAN sum a span each (``span`` true; vt is the span), the others
    own a tile, and wait only for programs that started before them."""
    tag = 0
    span = tl.program_id(0) < 0  # false: not a span's program
    if (MODE == 1 or MODE == 2) and not STRIP:
        tile_id, tag = _ticket(ctr_ptr, B * NCB * NT)
    elif PHASE == 3:
        tile_id, tag = _ticket(ctr_ptr, B * NCB * (NSPAN + NT))
        span = tile_id < B * NCB * NSPAN
        tile_id = tl.where(span, tile_id, tile_id - B * NCB * NSPAN)
    else:  # STRIP: one program per sequence, starting at vt = 0
        tile_id = tl.program_id(0)
    vt = tile_id // (B * NCB)
    it = vt
    if REVERSE and (MODE == 1 or MODE == 2):
        it = NT - 1 - vt
    seq = tile_id % (B * NCB)
    b64 = (seq // NCB).to(tl.int64)
    offs_c = (seq % NCB) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = offs_c < C
    length = T
    if HAS_LEN:
        length = tl.load(len_ptr + b64).to(tl.int32)
    s_off, s_ok, NS = _state_index(b64, offs_c, m_c, B, C, POOL_ALL, SC)
    CL = BLOCK_C
    if POOL_ALL:
        CL = C
    return it, vt, seq, tag, b64, offs_c, m_c, tl.arange(0, SC), length, s_off, s_ok, NS, CL, span


# ---------------------------------------------------------------------------------------------------
# The forward kernel
# ---------------------------------------------------------------------------------------------------
@triton.jit
def running_norm_fwd(
    x_ptr,  # [B, C, T] (strides sxb, sxc, sxt)
    y_ptr,  # [B, C, T] (strides syb, syc, syt)
    w_ptr,  # [C] affine weight
    b_ptr,  # [C] affine bias
    len_ptr,  # [B] int64 lengths
    sin_ptr,  # [3, B, C or 1] float64 incoming state (w, m, M2)
    sout_ptr,  # [3, B, C or 1] float64 outgoing state
    pre_ptr,  # [B * NCB, NT, 3, SC] float32: each tile's incoming prefix of the frames alone (GLOBAL: the totals)
    ws_ptr,  # int64 look-back records [B * NCB, NT, 6, SC], or float32 GLOBAL span summaries
    ctr_ptr,  # [1] int64 ticket counter (epoch << 32 | ticket); CTR_IN_WS: ws_ptr's word after the records
    sxb, sxc, sxt, syb, syc, syt,
    B, C, T, NCB, NT, NSPAN,
    log2d, eps,
    log2d_lo,  # log2(decay) less its float32 value: _state_out's d^length in float64
    POOL_ALL: tl.constexpr, MODE: tl.constexpr, PHASE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_LEN: tl.constexpr, HAS_SIN: tl.constexpr,
    STORE_SOUT: tl.constexpr, STORE_PREFIX: tl.constexpr, EPS_OUTSIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, SPAN: tl.constexpr, WINDOW: tl.constexpr,
    DETERMINISTIC: tl.constexpr = False, AGG_ONLY: tl.constexpr = False, STRIP: tl.constexpr = False,
    HOLD: tl.constexpr = True, VEC_T: tl.constexpr = 1, VEC_C: tl.constexpr = 1, SEG: tl.constexpr = False,
    SCANNED: tl.constexpr = False, LONE: tl.constexpr = True, STAGES: tl.constexpr = 1,
    WALK_STAGES: tl.constexpr = 1, EMA32: tl.constexpr = False, WIDE: tl.constexpr = True,
    CTR_IN_WS: tl.constexpr = False,
):
    log2d, eps, log2d_lo = _f32(log2d), _f32(eps), _f32(log2d_lo)
    SC: tl.constexpr = 1 if POOL_ALL else BLOCK_C  # statistics per frame: one, or one per channel
    if CTR_IN_WS:  # the ops' launches: the ticket counter is the word after the records (one buffer to zero)
        ctr_ptr = ws_ptr + (tl.zeros([], tl.int64) + B) * NCB * NT * (6 * SC)
    CHAN: tl.constexpr = not POOL_ALL and MODE == 1  # _local_sums' float32 summaries
    SOUT64: tl.constexpr = STORE_SOUT and HAS_SIN and (MODE == 1 or MODE == 2)
    T, sxc, syc = _multiple(T, VEC_T), _multiple(sxc, VEC_T), _multiple(syc, VEC_T)  # see VEC below
    C, sxt, syt = _multiple(C, VEC_C), _multiple(sxt, VEC_C), _multiple(syt, VEC_C)
    sxc, syc, sxt, syt = _wide(sxc, WIDE), _wide(syc, WIDE), _wide(sxt, WIDE), _wide(syt, WIDE)
    sxb, syb = _multiple(sxb, VEC_T * VEC_C), _multiple(syb, VEC_T * VEC_C)
    it0, _vt, seq, tag, b64, offs_c, m_c, offs_s, length, s_off, s_ok, NS, CL, span = _tile(
        ctr_ptr, len_ptr, B, C, T, NCB, NT, NSPAN, MODE, POOL_ALL, HAS_LEN, BLOCK_C, SC, False, STRIP, PHASE)
    xb = x_ptr + b64 * sxb
    EARLY: tl.constexpr = (MODE == 1 or MODE == 2) and not STRIP  # a look-back tile reads its first chunk
    # a pooled tile holds its first chunk (a look-back tile: through the look-back), or (LEAN) reads it again to
    # write it; the launcher picks (FRAME: lean but for a "b c t" forward of one wave; GLOBAL: the forward
    # holds, the backward is lean); a strip walk holds its tiles
    LEAN: tl.constexpr = POOL_ALL and not HOLD and not STRIP
    # L2 hints for pooled tiles, which read chunks twice; per-channel tiles read once and were not timed with them
    STREAM: tl.constexpr = ONCE if POOL_ALL else 0
    if EARLY:  # before the shift's loads, so that the two waits overlap
        x0, msk0 = _load_raw(xb + (it0 * BLOCK_T + tl.arange(0, BLOCK_T))[None, :] * sxt, sxc, 0,
                             offs_c, C, _frame_mask(it0, T, length, BLOCK_T), AGAIN if LEAN else STREAM)
    K = _shift(x_ptr, b64, sxb, sxc, offs_c, C, length, sin_ptr, s_off, s_ok, NS, log2d, BLOCK_C, POOL_ALL, MODE,
               HAS_SIN)

    # GLOBAL: one summary per span of SPAN tiles; a strip sums its whole sequence, then reads it again below.
    # SEG (running modes): a sequence is walked in NSPAN segments of span_len tiles, each by one program
    # (PHASE 2), after a first launch (PHASE 1) has summed each segment; the summary of a span decays by
    # d per frame (EMA), so its frames weigh d^(frames after them in the tile) and each tile decays those
    # before it by d_tile.
    span_len = SPAN
    if SEG:
        span_len = tl.cdiv(NT, NSPAN)
    d_tile = tl.exp2(log2d * BLOCK_T)
    if PHASE == 3:  # GLOBAL in one launch: a span's program publishes its summary, tagged, and is done
        if span:
            gw, gm, gq = _span_sums(xb, sxt, sxc, offs_c, C, T, length, K, it0, span_len, SPAN, d_tile, log2d, CL,
                                    BLOCK_C, BLOCK_T, SC, POOL_ALL, MODE, WALK_STAGES)
            _publish(ws_ptr + (seq.to(tl.int64) * NSPAN + it0) * (3 * SC) + offs_s, gw, gm, gq, tag, 0, SC)
            return
    elif PHASE == 1 or (MODE == 3 and STRIP):
        n_sum = NT if STRIP and not SEG else span_len
        if SEG:  # the last segment's sum is never read
            n_sum = tl.where(it0 < NSPAN - 1, span_len, 0)
        gw, gm, gq = _span_sums(xb, sxt, sxc, offs_c, C, T, length, K, it0, span_len, n_sum, d_tile, log2d, CL,
                                BLOCK_C, BLOCK_T, SC, POOL_ALL, MODE, WALK_STAGES)
        if PHASE == 1:
            rec = (seq.to(tl.int64) * NSPAN + it0) * (3 * SC)
            tl.store(ws_ptr + rec + 0 * SC + offs_s, gw)
            tl.store(ws_ptr + rec + 1 * SC + offs_s, gm)
            tl.store(ws_ptr + rec + 2 * SC + offs_s, gq)
            return

    # STRIP: the program walks every tile of its sequence in order and carries the prefix (no ticket, no
    # look-back); otherwise it owns one tile. Prefixes (carried, published, segments') hold the sequence's
    # frames alone; each tile merges the incoming state (iw, im, iq) into its own (_with_state), so the
    # outgoing state can merge the frames' summary into the float64 state (_state_out)
    cw = tl.zeros([SC], dtype=tl.float32)
    cm = tl.zeros([SC], dtype=tl.float32)
    cq = tl.zeros([SC], dtype=tl.float32)
    iw, im, iq = cw, cm, cq
    ew, em, eq = cw, cm, cq  # SOUT64: the prefix of the outgoing state's tile
    if HAS_SIN:
        iw = tl.load(sin_ptr + s_off, mask=s_ok, other=0.0).to(tl.float32)
        im = _state_mean(sin_ptr, s_off, s_ok, NS, K)
        iq = tl.load(sin_ptr + 2 * NS + s_off, mask=s_ok, other=0.0).to(tl.float32)
    rec0 = seq.to(tl.int64) * NT * (6 * SC)
    n_walk = 1
    if STRIP:
        n_walk = NT
    if SEG:  # segment it0: its prefix is the summaries of the segments before it
        if SCANNED:  # span_scan has merged them: record it0 - 1
            prev = ws_ptr + (seq.to(tl.int64) * NSPAN + it0 - 1) * (3 * SC) + offs_s
            m_prev = offs_s + it0 > offs_s  # it0 > 0, as a [SC] mask
            sw_ = tl.load(prev, mask=m_prev, other=0.0)
            sm_ = tl.load(prev + SC, mask=m_prev, other=0.0)
            sq_ = tl.load(prev + 2 * SC, mask=m_prev, other=0.0)
        else:
            sw_, sm_, sq_, _sd = _span_reduce(ws_ptr, seq.to(tl.int64) * NSPAN * (3 * SC), it0,
                                              tl.exp2(log2d * (BLOCK_T * span_len).to(tl.float32)), offs_s, SC,
                                              WINDOW, False)
        cw, cm, cq = sw_, sm_, sq_
        it0 = it0 * span_len
        n_walk = tl.minimum(span_len, NT - it0)
    if STRIP:  # the walk reads each tile one step ahead, so its load overlaps the previous tile's work
        xn, mn = _load_tile(xb, sxt, sxc, it0, T, length, offs_c, C, K, BLOCK_T, STREAM)
    WS: tl.constexpr = WALK_STAGES if STRIP else 1  # a look-back tile's one step is not a loop to pipeline
    for step in tl.range(n_walk, num_stages=WS):
        it = it0 + step
        # ---- load the tile (pooled: its first chunk of channels, held unless LEAN; the others are merged
        # into the frames' statistics here and read again, from L2 as the hints ask, to be written)
        t0 = it * BLOCK_T
        offs_t = t0 + tl.arange(0, BLOCK_T)
        m_t = (offs_t < T) & (offs_t < length)
        px = xb + offs_t[None, :] * sxt
        Kt = _frame_shift(px, m_t, K, MODE)
        if STRIP:
            xk, msk = xn, mn
            xn, mn = _load_tile(xb, sxt, sxc, it + 1, T, length, offs_c, C, K, BLOCK_T, STREAM)
        elif EARLY:
            xk, msk = tl.where(msk0, x0 - Kt, 0.0), msk0
        else:
            xk, msk = _load(px, sxc, 0, offs_c, C, m_t, Kt, AGAIN if LEAN else STREAM)  # [BLOCK_C, BLOCK_T]
        ppre = pre_ptr + (seq.to(tl.int64) * NT + it) * (3 * SC) + offs_s
        holds_end = (t0 <= length - 1) & (length - 1 < t0 + BLOCK_T)  # the outgoing state's frame

        if MODE == 3:  # GLOBAL, second launch: reduce the span summaries of this sequence (a strip has its own)
            if STRIP:
                mw, mm, mq = gw, gm, gq
            elif SCANNED:  # span_scan has merged the spans: the last record
                tot = ws_ptr + (seq.to(tl.int64) * NSPAN + NSPAN - 1) * (3 * SC) + offs_s
                mw, mm, mq = tl.load(tot), tl.load(tot + SC), tl.load(tot + 2 * SC)
            else:
                mw, mm, mq, _d = _span_reduce(ws_ptr, seq.to(tl.int64) * NSPAN * (3 * SC), NSPAN, 1.0, offs_s, SC,
                                              WINDOW, False, PHASE == 3, tag)
            if STORE_PREFIX:
                if it == 0:
                    tl.store(ppre, mw)
                    tl.store(ppre + SC, mm)
                    tl.store(ppre + 2 * SC, mq)
            mean = mm[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
            var = (mq / tl.where(mw > 0, mw, 1.0))[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
            wt = mw[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
        else:
            sw, sm, sq = _tile_frames(xk, msk, px, sxc, offs_c, C, m_t, Kt, CL, BLOCK_C, POOL_ALL, STAGES)
            if MODE != 0:
                # running sums inside the tile, then its prefix: carried, the incoming state, or look-back; a
                # per-channel walk (ccln; ccemaln where EMA32) knows its prefix (the carry) first and shifts its
                # sums by its mean (_chan_frames)
                WALK_CHAN: tl.constexpr = (CHAN or EMA32) and STRIP
                fn, nv = _frame_weight(sw, m_t, POOL_ALL), _valid_frames(t0, T, length, BLOCK_T)
                if WALK_CHAN:
                    fw_, fm_, fq_ = _with_state(cw, cm, cq, iw, im, iq, t0, log2d, HAS_SIN)
                    kw_, km_, kq_, kvar, _r, aw, am, aq, _s, _a = _chan_frames(sm, fn, nv, fw_, fm_, fq_, t0 == 0,
                                                                               log2d, HAS_SIN, BLOCK_T, SC, MODE,
                                                                               cw, cm, HAS_SIN)
                else:
                    lw, l1, l2, D, L, aw, am, aq = _local_sums(fn, sm, sq, log2d, nv, BLOCK_T, SC, POOL_ALL, MODE)
                pw, pm, pq, cw, cm, cq = _prefix(ws_ptr, rec0, it, tag, cw, cm, cq, aw, am, aq, d_tile, offs_s,
                                                 SC, WINDOW, AGG_ONLY, DETERMINISTIC, False, STRIP)
                if SOUT64:  # the prefix of the frames alone before the outgoing state's frame: _state_out
                    ew, em, eq = tl.where(holds_end, pw, ew), tl.where(holds_end, pm, em), tl.where(holds_end, pq, eq)
                if STORE_PREFIX:  # the frames alone: the backward merges the state in, and takes dL/dm_in's
                    # m_in - mu_t from the frames' own sums
                    tl.store(ppre, pw)
                    tl.store(ppre + SC, pm)
                    tl.store(ppre + 2 * SC, pq)
                if WALK_CHAN:
                    pw, pm, pq = fw_, fm_, fq_
                else:
                    pw, pm, pq = _with_state(pw, pm, pq, iw, im, iq, t0, log2d, HAS_SIN)
                if WALK_CHAN:
                    sw, sm, sq, var = kw_, km_, kq_, kvar
                else:
                    sw, sm, sq, var, _r = _with_prefix(lw, l1, l2, D, L, pw, pm, pq, CHAN)
            else:
                var = sq / tl.where(sw > 0, sw, 1.0)
            mean = sm
            wt = sw

        # ---- normalize each chunk and write it once
        r = _one_value(_rstd(var, eps, EPS_OUTSIDE), wt, t0, MODE, LONE)
        py = y_ptr + b64 * syb + offs_t[None, :] * syt
        in_t = offs_t < T  # padding frames are written as 0
        if not LEAN:
            _write_y(py, syc, xk, msk, mean, r, 0, offs_c, C, in_t, w_ptr, b_ptr, HAS_W, HAS_B, STREAM, HAS_LEN)
        for c0 in tl.range(0 if LEAN else BLOCK_C, CL, BLOCK_C, num_stages=STAGES):  # in the order read
            xc, mc = _load(px, sxc, c0, offs_c, C, m_t, Kt, STREAM)
            _write_y(py, syc, xc, mc, mean, r, c0, offs_c, C, in_t, w_ptr, b_ptr, HAS_W, HAS_B, STREAM, HAS_LEN)

        if STORE_SOUT and not SOUT64:  # the state after frame length - 1, by the tile that holds that frame
            if holds_end:
                at = (offs_t == length - 1)[None, :]
                _store_state(sout_ptr, s_off, s_ok, NS, _pick(sw, at),
                             _pick(sm, at).to(tl.float64) + _pick(Kt + tl.zeros([SC, BLOCK_T], tl.float32), at),
                             _pick(sq, at))

    if SOUT64:  # the frames' own statistics at length - 1 merged into the incoming state in float64: by the
        # program that walked that frame's tile, which it reads again (once a sequence: not in the walk's loop,
        # where it took per-channel walks from 112 to 137 registers)
        it_e = (length - 1) // BLOCK_T
        if (length > 0) & (it_e >= it0) & (it_e < it0 + n_walk):
            t0 = it_e * BLOCK_T
            offs_t = t0 + tl.arange(0, BLOCK_T)
            m_t = (offs_t < T) & (offs_t < length)
            px = xb + offs_t[None, :] * sxt
            xk, msk = _load(px, sxc, 0, offs_c, C, m_t, K, AGAIN)
            sw, sm, sq = _tile_frames(xk, msk, px, sxc, offs_c, C, m_t, K, CL, BLOCK_C, POOL_ALL, 1)
            ow, om, oq = _own_end(_frame_weight(sw, m_t, POOL_ALL), sm, sq, ew, em, eq, length - 1 - t0, log2d,
                                  BLOCK_T)
            w64, m64, q64 = _state_out(sin_ptr, s_off, s_ok, NS, ow, om.to(tl.float64) + tl.sum(K, axis=1), oq,
                                       length, log2d, log2d_lo)
            _store_state(sout_ptr, s_off, s_ok, NS, w64, m64, q64)


# ---------------------------------------------------------------------------------------------------
# The backward kernel
# ---------------------------------------------------------------------------------------------------
@triton.jit
def running_norm_bwd(
    x_ptr,  # [B, C, T] (strides sxb, sxc, sxt)
    gy_ptr,  # [B, C, T] dL/dy (strides sgb, sgc, sgt)
    gx_ptr,  # [B, C, T] dL/dx (strides sdb, sdc, sdt)
    w_ptr,  # [C] affine weight
    len_ptr,  # [B] int64 lengths
    sin_ptr,  # [3, B, C or 1] float64 incoming state
    gsout_ptr,  # [3, B, C or 1] float64 dL/d(outgoing state)
    gsin_ptr,  # [3, B, C or 1] float64 dL/d(incoming state), written by tile 0
    pre_ptr,  # [B * NCB, NT, 3, SC] float32 the forward's tile prefixes (GLOBAL: totals at tile 0)
    gwp_ptr,  # [B, NT, C] float32 per-tile partial dL/dweight
    gbp_ptr,  # [B, NT, C] float32 per-tile partial dL/dbias
    ws_ptr,  # int64 look-back records, or float32 GLOBAL span sums
    ctr_ptr,  # [1] int64 ticket counter
    sxb, sxc, sxt, sgb, sgc, sgt, sdb, sdc, sdt,
    B, C, T, NCB, NT, NSPAN,
    log2d, eps,
    POOL_ALL: tl.constexpr, MODE: tl.constexpr, PHASE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_LEN: tl.constexpr, HAS_SIN: tl.constexpr, HAS_GSOUT: tl.constexpr,
    STORE_GW: tl.constexpr, EPS_OUTSIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, SPAN: tl.constexpr, WINDOW: tl.constexpr,
    DETERMINISTIC: tl.constexpr = False, AGG_ONLY: tl.constexpr = False, STRIP: tl.constexpr = False,
    HOLD: tl.constexpr = True, VEC_T: tl.constexpr = 1, VEC_C: tl.constexpr = 1, SEG: tl.constexpr = False,
    FLIP: tl.constexpr = False, SCANNED: tl.constexpr = False, LONE: tl.constexpr = True,
    STAGES: tl.constexpr = 1, WALK_STAGES: tl.constexpr = 1, EMA32: tl.constexpr = False,
    WIDE: tl.constexpr = True, CTR_IN_WS: tl.constexpr = False,
):
    log2d, eps = _f32(log2d), _f32(eps)
    SC: tl.constexpr = 1 if POOL_ALL else BLOCK_C
    if CTR_IN_WS:  # as in the forward
        ctr_ptr = ws_ptr + (tl.zeros([], tl.int64) + B) * NCB * NT * (6 * SC)
    CHAN: tl.constexpr = not POOL_ALL and MODE == 1
    T, sxc, sgc, sdc = _multiple(T, VEC_T), _multiple(sxc, VEC_T), _multiple(sgc, VEC_T), _multiple(sdc, VEC_T)
    C, sxt, sgt, sdt = _multiple(C, VEC_C), _multiple(sxt, VEC_C), _multiple(sgt, VEC_C), _multiple(sdt, VEC_C)
    sxc, sgc, sdc = _wide(sxc, WIDE), _wide(sgc, WIDE), _wide(sdc, WIDE)
    sxt, sgt, sdt = _wide(sxt, WIDE), _wide(sgt, WIDE), _wide(sdt, WIDE)
    sxb, sgb, sdb = _multiple(sxb, VEC_T * VEC_C), _multiple(sgb, VEC_T * VEC_C), _multiple(sdb, VEC_T * VEC_C)
    it, vt0, seq, tag, b64, offs_c, m_c, offs_s, length, s_off, s_ok, NS, CL, span = _tile(
        ctr_ptr, len_ptr, B, C, T, NCB, NT, NSPAN, MODE, POOL_ALL, HAS_LEN, BLOCK_C, SC, True, STRIP, PHASE)
    xb = x_ptr + b64 * sxb
    gyb = gy_ptr + b64 * sgb
    EARLY: tl.constexpr = (MODE == 1 or MODE == 2) and not STRIP  # as in the forward
    LEAN: tl.constexpr = POOL_ALL and not HOLD and not STRIP  # as in the forward
    if EARLY:
        m_e = _frame_mask(it, T, length, BLOCK_T)
        offs_e = (it * BLOCK_T + tl.arange(0, BLOCK_T))[None, :]
        x0, msk0 = _load_raw(xb + offs_e * sxt, sxc, 0, offs_c, C, m_e)
        g0, _m0 = _load_raw(gyb + offs_e * sgt, sgc, 0, offs_c, C, m_e)
    K = _shift(x_ptr, b64, sxb, sxc, offs_c, C, length, sin_ptr, s_off, s_ok, NS, log2d, BLOCK_C, POOL_ALL, MODE,
               HAS_SIN)
    ppre = pre_ptr + seq.to(tl.int64) * NT * (3 * SC) + offs_s
    iw = tl.zeros([SC], dtype=tl.float32)
    im, iq = iw, iw
    if HAS_SIN:  # as the forward: the tiles' saved prefixes hold the frames alone
        iw = tl.load(sin_ptr + s_off, mask=s_ok, other=0.0).to(tl.float32)
        im = _state_mean(sin_ptr, s_off, s_ok, NS, K)
        iq = tl.load(sin_ptr + 2 * NS + s_off, mask=s_ok, other=0.0).to(tl.float32)

    if MODE == 3:  # GLOBAL: the sequence's statistics, saved by the forward at tile 0
        gw_ = tl.load(ppre)
        mean1 = tl.load(ppre + SC)
        var1 = tl.load(ppre + 2 * SC) / tl.where(gw_ > 0, gw_, 1.0)
        r1 = _one_value(_rstd(var1, eps, EPS_OUTSIDE), gw_, 0, MODE, LONE)
        if PHASE == 3:  # one launch: a span's program publishes its sums, tagged, and is done (as the forward)
            if span:
                sa, sb = _grad_sums(xb, sxt, sxc, gyb, sgt, sgc, w_ptr, offs_c, C, T, length, K, mean1, r1, it, SPAN,
                                    SPAN, CL, HAS_W, BLOCK_C, BLOCK_T, SC, POOL_ALL, WALK_STAGES)
                _publish(ws_ptr + (seq.to(tl.int64) * NSPAN + it) * (3 * SC) + offs_s, sa, sb, tl.zeros([SC], tl.float32),
                         tag, 0, SC)
                return
        elif PHASE == 1 or STRIP:  # span sums of A = sum(g) and Bt = sum(g * xhat) (a strip: its sequence's)
            sa, sb = _grad_sums(xb, sxt, sxc, gyb, sgt, sgc, w_ptr, offs_c, C, T, length, K, mean1, r1, it, SPAN,
                                NT if STRIP else SPAN, CL, HAS_W, BLOCK_C, BLOCK_T, SC, POOL_ALL, WALK_STAGES)
            if PHASE == 1:
                rec = (seq.to(tl.int64) * NSPAN + it) * (3 * SC)
                tl.store(ws_ptr + rec + offs_s, sa)
                tl.store(ws_ptr + rec + SC + offs_s, sb)
                tl.store(ws_ptr + rec + 2 * SC + offs_s, tl.zeros([SC], tl.float32))
                return

    # STRIP: the program walks every tile of its sequence from the last and carries the suffix sums (no
    # ticket, no look-back); otherwise it owns one tile
    ku = tl.zeros([SC], dtype=tl.float32)
    kv = tl.zeros([SC], dtype=tl.float32)
    kz = tl.zeros([SC], dtype=tl.float32)
    rec0 = seq.to(tl.int64) * NT * (6 * SC)
    d1 = tl.exp2(log2d)
    d_tile = tl.exp2(log2d * BLOCK_T)
    REV: tl.constexpr = MODE == 1 or MODE == 2  # suffix sums: the walk starts at the last tile
    n_walk = 1
    if STRIP:
        n_walk = NT
    # SEG: segment vt0 of span_len tiles is walked from its last tile (PHASE 2), after PHASE 1 has summed
    # each segment's suffix sums; the carry starts as the sums of the segments after it
    SUMS: tl.constexpr = SEG and PHASE == 1
    if SEG:
        span_len = tl.cdiv(NT, NSPAN)
        srec = seq.to(tl.int64) * NSPAN * (3 * SC)
        if PHASE == 2 and SCANNED:  # span_scan has summed them: record vt0 + 1
            m_next = offs_s + vt0 + 1 < offs_s + NSPAN  # a segment follows, as a [SC] mask
            ku = tl.load(ws_ptr + srec + (vt0 + 1) * (3 * SC) + offs_s, mask=m_next, other=0.0)
            kv = tl.load(ws_ptr + srec + (vt0 + 1) * (3 * SC) + SC + offs_s, mask=m_next, other=0.0)
            kz = tl.load(ws_ptr + srec + (vt0 + 1) * (3 * SC) + 2 * SC + offs_s, mask=m_next, other=0.0)
        elif PHASE == 2:
            ku, kv, kz = _span_suffix(ws_ptr, srec, vt0, NSPAN, log2d * (BLOCK_T * span_len).to(tl.float32), offs_s,
                                      SC, WINDOW)
        s_seg = vt0
        n_walk = tl.minimum(span_len, NT - s_seg * span_len)
        if SUMS:  # the first segment's sum is never read
            n_walk = tl.where(s_seg > 0, n_walk, 0)
        vt0 = NT - tl.minimum((s_seg + 1) * span_len, NT)
    if STRIP:  # the walk reads each tile one step ahead, as in the forward
        first = NT - 1 - vt0 if REV else 0
        xn, mn = _load_tile(xb, sxt, sxc, first, T, length, offs_c, C, K, BLOCK_T, 0)
        gn, _m = _load_tile(gyb, sgt, sgc, first, T, length, offs_c, C, 0.0, BLOCK_T, 0, False)
    WS: tl.constexpr = WALK_STAGES if STRIP else 1
    for step in tl.range(n_walk, num_stages=WS):
        vt = vt0 + step
        it = vt
        if MODE == 1 or MODE == 2:
            it = NT - 1 - vt
        # ---- load the tile's first chunk of channels (held unless LEAN; pooled tiles read the others twice)
        t0 = it * BLOCK_T
        offs_t = t0 + tl.arange(0, BLOCK_T)
        m_t = (offs_t < T) & (offs_t < length)
        px = xb + offs_t[None, :] * sxt
        pg = gyb + offs_t[None, :] * sgt
        Kt = _frame_shift(px, m_t, K, MODE)
        if STRIP:
            xk, msk, gy = xn, mn, gn
            nxt = it - 1 if REV else it + 1
            xn, mn = _load_tile(xb, sxt, sxc, nxt, T, length, offs_c, C, K, BLOCK_T, 0)
            gn, _m = _load_tile(gyb, sgt, sgc, nxt, T, length, offs_c, C, 0.0, BLOCK_T, 0, False)
        elif EARLY:
            xk, msk, gy = tl.where(msk0, x0 - Kt, 0.0), msk0, g0
        else:
            xk, msk = _load(px, sxc, 0, offs_c, C, m_t, Kt)
            gy, _m = _load_raw(pg, sgc, 0, offs_c, C, m_t)  # 0 outside the mask already
        at = (offs_t == length - 1)[None, :]  # the frame of the outgoing state

        # ---- each frame's statistics, A = sum(g) and G = sum(g (x - m_f)) (a co-moment, merged like M2)
        if MODE == 3:
            mean = mean1[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
            var = var1[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
            sw = gw_[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
            rW = 1.0 / tl.where(sw > 0, sw, 1.0)
            r = _one_value(_rstd(var, eps, EPS_OUTSIDE), sw, t0, MODE, LONE)
            if STRIP:
                ta, tb = sa, sb
            elif SCANNED:  # span_scan has summed the spans: the first record
                tot = ws_ptr + seq.to(tl.int64) * NSPAN * (3 * SC) + offs_s
                ta, tb = tl.load(tot), tl.load(tot + SC)
            else:
                ta, tb, _c, _d = _span_reduce(ws_ptr, seq.to(tl.int64) * NSPAN * (3 * SC), NSPAN, 1.0, offs_s, SC,
                                              WINDOW, True, PHASE == 3, tag)
            A = ta[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
            Bt = tb[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
        else:
            g = gy * _gamma(w_ptr, 0, offs_c, C, HAS_W)[:, None]  # dL/dxhat
            sw, sm, sq = _frame_stats(xk, msk, m_t, 0, C, BLOCK_C, POOL_ALL)
            A = _group_sum(g, POOL_ALL)
            G = _group_sum(g * tl.where(msk, xk - sm, 0.0), POOL_ALL)
            for c0 in tl.range(BLOCK_C, CL, BLOCK_C, num_stages=STAGES):
                xc, mc = _load(px, sxc, c0, offs_c, C, m_t, Kt)
                gc, _m = _load_raw(pg, sgc, c0, offs_c, C, m_t)
                gc = gc * _gamma(w_ptr, c0, offs_c, C, HAS_W)[:, None]
                cw, cm, cq = _frame_stats(xc, mc, m_t, c0, C, BLOCK_C, POOL_ALL)
                ca = _group_sum(gc, POOL_ALL)
                cg = _group_sum(gc * tl.where(mc, xc - cm, 0.0), POOL_ALL)
                nw, nm, nq, _d = merge(sw, sm, sq, 1.0, cw, cm, cq, 1.0)
                G = G + cg + (sm - nm) * A + (cm - nm) * ca
                A = A + ca
                sw, sm, sq = nw, nm, nq
            fm = sm  # each frame's own mean
            if MODE != 0:  # the frames' prefix, and with the state merged in as the forward did
                ppt = ppre + it.to(tl.int64) * (3 * SC)
                fw0, fm0, fq0 = tl.load(ppt), tl.load(ppt + SC), tl.load(ppt + 2 * SC)
                pw0, pm0, pq0 = _with_state(fw0, fm0, fq0, iw, im, iq, t0, log2d, HAS_SIN)
            if MODE != 0 and (CHAN or EMA32):  # the saved prefix is known first: _chan_frames
                sw, sm, sq, var, rW, _w, _a, _b, s0, a0 = _chan_frames(sm, _frame_weight(sw, m_t, POOL_ALL),
                                                                       _valid_frames(t0, T, length, BLOCK_T), pw0,
                                                                       pm0, pq0, t0 == 0, log2d, HAS_SIN, BLOCK_T,
                                                                       SC, MODE)
                if HAS_SIN:  # m_in - mu_t = (m_in - s) - a: m_in - s from the frames' prefix, which the merged
                    # one's float32 mean had rounded by as much as the state's distance from the data
                    ds = tl.where(s0 == 0.0, im, fw0 * (im - fm0) / tl.where(pw0 > 0, pw0, 1.0))
                    dm_in = ds[:, None] - a0
            elif MODE != 0:
                lw, l1, l2, D, L, _w, _a, _b = _local_sums(_frame_weight(sw, m_t, POOL_ALL), sm, sq, log2d,
                                                        _valid_frames(t0, T, length, BLOCK_T), BLOCK_T,
                                                        SC, POOL_ALL, MODE)
                sw, sm, sq, var, rW = _with_prefix(lw, l1, l2, D, L, pw0, pm0, pq0, CHAN)
                if HAS_SIN:  # m_in - mu_t = (W_f m_in - S1_f) / W from the frames' own sums, in float64
                    wf = lw + fw0.to(tl.float64)[:, None] * D
                    s1f = l1 + (fw0.to(tl.float64) * fm0.to(tl.float64))[:, None] * D
                    ws = (iw * tl.exp2(log2d * t0.to(tl.float32))).to(tl.float64)[:, None] * D
                    w64 = wf + ws  # 0 in channels past C and frames of no weight: 0, not 0 / 0
                    dm_in = ((wf * im.to(tl.float64)[:, None] - s1f) / tl.where(w64 > 0, w64, 1.0)).to(tl.float32)
            else:
                rW = 1.0 / tl.where(sw > 0, sw, 1.0)
                var = sq * rW
            mean = sm
            r = _one_value(_rstd(var, eps, EPS_OUTSIDE), sw, t0, MODE, LONE)
            Bt = r * (G + (fm - mean) * A)  # sum over the frame's channels of g * xhat

        # ---- dL/dmu_t and dL/dvar_t of each frame's statistics
        dmu = -r * A
        if EPS_OUTSIDE:
            dvar = -0.5 * Bt * r / tl.sqrt(_at_least(var, 1.1754944e-38))
        else:
            dvar = -0.5 * Bt * r * r
        P = dmu * rW  # coefficient of a_{t,tau} in dL/dx_tau
        R = 2.0 * dvar * rW  # coefficient of a_{t,tau} (x_tau - mu_t)
        if LONE and not POOL_ALL and (MODE == 1 or MODE == 2) and not HAS_SIN:
            # per channel, frame 0 holds all its weight (W = 1): its own term of U, P = -g r, cancels dx's g r
            # exactly; added apart they cancelled only to g r's rounding (values of 1e16: frame 0's dx was noise).
            # Both left out there, as selects (a pick of U after the scan cost the backward 6 %)
            own = (offs_t == 0)[None, :]
            P = tl.where(own, 0.0, P)
            r = tl.where(own, 0.0, r)  # r's last use is dx's g r (x - mean is 0 there: no dweight)
        Z = tl.zeros([SC, BLOCK_T], tl.float32)
        if HAS_GSOUT:  # the outgoing state (w, m, M2) at frame length - 1 depends on x too
            gso_m = tl.load(gsout_ptr + NS + s_off, mask=s_ok, other=0.0).to(tl.float32)[:, None]
            gso_q = tl.load(gsout_ptr + 2 * NS + s_off, mask=s_ok, other=0.0).to(tl.float32)[:, None]
            P += tl.where(at, gso_m * rW, 0.0)
            R += tl.where(at, 2.0 * gso_q, 0.0)
        if HAS_SIN:  # dL/dm_in = w_in d sum_t d^t Z_t: U + m_in V, but without U's terms R mean, which
            # cancel against m_in V when the means stay near m_in far from K (a fading EMA state)
            Z = P + R * dm_in
        valid_t = m_t[None, :]
        U = tl.where(valid_t, P - R * mean, 0.0)
        V = tl.where(valid_t, R, 0.0)
        Z = tl.where(valid_t, Z, 0.0)

        # ---- suffix sums over later frames: U_tau = sum_{t >= tau} d^(t - tau) U_t, same for V and Z
        if SUMS:  # the tile's sums seen from its first frame, into its segment's
            if MODE == 2:
                wt = tl.exp2(log2d * tl.arange(0, BLOCK_T).to(tl.float32))[None, :]
                U, V, Z = U * wt, V * wt, Z * wt
            ku, kv, kz, _kd = lin(ku, kv, kz, 1.0, tl.sum(U, axis=1), tl.sum(V, axis=1), tl.sum(Z, axis=1), d_tile)
        elif MODE == 1 or MODE == 2:
            if MODE == 1:  # plain suffix sums; the tile's totals without a pick (a select per element)
                au, av, az = tl.sum(U, axis=1), tl.sum(V, axis=1), tl.sum(Z, axis=1)
                U, V, Z = (_cumsum(U, BLOCK_T, SC, True, FLIP), _cumsum(V, BLOCK_T, SC, True, FLIP),
                           _cumsum(Z, BLOCK_T, SC, True, FLIP))
                sd = 1.0
            elif EMA32 and not FLIP:  # d^-tau times the suffix sums of d^t U_t (d^-tau at most 4, as in
                # _chan_frames); the tile's totals seen from its first frame are plain sums. Where frames span lanes
                # ("b c t"): ccemaln's backward 3.99 -> 3.84 warp-instructions an element; in one lane, 2.10 -> 2.25
                tsf = tl.arange(0, BLOCK_T)[None, :].to(tl.float32)
                dn, up = tl.exp2(log2d * tsf), tl.exp2(-log2d * tsf)
                U, V, Z = U * dn, V * dn, Z * dn
                au, av, az = tl.sum(U, axis=1), tl.sum(V, axis=1), tl.sum(Z, axis=1)
                U, V, Z = (_cumsum(U, BLOCK_T, SC, True, FLIP) * up, _cumsum(V, BLOCK_T, SC, True, FLIP) * up,
                           _cumsum(Z, BLOCK_T, SC, True, FLIP) * up)
                sd = d_tile * up  # the later tiles' sums decay by d^(BLOCK_T - tau) to frame tau
            else:
                U, V, Z, sd = _scan(U, V, Z, d1 + tl.zeros([SC, BLOCK_T], tl.float32), BLOCK_T, SC, 1, True, True,
                                    FLIP)
                is_first = (tl.arange(0, BLOCK_T) == 0)[None, :]
                au, av, az = _pick(U, is_first), _pick(V, is_first), _pick(Z, is_first)
            eu, ev, ez, ku, kv, kz = _prefix(ws_ptr, rec0, vt, tag, ku, kv, kz, au, av, az, d_tile, offs_s, SC,
                                             WINDOW, AGG_ONLY, DETERMINISTIC, True, STRIP)
            U, V, Z, _ = lin(eu[:, None], ev[:, None], ez[:, None], 1.0, U, V, Z, sd)

        # ---- dL/dx = g r + U + x V for each chunk, and the per-tile partials of dweight and dbias
        if not SUMS:
            pgx = gx_ptr + b64 * sdb + offs_t[None, :] * sdt
            pgw = (b64 * NT + it) * C + offs_c
            in_t = offs_t < T
            if not LEAN:
                _write_gx(pgx, sdc, xk, msk, gy, mean, r, U, V, 0, offs_c, C, in_t, w_ptr, gwp_ptr, gbp_ptr, pgw, HAS_W,
                          STORE_GW, HAS_LEN)
            for k in tl.range(0 if LEAN else 1, tl.cdiv(CL, BLOCK_C), num_stages=STAGES):
                c0 = _reread(k, CL, LEAN, BLOCK_C)
                xc, mc = _load(px, sxc, c0, offs_c, C, m_t, Kt)
                gc, _m = _load_raw(pg, sgc, c0, offs_c, C, m_t)
                _write_gx(pgx, sdc, xc, mc, gc, mean, r, U, V, c0, offs_c, C, in_t, w_ptr, gwp_ptr, gbp_ptr, pgw,
                          HAS_W, STORE_GW, HAS_LEN)

            if HAS_SIN and (MODE == 1 or MODE == 2):  # the incoming state is frame -1 of weight d^(t+1)
                if it == 0:
                    is_first = (tl.arange(0, BLOCK_T) == 0)[None, :]
                    v0, z0 = _pick(V, is_first), _pick(Z, is_first)
                    w_in = tl.load(sin_ptr + s_off, mask=s_ok, other=0.0).to(tl.float32)
                    tl.store(gsin_ptr + NS + s_off, (w_in * d1 * z0).to(tl.float64), mask=s_ok)
                    tl.store(gsin_ptr + 2 * NS + s_off, (0.5 * d1 * v0).to(tl.float64), mask=s_ok)

    if SUMS:
        tl.store(ws_ptr + srec + s_seg * (3 * SC) + offs_s, ku)
        tl.store(ws_ptr + srec + s_seg * (3 * SC) + SC + offs_s, kv)
        tl.store(ws_ptr + srec + s_seg * (3 * SC) + 2 * SC + offs_s, kz)


# ---------------------------------------------------------------------------------------------------
# Reductions after a launch: weight-gradient partials, span_scan
# ---------------------------------------------------------------------------------------------------
@triton.jit
def sum_partials(p_ptr, gw_ptr, gb_ptr, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dweight (axis 1 == 0) and dbias (== 1) from the backward's per-tile float32 partials, (2, R, C):
    each program sums one block of channels over all R rows in a fixed order, so the same partials give the
    same bits. torch's column sums took 17 µs each for 512 x 128 on the H200 (two of a 138 µs training
    step), and a launch each."""
    j, k = tl.program_id(0), tl.program_id(1)
    offs_c = j * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = offs_c < C
    base = p_ptr + k.to(tl.int64) * R * C
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        acc += tl.load(base + rows.to(tl.int64)[:, None] * C + offs_c[None, :],
                       mask=(rows < R)[:, None] & m_c[None, :], other=0.0)
    total = tl.sum(acc, axis=0)
    if k == 0:
        tl.store(gw_ptr + offs_c, total, mask=m_c)
    else:
        tl.store(gb_ptr + offs_c, total, mask=m_c)


@triton.jit
def span_scan(ws_ptr, NSPAN, log2d, SPAN_FRAMES, SC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
              LINEAR: tl.constexpr, ALL: tl.constexpr = False):
    """SEG's segment summaries [seq, NSPAN, 3, SC] into running ones, in place, so that a walk reads one
    record for its prefix instead of combining all the segments before it (work quadratic in NSPAN: ccln
    (2, 256, 64000) bf16 "b t c" read 0.82 GB of records for 65 MB of x at 517 segments a sequence; on the
    H200 its forward went from 8.07 to 4.48 times a copy's time, (1, 128, 256000) fp32 from 4.96 to 2.55). One
    program per sequence and BLOCK_S statistics, in a fixed order (deterministic). Forward (Chan merges):
    record j becomes segments 0..j merged, each decaying those before it by d_span. Backward (LINEAR, from
    the end): record j becomes the sum over k >= j of d_span^(k - j) times segment k's sums. The record a
    walk never reads (the last forward, the first backward) is left alone, unless ALL: GLOBAL's span sums,
    whose totals (the last record forward, the first backward) every tile reads (instln "b t c" (1, 128,
    256000): 4000 tiles of a sequence each combined its 130 spans, 0.8 GB of reads for 131 MB of x)."""
    # d per span from log2 d and the span's frames (ints): a float made of symbolic sizes (dynamic shapes) would
    # reach Inductor's launcher as an int
    log2d_span = _f32(log2d) * SPAN_FRAMES
    seq = tl.program_id(0)
    offs_s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    m_s = offs_s < SC
    rec0 = ws_ptr + seq.to(tl.int64) * NSPAN * (3 * SC)
    d_span = tl.exp2(log2d_span)
    ca = tl.zeros([1, BLOCK_S], dtype=tl.float32)
    cb = tl.zeros([1, BLOCK_S], dtype=tl.float32)
    cc = tl.zeros([1, BLOCK_S], dtype=tl.float32)
    cd = tl.full([1, BLOCK_S], 1.0, dtype=tl.float32)
    n_rows = NSPAN if ALL else NSPAN - 1
    for r0 in range(0, n_rows, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)  # older to newer: the backward runs from the last segment
        j = NSPAN - 1 - offs_r if LINEAR else offs_r
        m = (offs_r < n_rows)[:, None] & m_s[None, :]
        p = rec0 + j.to(tl.int64)[:, None] * (3 * SC) + offs_s[None, :]
        a = tl.load(p, mask=m, other=0.0)
        b = tl.load(p + SC, mask=m, other=0.0)
        c = tl.load(p + 2 * SC, mask=m, other=0.0)
        d = tl.where(m, d_span, 1.0)  # past the end: empty, decays nothing
        a, b, c, d = _scan(a, b, c, d, BLOCK_R, BLOCK_S, 0, LINEAR, False)
        a, b, c, d = _combine(ca, cb, cc, cd, a, b, c, d, LINEAR)
        tl.store(p, a, mask=m)
        tl.store(p + SC, b, mask=m)
        tl.store(p + 2 * SC, c, mask=m)
        last = (tl.arange(0, BLOCK_R) == BLOCK_R - 1)[:, None]
        ca = tl.sum(tl.where(last, a, 0.0), axis=0, keep_dims=True)
        cb = tl.sum(tl.where(last, b, 0.0), axis=0, keep_dims=True)
        cc = tl.sum(tl.where(last, c, 0.0), axis=0, keep_dims=True)
        cd = tl.sum(tl.where(last, d, 0.0), axis=0, keep_dims=True)
