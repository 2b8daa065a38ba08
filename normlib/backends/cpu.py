"""Compiled CPU loops (numba) for the PyTorch backend's most common calls: a running norm (cln, emaln, frameln as
decay 0, and per channel ccln, ccemaln) of whole sequences, forward and backward, and a streaming hop with its
state, on float32 or float64 CPU tensors.

A torch op costs a CPU several microseconds whatever its size, and the general path takes some forty of them
forward and as many backward: at a small model's sizes ((2, 64, 499) a layer) that count, not the arithmetic,
was the layer's time. Pooled, a sequence is two or three passes: each frame's sum and squares about its mean
(float64), Welford's recurrence over the frames (the same merge as the general path, in float64, shifted by
K, frame 0's mean), then y. The backward is the formula of ``_PooledNorm`` (docs/backward.md) in two passes.
Per channel (``forward_channels``), every channel is its own recurrence: tiles of frames, each frame a step over
a block of channels as vectors; the backward recomputes each tile's moments and roots from the moments that
entered it, which the forward kept (two numbers a channel every 16 frames, in place of two arrays of x's size).

A pooled sequence is a 2-D array in one of two orientations: ``(C, T)`` with time contiguous ("b c t") or
``(T, C)`` with channels contiguous ("b t c"); each has its own loops, so that the inner loop always runs over
contiguous memory. ``AVAILABLE`` is False where numba is not installed: the backend then keeps its torch path.
"""
from __future__ import annotations

import math

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover (numba is a dependency; a broken install keeps the torch path)
    numba = None

AVAILABLE = numba is not None
_TINY = float(np.finfo(np.float64).tiny)
# reassociation lets the compiler vectorize the sums; no 'nnan' / 'ninf': NaNs and infinities propagate as in torch
_OPTS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract", "nsz"})


# without 'reassoc' where a value is taken relative to a shift and then to a mean ((x - K) - mu): reassociated into
# x - (K + mu) it would round to K's ulp (per channel, a few frames after a far state: 1e-11 of y in float64)
_OPTS_ORDERED = dict(_OPTS, fastmath={"contract", "nsz"})


def _jit(f):
    return numba.njit(**_OPTS)(f) if AVAILABLE else f


def _jit_ordered(f):
    return numba.njit(**_OPTS_ORDERED)(f) if AVAILABLE else f


def _jit_inline(f):
    """_jit_ordered, inlined by numba into its callers: a call that passes arrays costs their reference counts
    (atomic operations), which a loop's body called once a frame cannot afford (steps of (2, 64, 499): 70 -> 45 µs)."""
    return numba.njit(inline="always", **_OPTS_ORDERED)(f) if AVAILABLE else f


@_jit
def _rstd(var, eps, inside):
    return 1.0 / math.sqrt(var + eps) if inside else 1.0 / (math.sqrt(max(var, _TINY)) + eps)


@_jit
def _welford(W, mu, M2, m, q, n, d):
    """One frame of n values (mean m, squares about it q), all relative to K, merged into (W, mu, M2)."""
    if d == 0.0:  # FRAME: the frame alone, its mean exact (mu + (m - mu) need not be m)
        return n, m, q
    dW = d * W
    Wn = dW + n
    delta = m - mu
    a = delta * (n / Wn)
    # from the heavier side (as state.merge): a light state far from the data leaves the frame's mean its digits
    return Wn, mu + a if dW >= n else m - delta * (dW / Wn), d * M2 + q + delta * a * dW


@_jit
def _var(M2, W):
    # a statistic of one value (C = 1, frame 0): var 1, as the general path's _live, so that y is 0 and dx finite
    return M2 / W if W > 1.0 else 1.0


