"""The running-statistics kernel template. One kernel serves every norm of the family:

- POOL_ALL: statistics over all C channels of a frame (one (w, m, M2) per frame) or per channel;
- MODE: 0 FRAME, 1 CUMULATIVE, 2 EMA (decay d in (0, 1)), 3 GLOBAL;
- HAS_W / HAS_B (affine), HAS_LEN (lengths), HAS_SIN (incoming state), STORE_SOUT (outgoing state),
  STORE_STATS (per-frame mean and 1/std for the backward), EPS_OUTSIDE;
- layout through strides: a "b t c" input is a (B, C, T) view with stride 1 on C, read in place.

A program owns one tile of (BLOCK_C channels x BLOCK_T frames) and keeps it in registers: x is read once
and y written once. Tiles of one sequence find their prefix state by decoupled look-back: each tile
publishes the summary of its own frames (its aggregate), then merges its predecessors' summaries walking
back until one has published its inclusive prefix. Tiles take their index from an atomic ticket, so a
tile only ever waits on tiles that have already started: no deadlock, whatever the scheduler does.

Published words carry a tag in their upper 32 bits (the launch's epoch + 1) beside the float bits, so a
reader tells a word written by this launch from a stale one without a fence or a workspace reset; the
epoch comes from the ticket counter itself (epoch << 32 | ticket), which the last ticket advances.

Statistics are float32 Chan merges of x - K, K a per-sequence (per-channel) shift: frame 0's mean, or
the incoming state's mean. GLOBAL runs the same tile code in two launches (PHASE 1: per-span summaries;
PHASE 2: reduce them and normalize).
"""
import triton
import triton.language as tl


@triton.jit
def merge(w1, m1, q1, d1, w2, m2, q2, d2):
    """Chan's merge of an older summary (1) with a newer one (2); d is the summary's decay (d^L)."""
    wo = d2 * w1
    w = wo + w2
    delta = m2 - m1
    frac = w2 / tl.where(w > 0, w, 1.0)
    return w, m1 + delta * frac, d2 * q1 + q2 + delta * delta * wo * frac, d1 * d2


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
def _scan(w, m, q, d, N: tl.constexpr, SC: tl.constexpr, AXIS: tl.constexpr):
    """Inclusive merge-scan of [N, SC] (AXIS 0) or [SC, N] (AXIS 1) summaries. With SC == 1 it scans a
    1D vector: Triton 3.6's scan lowering asserts on some layouts of a unit dim."""
    if SC == 1:
        w, m, q, d = tl.associative_scan((tl.reshape(w, [N]), tl.reshape(m, [N]), tl.reshape(q, [N]),
                                          tl.reshape(d, [N])), axis=0, combine_fn=merge)
        shape: tl.constexpr = [N, 1] if AXIS == 0 else [1, N]
        return tl.reshape(w, shape), tl.reshape(m, shape), tl.reshape(q, shape), tl.reshape(d, shape)
    else:
        return tl.associative_scan((w, m, q, d), axis=AXIS, combine_fn=merge)


@triton.jit
def _pick_last(v, is_last):
    """v[..., BLOCK_T-1] of a [SC, BLOCK_T] tensor as [SC]."""
    return tl.sum(tl.where(is_last, v, 0.0), axis=1)


