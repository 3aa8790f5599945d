"""Independent float64 / pure-Python oracles (written from DESIGN.md, not from the code)."""

from __future__ import annotations

import numpy as np
import torch


def gae_loop(reward, value, next_value, terminated, done, gamma, lmbda, time_dim=-2):
    """GAE by a reverse loop in float64; inputs any array-likes of one shape."""
    r = np.asarray(torch.as_tensor(reward).double().numpy())
    v = np.asarray(torch.as_tensor(value).double().numpy())
    nv = np.asarray(torch.as_tensor(next_value).double().numpy())
    term = np.asarray(torch.as_tensor(terminated).numpy()).astype(bool)
    dn = np.asarray(torch.as_tensor(done).numpy()).astype(bool)
    axis = time_dim % r.ndim
    r, v, nv, term, dn = (np.moveaxis(a, axis, 0) for a in (r, v, nv, term, dn))
    adv = np.zeros_like(r)
    last = np.zeros_like(r[0])
    for t in range(r.shape[0] - 1, -1, -1):
        bootstrap = np.where(term[t], 0.0, nv[t])
        delta = r[t] + gamma * bootstrap - v[t]
        last = delta + gamma * lmbda * np.where(dn[t], 0.0, last)
        adv[t] = last
    adv = np.moveaxis(adv, 0, axis)
    return adv, adv + np.moveaxis(v, 0, axis)


def segment_sum_loop(x, carry_on, decay, time_dim=-2):
    """``y[t] = x[t] + decay * carry_on[t] * y[t + 1]`` in float64."""
    a = torch.as_tensor(x).double().numpy()
    keep = torch.as_tensor(carry_on).numpy().astype(bool)
    axis = time_dim % a.ndim
    a, keep = np.moveaxis(a, axis, 0), np.moveaxis(keep, axis, 0)
    y = np.zeros_like(a)
    nxt = np.zeros_like(a[0])
    for t in range(a.shape[0] - 1, -1, -1):
        nxt = a[t] + decay * np.where(keep[t], nxt, 0.0)
        y[t] = nxt
    return np.moveaxis(y, 0, axis)


def close(got, want, rtol: float, what: str = "result") -> str | None:
    """None when ``got`` is within ``rtol * (1 + max|want|)`` of ``want`` everywhere."""
    g = torch.as_tensor(got).detach().double().cpu().numpy()
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        return f"{what} has shape {list(g.shape)}, expected {list(w.shape)}"
    if not np.isfinite(g).all():
        return f"{what} holds NaN/inf"
    if g.size == 0:
        return None
    err = float(np.abs(g - w).max())
    scale = 1.0 + float(np.abs(w).max())
    if err > rtol * scale:
        return f"{what} off by {err:.3g} (tolerance {rtol * scale:.3g})"
    return None


def starts_loop(done, is_init=None):
    """``[W][T]`` episode-fragment starts."""
    d = torch.as_tensor(done).tolist()
    init = torch.as_tensor(is_init).tolist() if is_init is not None else None
    out = []
    for w, row in enumerate(d):
        out.append(
            [t == 0 or bool(row[t - 1]) or bool(init and init[w][t]) for t in range(len(row))]
        )
    return out


def ids_loop(start):
    """Row-major fragment numbers."""
    n = -1
    out = []
    for row in torch.as_tensor(start).tolist():
        r = []
        for s in row:
            if s:
                n += 1
            r.append(n)
        out.append(r)
    return out


def chunk_loop(start, length):
    """``(sequence_id, offset)`` as nested lists; each row starts a fragment."""
    sid, off = [], []
    n = -1
    for row in torch.as_tensor(start).tolist():
        ri, ro = [], []
        pos = 0
        for t, s in enumerate(row):
            if s or t == 0:
                pos = 0
            if length is None:
                first = pos == 0
                o = pos
            else:
                first = pos % length == 0
                o = pos % length
            if first:
                n += 1
            ri.append(n)
            ro.append(o)
            pos += 1
        sid.append(ri)
        off.append(ro)
    return sid, off


def sequences_loop(sequence_id, num_time):
    """Lists of flat step indices per sequence, in order."""
    seqs: dict[int, list[int]] = {}
    for flat, s in enumerate(torch.as_tensor(sequence_id).flatten().tolist()):
        seqs.setdefault(s, []).append(flat)
    return [seqs[k] for k in sorted(seqs)]


def pad_loop(x: torch.Tensor, seqs, batch_dims: int = 2):
    """``[N, Lp, *F]`` padded by a loop (zeros after each sequence)."""
    count = 1
    for d in x.shape[:batch_dims]:
        count *= d
    steps = x.reshape(count, *x.shape[batch_dims:])
    lp = max((len(s) for s in seqs), default=0)
    out = torch.zeros((len(seqs), lp, *steps.shape[1:]), dtype=x.dtype)
    for i, s in enumerate(seqs):
        for j, flat in enumerate(s):
            out[i, j] = steps[flat]
    return out


def random_rollout_flags(gen: torch.Generator, w: int, t: int, p_term: float, p_trunc: float):
    """``(terminated, truncated, done)`` ``[W, T, 1]`` bool with the given rates."""
    term = torch.rand(w, t, 1, generator=gen) < p_term
    trunc = torch.rand(w, t, 1, generator=gen) < p_trunc
    return term, trunc, term | trunc


def masked_stats_loop(x, mask, eps=1e-8):
    """``(masked_mean, masked_normalize)`` in float64 by a loop over real positions."""
    a = torch.as_tensor(x).double().numpy()
    m = torch.as_tensor(mask).numpy().astype(bool)
    vals = [a[idx] for idx in np.ndindex(*m.shape) if m[idx]]
    flat = np.concatenate([np.ravel(v) for v in vals]) if vals else np.zeros(0)
    mean = flat.mean() if flat.size else 0.0
    std = np.sqrt(((flat - mean) ** 2).mean()) if flat.size else 0.0
    out = np.zeros_like(a)
    for idx in np.ndindex(*m.shape):
        if m[idx]:
            out[idx] = (a[idx] - mean) / (std + eps)
    return mean, out