@_jit
def forward(x, w, b, d, eps, inside, tc, y, mus, vars_, w0, m0, q0, final):
    """y of x ((B, C, T) as (B, C, T) arrays, or (B, T, C) where ``tc``); w, b: (C,) or empty; d: the decay
    (0 FRAME, 1 CUMULATIVE); the running mean (relative to K) and variance of each frame into mus, vars_
    (B, T) float64, where they have B rows (else not kept: a stream's hop). The incoming state's w, m, M2:
    (B,) float64 each, zeros for none; ``final``: the state after the last frame, (3, B)."""
    B = x.shape[0]
    C = x.shape[2] if tc else x.shape[1]
    T = x.shape[1] if tc else x.shape[2]
    keep = mus.shape[0] == B and vars_.shape[0] == B and mus.shape[1] == T and vars_.shape[1] == T
    dT, G = _outweighs(d, T, float(C))
    for bi in range(B):
        xb, yb = x[bi], y[bi]
        W, M2 = w0[bi], q0[bi]
        if W > 0 and W * dT > G:
            K = m0[bi]
        else:
            K = 0.0
            for c in range(C):
                K += xb[0, c] if tc else xb[c, 0]
            K /= C
        mu = m0[bi] - K if W > 0 else 0.0  # an empty state's mean is no value: frame 0's mean is exact
        if tc:  # frame after frame: each row is read from memory once
            for t in range(T):
                row = xb[t]
                s = 0.0
                for c in range(C):
                    s += row[c]
                mk = s / C
                q = 0.0
                for c in range(C):
                    v = row[c] - mk
                    q += v * v
                W, mu, M2 = _welford(W, mu, M2, mk - K, q, C, d)
                var = _var(M2, W)
                if keep:
                    mus[bi, t], vars_[bi, t] = mu, var
                r, xm = _rstd(var, eps, inside), mu + K
                yr = yb[t]
                if w.size and b.size:
                    for c in range(C):
                        yr[c] = (row[c] - xm) * r * w[c] + b[c]
                elif w.size:
                    for c in range(C):
                        yr[c] = (row[c] - xm) * r * w[c]
                else:
                    for c in range(C):
                        yr[c] = (row[c] - xm) * r + (b[c] if b.size else 0.0)
        else:  # channel rows: sums over C accumulate into per-frame arrays
            s = np.zeros(T)
            for c in range(C):
                row = xb[c]
                for t in range(T):
                    s[t] += row[t]
            mk = s / C
            q = np.zeros(T)
            for c in range(C):
                row = xb[c]
                for t in range(T):
                    v = row[t] - mk[t]
                    q[t] += v * v
            r = np.empty(T)
            xm = np.empty(T)
            for t in range(T):
                W, mu, M2 = _welford(W, mu, M2, mk[t] - K, q[t], C, d)
                var = _var(M2, W)
                if keep:
                    mus[bi, t], vars_[bi, t] = mu, var
                r[t], xm[t] = _rstd(var, eps, inside), mu + K
            for c in range(C):
                row, yr = xb[c], yb[c]
                g = w[c] if w.size else 1.0
                bb = b[c] if b.size else 0.0
                for t in range(T):
                    yr[t] = (row[t] - xm[t]) * (r[t] * g) + bb
        final[0, bi], final[1, bi], final[2, bi] = W, mu + K, M2


@_jit
def _frame_terms(var, mu, S, A, W, eps, inside):
    """A frame's r and the terms of the reverse scans: 2 G / W and (M - 2 G mu) / W, where dx = g r + U + (x - K) V."""
    if inside:
        r = 1.0 / math.sqrt(var + eps)
        half = -0.5 * r * r
    else:
        sig = math.sqrt(max(var, _TINY))
        r = 1.0 / (sig + eps)
        half = 0.0 if var < _TINY else -0.5 * r / sig
    G2 = 2.0 * half * S if W > 1.0 else 0.0
    return r, G2 / W, (-r * A - G2 * mu) / W