@triton.jit
def _lookback(ws_ptr, rec0, tile, tag, log2d, offs_s, SC: tl.constexpr, BLOCK_T: tl.constexpr,
              WINDOW: tl.constexpr, AGG_ONLY: tl.constexpr):
    """The exclusive prefix of ``tile`` (> 0) from its predecessors' published records.

    A record is 6*SC int64 words: the aggregate (w, m, M2) then the inclusive prefix (w, m, M2).
    Returns (w, m, M2) of shape [SC].
    """
    offs_w = tl.arange(0, WINDOW)
    d_tile = tl.exp2(log2d * BLOCK_T)  # decay of one full tile
    acc_w = tl.zeros([SC], dtype=tl.float32)
    acc_m = tl.zeros([SC], dtype=tl.float32)
    acc_q = tl.zeros([SC], dtype=tl.float32)
    acc_d = tl.full([SC], 1.0, dtype=tl.float32)
    hi = tile  # the window covers tiles hi - WINDOW .. hi - 1
    done = 0
    while done == 0:
        j = hi - WINDOW + offs_w  # [WINDOW]
        ok_j = j >= 0
        base = rec0 + tl.maximum(j, 0).to(tl.int64) * (6 * SC)
        p = ws_ptr + base[:, None] + offs_s[None, :]  # [WINDOW, SC]
        m2d = ok_j[:, None] & (offs_s[None, :] >= 0)
        aw, taw = _unpack(tl.load(p + 0 * SC, mask=m2d, other=0, volatile=True))
        am, tam = _unpack(tl.load(p + 1 * SC, mask=m2d, other=0, volatile=True))
        aq, taq = _unpack(tl.load(p + 2 * SC, mask=m2d, other=0, volatile=True))
        iw, tiw = _unpack(tl.load(p + 3 * SC, mask=m2d, other=0, volatile=True))
        im, tim = _unpack(tl.load(p + 4 * SC, mask=m2d, other=0, volatile=True))
        iq, tiq = _unpack(tl.load(p + 5 * SC, mask=m2d, other=0, volatile=True))
        agg_ok = tl.min(((taw == tag) & (tam == tag) & (taq == tag)).to(tl.int32), axis=1)  # [WINDOW]
        inc_ok = tl.min(((tiw == tag) & (tim == tag) & (tiq == tag)).to(tl.int32), axis=1)
        agg_ok = tl.where(ok_j, agg_ok, 1)
        inc_ok = tl.where(ok_j, inc_ok, 0)
        if AGG_ONLY:  # tests: ignore published prefixes but tile 0's, so the walk crosses windows
            inc_ok = tl.where(j == 0, inc_ok, 0)
        k = tl.max(tl.where(inc_ok > 0, offs_w, -1), axis=0)  # newest published prefix in the window
        ready = tl.min(tl.where(offs_w > k, agg_ok, 1), axis=0)
        if ready > 0:
            use_inc = (offs_w == k)[:, None]
            keep = (offs_w >= k)[:, None] & ok_j[:, None]
            sw = tl.where(keep, tl.where(use_inc, iw, aw), 0.0)
            sm = tl.where(keep, tl.where(use_inc, im, am), 0.0)
            sq = tl.where(keep, tl.where(use_inc, iq, aq), 0.0)
            sd = tl.where(keep & (offs_w > k)[:, None], d_tile, 1.0) + tl.zeros([WINDOW, SC], tl.float32)
            sw, sm, sq, sd = _scan(sw, sm, sq, sd, WINDOW, SC, 0)
            last = (offs_w == WINDOW - 1)[:, None]
            tw = tl.sum(tl.where(last, sw, 0.0), axis=0)
            tm = tl.sum(tl.where(last, sm, 0.0), axis=0)
            tq = tl.sum(tl.where(last, sq, 0.0), axis=0)
            td = tl.sum(tl.where(last, sd, 0.0), axis=0)
            acc_w, acc_m, acc_q, acc_d = merge(tw, tm, tq, td, acc_w, acc_m, acc_q, acc_d)
            if k >= 0:
                done = 1
            else:
                hi = hi - WINDOW
    return acc_w, acc_m, acc_q


