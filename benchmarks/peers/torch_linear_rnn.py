"""PyTorch chunkwise-parallel linear RNNs, written from the papers' chunked algorithms: gated
linear attention with a per-key-dimension gate (Yang, Wang, Shen, Panda, Kim, "Gated Linear
Attention Transformers with Hardware-Efficient Training", 2024: intra-chunk masked scores with
secondary chunking, inter-chunk state recurrence) and the gated delta rule (Yang, Kautz,
Hatamizadeh, "Gated Delta Networks", 2025; the UT transform of Yang et al. 2024, "Parallelizing
Linear Transformers with the Delta Rule over Sequence Length").

The same algorithm as `sptlib.kernels.linear_rnn` (what the benchmark compares is the framework,
not the maths): layout `[batch, length, heads, d]`, state `[batch, heads, d_k, d_v]`, log gates,
float32, autograd for the backward pass. Lengths must be a multiple of the chunk.
"""

import math

import torch


def _tril(c, strict=False, device=None):
    i = torch.arange(c, device=device)
    return i[:, None] > i[None, :] if strict else i[:, None] >= i[None, :]


def _sub_size(c):
    r = math.isqrt(c)
    r += r * r < c
    return next(s for s in range(min(r, c), 0, -1) if c % s == 0)


def _chunk(x, c):
    """[b, l, h, ...] -> [b, h, n, c, ...]."""
    b, l = x.shape[:2]
    return x.reshape(b, l // c, c, *x.shape[2:]).movedim(3, 1)


def _unchunk(o):
    o = o.movedim(1, 3)
    return o.reshape(o.shape[0], -1, *o.shape[3:])


def decayed_scores(x, y, cum):
    """s[t, j] = sum_d x_td y_jd exp(cum_td - cum_jd), j <= t; every exponent formed <= 0."""
    *lead, c, d = x.shape
    s = _sub_size(c)
    n = c // s
    xs, ys, cs = (z.reshape(*lead, n, s, d) for z in (x, y, cum))
    diff = cs[..., :, None, :] - cs[..., None, :, :]
    diff = diff.masked_fill(~_tril(s, device=x.device)[:, :, None], float("-inf"))
    diag = torch.einsum("...td,...jd,...tjd->...tj", xs, ys, diff.exp())
    if n == 1:
        return diag.reshape(*lead, c, c)
    r = cs[..., :-1, -1, :]
    xt = xs[..., 1:, :, :] * (cs[..., 1:, :, :] - r[..., :, None, :]).exp()
    before = torch.arange(n - 1, device=x.device)[None, :] < torch.arange(1, n, device=x.device)[:, None]
    ee = (r[..., :, None, None, :] - cs[..., None, :-1, :, :]).masked_fill(
        ~before[:, :, None, None], float("-inf"))
    yt = ys[..., None, :-1, :, :] * ee.exp()
    off = torch.einsum("...itd,...ijsd->...itjs", xt, yt)
    full = x.new_zeros(*lead, n, s, n, s)
    full[..., 1:, :, :-1, :] = off
    full = full + diag[..., :, :, None, :] * torch.eye(n, device=x.device)[:, None, :, None]
    return full.reshape(*lead, c, c)


def gla_chunked(q, k, v, log_decay, chunk_size=64):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t; log_decay `[b, l, h, d_k]`."""
    c = chunk_size
    qc, kc, vc, gc = (_chunk(x, c) for x in (q, k, v, log_decay))
    cum = gc.cumsum(-2)
    a = decayed_scores(qc, kc, cum)
    q_in = qc * cum.exp()
    k_out = kc * (cum[..., -1:, :] - cum).exp()
    decay = cum[..., -1, :].exp()  # [b, h, n, d_k]
    ds = torch.einsum("bhnck,bhncv->bhnkv", k_out, vc)
    s = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    starts = []
    for i in range(qc.shape[2]):
        starts.append(s)
        s = decay[:, :, i, :, None] * s + ds[:, :, i]
    o = q_in @ torch.stack(starts, 2) + a @ vc
    return _unchunk(o), s


def gated_delta_chunked(q, k, v, beta, log_alpha, chunk_size=64):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t."""
    c = chunk_size
    qc, kc, vc = (_chunk(x, c) for x in (q, k, v))
    bc, gc = _chunk(beta, c), _chunk(log_alpha, c)  # [b, h, n, c]
    cum = gc.cumsum(-1)
    diff = (cum[..., :, None] - cum[..., None, :]).masked_fill(~_tril(c, device=q.device),
                                                               float("-inf"))
    gam = diff.exp()
    lower = (bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * gam).masked_fill(
        ~_tril(c, strict=True, device=q.device), 0.0)
    rhs = bc[..., None] * torch.cat([cum.exp()[..., None] * kc, vc], -1)
    eye = torch.eye(c, device=q.device)
    wu = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
    dk = k.shape[-1]
    w, u0 = wu[..., :dk], wu[..., dk:]
    k_out = kc * (cum[..., -1:] - cum).exp()[..., None]
    decay = cum[..., -1].exp()
    s = q.new_zeros(q.shape[0], q.shape[2], dk, v.shape[3])
    starts, us = [], []
    for i in range(qc.shape[2]):
        starts.append(s)
        u = u0[:, :, i] - w[:, :, i] @ s
        us.append(u)
        s = decay[:, :, i, None, None] * s + k_out[:, :, i].transpose(-1, -2) @ u
    a = (qc @ kc.transpose(-1, -2)) * gam
    o = (qc * cum.exp()[..., None]) @ torch.stack(starts, 2) + a @ torch.stack(us, 2)
    return _unchunk(o), s