@_jit
def backward(x, gy, w, mus, vars_, d, eps, inside, tc, dx, dw, db):
    """dx (x's arrays), and dL/dgamma, dL/dbeta added into dw, db ((C,) float64, zeroed by the caller)."""
    B = x.shape[0]
    C = x.shape[2] if tc else x.shape[1]
    T = x.shape[1] if tc else x.shape[2]
    for bi in range(B):
        xb, gb, db_, mb, vb = x[bi], gy[bi], dx[bi], mus[bi], vars_[bi]
        K = 0.0
        for c in range(C):
            K += xb[0, c] if tc else xb[c, 0]
        K /= C
        A = np.zeros(T)
        S = np.zeros(T)
        r = np.empty(T)
        for t in range(T):
            r[t] = _rstd(vb[t], eps, inside)
        if tc:
            for t in range(T):
                row, grow = xb[t], gb[t]
                xm, rt = mb[t] + K, r[t]
                a = s = 0.0
                for c in range(C):
                    g = grow[c]
                    xh = (row[c] - xm) * rt
                    gg = g * w[c] if w.size else g
                    a += gg
                    s += gg * xh
                    dw[c] += g * xh
                    db[c] += g
                A[t], S[t] = a, s
        else:
            for c in range(C):
                row, grow = xb[c], gb[c]
                wc = w[c] if w.size else 1.0
                sw = sb = 0.0
                for t in range(T):
                    g = grow[t]
                    xh = (row[t] - mb[t] - K) * r[t]
                    A[t] += wc * g
                    S[t] += wc * g * xh
                    sw += g * xh
                    sb += g
                dw[c] += sw
                db[c] += sb
        # W_t = d W_(t-1) + C, forward; then U and V, reverse decayed cumsums, walked back
        Ws = np.empty(T)
        W = 0.0
        for t in range(T):
            W = d * W + C
            Ws[t] = W
        u = v = 0.0
        if tc:
            for t in range(T - 1, -1, -1):
                rt, gv, gu = _frame_terms(vb[t], mb[t], S[t], A[t], Ws[t], eps, inside)
                v = v * d + gv
                u = u * d + gu
                row, grow, out = xb[t], gb[t], db_[t]
                for c in range(C):
                    gg = grow[c] * w[c] if w.size else grow[c]
                    out[c] = gg * rt + u + (row[c] - K) * v
        else:
            U = np.empty(T)
            V = np.empty(T)
            for t in range(T - 1, -1, -1):
                rt, gv, gu = _frame_terms(vb[t], mb[t], S[t], A[t], Ws[t], eps, inside)
                v = v * d + gv
                u = u * d + gu
                U[t], V[t] = u, v
            for c in range(C):
                row, grow, out = xb[c], gb[c], db_[c]
                wc = w[c] if w.size else 1.0
                for t in range(T):
                    out[t] = wc * grow[t] * r[t] + U[t] + (row[t] - K) * V[t]


@_jit
def _outweighs(d, T, n):
    """(d^T, n G): an incoming state of weight W still outweighs T frames of weight n at the last one where
    W d^T > n G, G = 1 + d + ... + d^(T-1). Then its mean is the shift, so that the mean returned keeps every
    digit of it; frame 0's is, where the frames outweigh it (a state that an EMA forgets, far from the data, would
    cost M2 digits)."""
    dT = d ** T
    return dT, n * (float(T) if d == 1.0 else (1.0 - dT) / (1.0 - d))


TILE = 16  # frames a per-channel tile holds: each step runs over contiguous channels, as vectors


@_jit_inline
def _load_tile(x, bi, t0, n, c0, K, u):
    """Frames t0 .. t0 + n of sequence bi of a (B, T, C) array, channels c0 .. c0 + C (C: u's width), relative to
    each channel's shift, into u's rows (n, C) float64. Frame after frame: a tile's lines stay in the cache while
    its frames are read; each frame's channels are a row slice, one vector load where channels are contiguous
    ("b t c" memory: the slice of a C-ordered array is C-ordered, where an index c0 + c would keep a test for
    negative indices in the loop)."""
    C = u.shape[1]
    for j in range(n):
        row, uj = x[bi, t0 + j, c0:c0 + C], u[j]
        for c in range(C):
            uj[c] = row[c] - K[c]


@_jit_inline
def _store_tile(out, y, bi, t0, n, c0):
    C = out.shape[1]
    for j in range(n):
        row, oj = y[bi, t0 + j, c0:c0 + C], out[j]
        for c in range(C):
            row[c] = oj[c]


@_jit_ordered
def _chan_step(v, mu, M2, d, dW, inv):
    """Welford's step of one channel by a value v (relative to its shift): the new mean from the heavier side (as
    _welford), and M2."""
    delta = v - mu
    a = delta * inv
    return (mu + a if dW >= 1.0 else v - delta * (dW * inv)), d * M2 + delta * a * dW


@_jit_ordered
def _root(a):
    """1 / sqrt(a) for a within 1e-30 to 1e30: float32's root (eight lanes where float64 has four, its divider a
    fraction of float64's cost a lane) and one Newton step in float64, 2e-14 of r. Without the step (1e-7 of r)
    float32 gradients lost a digit where the mean drifts far from the shift (dx 2.8e-8 -> 2.7e-7 of the
    reference's) for 5 % of the forward's time."""
    r0 = np.float64(np.float32(1.0) / np.sqrt(np.float32(a)))
    return r0 * (1.5 - 0.5 * a * r0 * r0)