@triton.jit
def running_norm_fwd(
    x_ptr,  # [B, C, T] (strides sxb, sxc, sxt)
    y_ptr,  # [B, C, T] (strides syb, syc, syt)
    w_ptr,  # [C] affine weight
    b_ptr,  # [C] affine bias
    len_ptr,  # [B] int64 lengths
    sin_ptr,  # [3, B, C or 1] float64 incoming state (w, m, M2)
    sout_ptr,  # [3, B, C or 1] float64 outgoing state
    mean_ptr,  # [B, T] float32 mean - K (pooled norms, for the backward)
    rstd_ptr,  # [B, T] float32 1/std (pooled norms, for the backward)
    ws_ptr,  # int64 look-back records, or float32 GLOBAL span summaries [B, NCB, NSPAN, 3, SC]
    ctr_ptr,  # [1] int64 ticket counter (epoch << 32 | ticket)
    sxb, sxc, sxt, syb, syc, syt,
    B, C, T, NCB, NT, NSPAN,
    log2d, eps,
    POOL_ALL: tl.constexpr, MODE: tl.constexpr, PHASE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_LEN: tl.constexpr, HAS_SIN: tl.constexpr,
    STORE_SOUT: tl.constexpr, STORE_STATS: tl.constexpr, EPS_OUTSIDE: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, SPAN: tl.constexpr, WINDOW: tl.constexpr,
    AGG_ONLY: tl.constexpr = False,
):
    SC: tl.constexpr = 1 if POOL_ALL else BLOCK_C  # statistics per frame: one, or one per channel
    LOOKBACK: tl.constexpr = (MODE == 1) or (MODE == 2)

    # ---- which tile: ticket order for the look-back, plain program ids otherwise
    if LOOKBACK:
        n_tiles = B * NCB * NT
        ticket = tl.atomic_add(ctr_ptr, 1)
        tile_id = (ticket & 0xFFFFFFFF).to(tl.int32)
        tag = ((ticket >> 32) & 0x3FFFFFFF).to(tl.int32) + 1
        next_epoch = (tl.full([], 1, tl.int64) << 32) - n_tiles.to(tl.int64)
        tl.atomic_add(ctr_ptr, next_epoch, mask=tile_id == n_tiles - 1)  # the last ticket: new epoch
        it = tile_id // (B * NCB)  # tile-major: tile i of every sequence before tile i + 1 of any
        seq = tile_id % (B * NCB)
    else:
        seq = tl.program_id(0)
        it = tl.program_id(1)
    b = seq // NCB
    cb = seq % NCB
    b64 = b.to(tl.int64)

    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = offs_c < C
    offs_s = tl.arange(0, SC)
    length = T
    if HAS_LEN:
        length = tl.load(len_ptr + b).to(tl.int32)

    # incoming / outgoing state fields are [B] (pooled) or [B, C]: NS entries each
    if POOL_ALL:
        s_off = b64 + offs_s
        s_ok = offs_s >= 0
        NS = B
    else:
        s_off = b64 * C + offs_c
        s_ok = m_c
        NS = B * C

    # ---- the shift K: [SC, 1], frame 0's mean (pooled) or value (per channel), or the state's mean
    if HAS_SIN:
        K = tl.load(sin_ptr + NS + s_off, mask=s_ok, other=0.0).to(tl.float32)[:, None]
    else:
        x0 = tl.load(x_ptr + b64 * sxb + offs_c.to(tl.int64)[:, None] * sxc, mask=m_c[:, None], other=0.0)
        K = _group_sum(x0.to(tl.float32), POOL_ALL)
        if POOL_ALL:
            K = K / C

    if PHASE == 1:  # GLOBAL, first launch: one summary per span of SPAN tiles
        gw = tl.zeros([SC], dtype=tl.float32)
        gm = tl.zeros([SC], dtype=tl.float32)
        gq = tl.zeros([SC], dtype=tl.float32)
        for k in range(SPAN):
            offs_t = (it * SPAN + k) * BLOCK_T + tl.arange(0, BLOCK_T)
            msk = m_c[:, None] & ((offs_t < T) & (offs_t < length))[None, :]
            p = x_ptr + b64 * sxb + offs_c.to(tl.int64)[:, None] * sxc + offs_t.to(tl.int64)[None, :] * sxt
            xk = tl.where(msk, tl.load(p, mask=msk, other=0.0).to(tl.float32) - K, 0.0)
            n = tl.sum(_group_sum(msk.to(tl.float32), POOL_ALL), axis=1)  # [SC]
            mk = tl.sum(_group_sum(xk, POOL_ALL), axis=1) / tl.where(n > 0, n, 1.0)
            dev = tl.where(msk, xk - mk[:, None], 0.0)
            qk = tl.sum(_group_sum(dev * dev, POOL_ALL), axis=1)
            gw, gm, gq, _ = merge(gw, gm, gq, 1.0, n, mk, qk, 1.0)
        rec = ((b64 * NCB + cb) * NSPAN + it) * (3 * SC)
        tl.store(ws_ptr + rec + 0 * SC + offs_s, gw)
        tl.store(ws_ptr + rec + 1 * SC + offs_s, gm)
        tl.store(ws_ptr + rec + 2 * SC + offs_s, gq)
        return

    # ---- load the tile and compute its frames' statistics
    t0 = it * BLOCK_T
    offs_t = t0 + tl.arange(0, BLOCK_T)
    m_t = (offs_t < T) & (offs_t < length)  # valid frames
    msk = m_c[:, None] & m_t[None, :]
    px = x_ptr + b64 * sxb + offs_c.to(tl.int64)[:, None] * sxc + offs_t.to(tl.int64)[None, :] * sxt
    xk = tl.where(msk, tl.load(px, mask=msk, other=0.0).to(tl.float32) - K, 0.0)  # [BLOCK_C, BLOCK_T]
    is_last = (tl.arange(0, BLOCK_T) == BLOCK_T - 1)[None, :]

    if MODE == 3:  # GLOBAL, second launch: reduce the span summaries of this sequence
        mw = tl.zeros([SC], dtype=tl.float32)
        mm = tl.zeros([SC], dtype=tl.float32)
        mq = tl.zeros([SC], dtype=tl.float32)
        rec0 = (b64 * NCB + cb) * NSPAN * (3 * SC)
        for j0 in range(0, NSPAN, WINDOW):
            offs_j = j0 + tl.arange(0, WINDOW)
            pj = ws_ptr + rec0 + offs_j.to(tl.int64)[:, None] * (3 * SC) + offs_s[None, :]
            mj = (offs_j < NSPAN)[:, None] & (offs_s[None, :] >= 0)
            jw = tl.load(pj + 0 * SC, mask=mj, other=0.0)
            jm = tl.load(pj + 1 * SC, mask=mj, other=0.0)
            jq = tl.load(pj + 2 * SC, mask=mj, other=0.0)
            jd = tl.full([WINDOW, SC], 1.0, tl.float32)
            jw, jm, jq, jd = _scan(jw, jm, jq, jd, WINDOW, SC, 0)
            lastj = (tl.arange(0, WINDOW) == WINDOW - 1)[:, None]
            mw, mm, mq, _ = merge(mw, mm, mq, 1.0, tl.sum(tl.where(lastj, jw, 0.0), axis=0),
                                  tl.sum(tl.where(lastj, jm, 0.0), axis=0),
                                  tl.sum(tl.where(lastj, jq, 0.0), axis=0), 1.0)
        mean = mm[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
        var = mq[:, None] / tl.where(mw > 0, mw, 1.0)[:, None] + tl.zeros([SC, BLOCK_T], tl.float32)
    else:
        # frame statistics f_t = (n, m_f, M2_f), each [SC, BLOCK_T]; padding frames weigh 0
        fn = _group_sum(msk.to(tl.float32), POOL_ALL)
        fm = _group_sum(xk, POOL_ALL) / tl.where(fn > 0, fn, 1.0)
        dev = tl.where(msk, xk - fm, 0.0)
        fq = _group_sum(dev * dev, POOL_ALL)  # zero per channel
        if MODE == 0:  # FRAME: the frame alone
            sw, sm, sq = fn, fm, fq
        else:
            fd = tl.exp2(log2d) + tl.zeros([SC, BLOCK_T], tl.float32)  # per-frame decay
            sw, sm, sq, sd = _scan(fn, fm, fq, fd, BLOCK_T, SC, 1)
            # this tile's aggregate; its prefix from the incoming state (tile 0) or the look-back
            aw, am, aq = _pick_last(sw, is_last), _pick_last(sm, is_last), _pick_last(sq, is_last)
            rec0 = (b64 * NCB + cb) * NT * (6 * SC)
            prec = ws_ptr + rec0 + it.to(tl.int64) * (6 * SC) + offs_s
            if it == 0:
                pw = tl.zeros([SC], dtype=tl.float32)
                pm = tl.zeros([SC], dtype=tl.float32)
                pq = tl.zeros([SC], dtype=tl.float32)
                if HAS_SIN:  # the state's mean relative to K = float32(state mean): a rounding residue
                    pw = tl.load(sin_ptr + s_off, mask=s_ok, other=0.0).to(tl.float32)
                    m64 = tl.load(sin_ptr + NS + s_off, mask=s_ok, other=0.0)
                    pm = (m64 - m64.to(tl.float32).to(tl.float64)).to(tl.float32)
                    pq = tl.load(sin_ptr + 2 * NS + s_off, mask=s_ok, other=0.0).to(tl.float32)
            else:
                tl.store(prec + 0 * SC, _pack(aw, tag))
                tl.store(prec + 1 * SC, _pack(am, tag))
                tl.store(prec + 2 * SC, _pack(aq, tag))
                pw, pm, pq = _lookback(ws_ptr, rec0, it, tag, log2d, offs_s, SC, BLOCK_T, WINDOW, AGG_ONLY)
            d_tile = tl.exp2(log2d * BLOCK_T) + tl.zeros([SC], tl.float32)
            iw, im, iq, _ = merge(pw, pm, pq, 1.0, aw, am, aq, d_tile)
            tl.store(prec + 3 * SC, _pack(iw, tag))
            tl.store(prec + 4 * SC, _pack(im, tag))
            tl.store(prec + 5 * SC, _pack(iq, tag))
            sw, sm, sq, _ = merge(pw[:, None], pm[:, None], pq[:, None], 1.0, sw, sm, sq, sd)
        mean = sm
        var = sq / tl.where(sw > 0, sw, 1.0)

    # ---- normalize the tile in registers and write it once
    if EPS_OUTSIDE:
        rstd = 1.0 / (tl.sqrt(tl.maximum(var, 0.0)) + eps)
    else:
        rstd = 1.0 / tl.sqrt(tl.maximum(var, 0.0) + eps)
    y = (xk - mean) * rstd
    if HAS_W:
        y = y * tl.load(w_ptr + offs_c, mask=m_c, other=1.0).to(tl.float32)[:, None]
    if HAS_B:
        y = y + tl.load(b_ptr + offs_c, mask=m_c, other=0.0).to(tl.float32)[:, None]
    y = tl.where(msk, y, 0.0)
    py = y_ptr + b64 * syb + offs_c.to(tl.int64)[:, None] * syc + offs_t.to(tl.int64)[None, :] * syt
    tl.store(py, y.to(y_ptr.dtype.element_ty), mask=m_c[:, None] & (offs_t < T)[None, :])

    if STORE_STATS:  # pooled norms: per-frame mean (relative to K) and 1/std, [1, BLOCK_T]
        ps = b64 * T + offs_t[None, :]
        tl.store(mean_ptr + ps, mean, mask=(offs_t < T)[None, :])
        tl.store(rstd_ptr + ps, rstd, mask=(offs_t < T)[None, :])

    if STORE_SOUT:  # the state after frame length - 1, written by the tile that holds that frame
        at = (offs_t == length - 1)[None, :]
        ow = tl.sum(tl.where(at, sw, 0.0), axis=1)
        om = tl.sum(tl.where(at, sm, 0.0), axis=1)
        oq = tl.sum(tl.where(at, sq, 0.0), axis=1)
        hit = (t0 <= length - 1) & (length - 1 < t0 + BLOCK_T)
        if hit:
            tl.store(sout_ptr + s_off, ow.to(tl.float64), mask=s_ok)
            tl.store(sout_ptr + NS + s_off, om.to(tl.float64) + tl.sum(K, axis=1).to(tl.float64), mask=s_ok)
            tl.store(sout_ptr + 2 * NS + s_off, oq.to(tl.float64), mask=s_ok)