@_jit_ordered
def _rstd_row(v, j, eps, inside, r):
    """r[j] = _rstd(v[j]) over a row of channels: _root where eps is inside and every v + eps lies within its
    range; the exact root for a row that has any value outside (or a NaN), or eps outside. Rows of tiles with
    their index, as _exact_y."""
    C = v.shape[1]
    bad = not inside
    if inside:
        for c in range(C):
            a = v[j, c] + eps
            bad += not (1e-30 < a < 1e30)
            r[j, c] = _root(min(max(a, 1e-30), 1e30))
    if bad:
        for c in range(C):
            r[j, c] = _rstd(v[j, c], eps, inside)


@_jit_ordered
def _value_step(v, mu, M2, d, dW, inv, live, eps):
    """One channel's frame, eps inside: _chan_step's mean and M2, the variance, r by _root, and whether var + eps
    fell outside _root's range (then r is the caller's to redo exactly)."""
    m, q = _chan_step(v, mu, M2, d, dW, inv)
    var = q * inv if live else 1.0
    a = var + eps
    return m, q, var, _root(min(max(a, 1e-30), 1e30)), not (1e-30 < a < 1e30)


@_jit_inline
def _steps(uj, mu, M2, v, d, dW, inv, live, eps, r, dv):
    """One frame of a block's channels that share one weight, in one pass (_value_step): var into v, r, and x - mu
    into dv. Returns how many channels' r is the caller's to redo (_rstd_row)."""
    bad = 0
    for c in range(uj.shape[0]):
        m, q, var, rc, out = _value_step(uj[c], mu[c], M2[c], d, dW, inv, live, eps)
        mu[c], M2[c], v[c], r[c], dv[c] = m, q, var, rc, uj[c] - m
        bad += out
    return bad


@_jit_inline
def _frame_y(uj, mu, M2, d, dW, inv, live, eps, g, bb, oj):
    """_steps for the forward: y written in the same pass (into oj). Where it returns nonzero, y is the caller's
    to redo (_exact_y)."""
    bad = 0
    for c in range(uj.shape[0]):
        m, q, _, rc, out = _value_step(uj[c], mu[c], M2[c], d, dW, inv, live, eps)
        mu[c], M2[c], oj[c] = m, q, (uj[c] - m) * (rc * g[c]) + bb[c]
        bad += out
    return bad


@_jit_ordered
def _exact_y(u, j, mu, M2, inv, live, eps, g, bb, out):
    """y of frame j of a tile that _frame_y took (its moments in mu, M2) again with the exact root (eps inside).
    The tile and its index, not the frame's row: a view made for a call costs its reference count at every
    frame, the call taken or not (forward 96 -> 124 µs)."""
    for c in range(u.shape[1]):
        out[j, c] = (u[j, c] - mu[c]) * (_rstd(M2[c] * inv if live else 1.0, eps, True) * g[c]) + bb[c]


@_jit_ordered
def _frames(u, n, mu, M2, W, d, eps, inside, g, bb, v, r, out):
    """The n frames of a tile where channels' weights differ (an incoming state's) or eps is outside the root:
    _frame_y's steps with a weight a channel, the root by _rstd_row."""
    C = u.shape[1]
    for j in range(n):
        uj, oj = u[j], out[j]
        for c in range(C):
            dW = d * W[c]
            Wn = dW + 1.0
            inv = 1.0 / Wn
            mu[c], M2[c] = _chan_step(uj[c], mu[c], M2[c], d, dW, inv)
            v[0, c] = M2[c] * inv if Wn > 1.0 else 1.0
            W[c] = Wn
        _rstd_row(v, 0, eps, inside, r)
        for c in range(C):
            oj[c] = (uj[c] - mu[c]) * (r[0, c] * g[c]) + bb[c]


@_jit_ordered
def _forward_block(x, w, b, d, eps, inside, y, w0, m0, q0, final, ck, c0, c1):
    """forward_channels of channels c0 .. c1 (x, y: the whole (B, T, C) arrays; the others the block's own, ck
    (B, _rows(T), c1 - c0) or empty). Frames go in tiles of TILE, each frame a step over the block's channels
    (independent recurrences side by side, as vectors)."""
    B, T, C = x.shape[0], x.shape[1], c1 - c0
    keep = ck.size > 0
    K, W, mu, M2 = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    g, bb = np.ones(C), np.zeros(C)
    for c in range(C):
        if w.size:
            g[c] = w[c]
        if b.size:
            bb[c] = b[c]
    u, out = np.empty((TILE, C)), np.empty((TILE, C))
    v, r = np.empty((1, C)), np.empty((1, C))
    dT, G = _outweighs(d, T, 1.0)
    for bi in range(B):
        same = True  # one weight for every channel (no state, or normlib's): W_t, 1 / W_t once a frame
        for c in range(C):
            Wc = w0[bi, c]
            K[c] = m0[bi, c] if Wc > 0 and Wc * dT > G else x[bi, 0, c0 + c]
            mu[c] = m0[bi, c] - K[c] if Wc > 0 else 0.0
            W[c], M2[c] = Wc, q0[bi, c]
            same = same and Wc == w0[bi, 0]
        W0 = w0[bi, 0] if C else 0.0
        fast = same and inside
        for t0 in range(0, T, TILE):
            n = min(TILE, T - t0)
            _load_tile(x, bi, t0, n, c0, K, u)
            if keep:  # the moments entering the tile: the backward recomputes its frames from them
                k0, k1 = ck[bi, 2 * (t0 // TILE)], ck[bi, 2 * (t0 // TILE) + 1]
                for c in range(C):
                    k0[c], k1[c] = mu[c], M2[c]
            if fast:  # one pass a frame; _frame_y's rare frame outside its root's range again exactly
                for j in range(n):
                    dW = d * W0
                    W0 = dW + 1.0
                    inv = 1.0 / W0
                    if _frame_y(u[j], mu, M2, d, dW, inv, W0 > 1.0, eps, g, bb, out[j]):
                        _exact_y(u, j, mu, M2, inv, W0 > 1.0, eps, g, bb, out)
            else:
                _frames(u, n, mu, M2, W, d, eps, inside, g, bb, v, r, out)
            _store_tile(out, y, bi, t0, n, c0)
        for c in range(C):
            final[0, bi, c], final[1, bi, c], final[2, bi, c] = W0 if fast else W[c], mu[c] + K[c], M2[c]


@_jit_ordered
def _backward_block(x, gy, w, d, eps, inside, dx, dw, db, ck, c0, c1):
    """backward_channels of channels c0 .. c1 (x, gy, dx whole, ck the block's own, as _forward_block's): the
    reverse scans, tile by tile from the last frame, each tile's moments, roots and x - mu recomputed first from
    the moments that entered it (in the first-level cache: no array of x's size is kept for the backward)."""
    B, T, C = x.shape[0], x.shape[1], c1 - c0
    K, U, V, mu, M2 = np.empty(C), np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    Ws, dWs = np.empty(T), np.empty(T)
    W = 0.0
    for t in range(T):  # no state: one weight for every channel, rounded as the forward's (dW kept: no fma)
        dW = d * W
        W = dW + 1.0
        Ws[t], dWs[t] = W, dW
    g = np.ones(C)
    for c in range(C):
        if w.size:
            g[c] = w[c]
    u, gt, out = np.empty((TILE, C)), np.empty((TILE, C)), np.empty((TILE, C))
    dvs, rs, vs = np.empty((TILE, C)), np.empty((TILE, C)), np.empty((TILE, C))
    sw, sb = np.zeros(C), np.zeros(C)  # dgamma and dbeta here: dw and db are the caller's views
    zero = np.zeros(C)
    last = (T - 1) // TILE * TILE
    for bi in range(B):
        for c in range(C):
            K[c], U[c], V[c] = x[bi, 0, c0 + c], 0.0, 0.0
        for t0 in range(last, -1, -TILE):
            n = min(TILE, T - t0)
            _load_tile(x, bi, t0, n, c0, K, u)
            _load_tile(gy, bi, t0, n, c0, zero, gt)
            k0, k1 = ck[bi, 2 * (t0 // TILE)], ck[bi, 2 * (t0 // TILE) + 1]
            for c in range(C):
                mu[c], M2[c] = k0[c], k1[c]
            for j in range(n):  # the forward's steps, the same operations: the same values
                t = t0 + j
                dW, Wn = dWs[t], Ws[t]
                inv = 1.0 / Wn
                if _steps(u[j], mu, M2, vs[j], d, dW, inv, Wn > 1.0, eps, rs[j], dvs[j]) or not inside:
                    _rstd_row(vs, j, eps, inside, rs)
            for j in range(n - 1, -1, -1):
                t = t0 + j
                invW, live = 1.0 / Ws[t], Ws[t] > 1.0
                own = 1.0 - invW  # g dy r's part in dx beside its mean term's (0 where W = 1)
                uj, gj, oj, dj, rj, vj = u[j], gt[j], out[j], dvs[j], rs[j], vs[j]
                for c in range(C):  # _frame_terms with A = g dy and S = g dy x^, written out once a frame
                    gg = g[c] * gj[c]
                    dv, rt = dj[c], rj[c]
                    if inside:
                        G2 = -rt * rt * (gg * dv * rt) if live else 0.0
                    else:
                        var = vj[c]
                        sig = math.sqrt(max(var, _TINY))
                        G2 = -rt / sig * (gg * dv * rt) if live and var >= _TINY else 0.0
                    xh = dv * rt
                    sw[c] += gj[c] * xh
                    sb[c] += gj[c]
                    V[c] = V[c] * d + G2 * invW
                    # the frame's own mean term, -g dy r / W, taken from g dy r before the sum: where the frame
                    # holds all the weight (frame 0 without a state: W = 1) the two cancel exactly, not to the
                    # rounding of g dy r, which outweighed the rest of dx by 1e32 where x was 1e16
                    Up, ggr = U[c] * d - G2 * (uj[c] - dv) * invW, gg * rt
                    U[c] = Up - ggr * invW
                    oj[c] = ggr * own + Up + uj[c] * V[c]
            _store_tile(out, dx, bi, t0, n, c0)
    for c in range(C):
        dw[c] += sw[c]
        db[c] += sb[c]


CHANNELS = 64  # a block of channels: a tile of its frames, and their lines of x, stay in the first-level cache


@_jit_ordered
def _block(x):
    """Channels a block: half as many where each channel's row is more than half a page from the next, so that a
    tile's rows stay within the TLB ((16, 512, 1000): forward 49 -> 30 ms; (4, 512, 4000): 34 -> 27 ms; at (2, 64,
    500) the full block is faster)."""
    return CHANNELS if x.strides[2] <= 2048 else CHANNELS // 2


@_jit_ordered
def _rows(T):
    """Rows a sequence's checkpoint holds: each tile's incoming mean and M2."""
    return 2 * ((T + TILE - 1) // TILE)


@_jit_ordered
def _blocked(a, B, T, c0, c1):
    """Channels c0 .. c1 of a saved (B, T, C) statistic stored block after block: each block's (B, T, c1 - c0)
    part is contiguous, so that a frame's row of it is one vector (empty where none is kept)."""
    return a[B * T * c0:B * T * c1].reshape((B, T, c1 - c0)) if a.size else a[:0].reshape((0, 0, 0))


@_jit_ordered
def forward_channels(x, w, b, d, eps, inside, y, w0, m0, q0, final, ck):
    """The per-channel norms (ccln, ccemaln): y of x ((B, T, C) arrays in any strides: a "b c t" tensor's view
    transposed, a "b t c" one's own), each channel its own running statistics, shifted by its frame 0 (or the
    state's mean, _outweighs); w, b: (C,) or empty. The incoming state's w, m, M2: (B, C) float64 each (zeros for
    none); ``final``: the state after the last frame, (3, B, C). For the backward, where ck holds B _rows(T) C
    values (else empty): each tile's incoming mean (relative to the shift) and M2, rows 2k and 2k + 1 of tile k
    (_blocked). In blocks of CHANNELS channels."""
    B, T, C = x.shape
    # a hop of one tile without checkpoints: one block (a block's setup costs ~0.7 µs; the backward reads ck in
    # _block's blocks)
    cb = max(C, 1) if T <= TILE and ck.size == 0 else _block(x)
    for c0 in range(0, C, cb):
        c1 = min(c0 + cb, C)
        _forward_block(x, w[c0:c1] if w.size else w, b[c0:c1] if b.size else b, d, eps, inside, y,
                       w0[:, c0:c1], m0[:, c0:c1], q0[:, c0:c1], final[:, :, c0:c1], _blocked(ck, B, _rows(T), c0, c1),
                       c0, c1)


@_jit_ordered
def backward_channels(x, gy, w, d, eps, inside, dx, dw, db, ck):
    """dx of forward_channels without a state, from x and the forward's ck, and dL/dgamma, dL/dbeta added
    into dw, db ((C,) float64, zeroed by the caller); arrays as forward_channels', in blocks of CHANNELS channels:
    _PooledNorm's formula with one value a frame, its reverse scans tile by tile from the last frame."""
    B, T, C = x.shape
    cb = _block(x)
    for c0 in range(0, C, cb):
        c1 = min(c0 + cb, C)
        _backward_block(x, gy, w[c0:c1] if w.size else w, d, eps, inside, dx, dw[c0:c1], db[c0:c1],
                        _blocked(ck, B, _rows(T), c0, c1), c0, c1)
