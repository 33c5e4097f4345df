"""fmha_native.reference: the float64 NumPy oracle the tests hold every backend to.

Owns the slow, obviously-correct statement of the contract in DESIGN.md section 2:
scores over a masked matrix, a plain (not online) softmax, GQA by head repetition,
bottom-right causal alignment per batch entry, rows that see no key giving out = 0 and
lse = -inf, the KV-cache append, and the merge of partial states (combine).

It shares no code with the C backends on purpose: an oracle that reused their tiling or
their online softmax would agree with their bugs.  Everything is float64; inputs are
converted once, after any rounding to the caller's dtype has already happened, so the
only differences against a backend are the backend's own arithmetic and its final
rounding.
"""
import math

import numpy as np

__all__ = ["forward", "combine", "append_kv", "to_float64", "dtype_name"]

# Score-matrix elements computed at once per (batch, head) chunk: bounds the memory of
# long sequences (4097 x 4097 float64 would be 134 MB per head) at about 32 MB.
_MAX_CHUNK_ELEMENTS = 1 << 22


def dtype_name(dtype):
    """A dtype as users name it: 'float32', 'int64', 'bfloat16', 'big-endian float32'
    (NumPy's str() gives '>f4', torch's 'torch.float32')."""
    if type(dtype).__module__.startswith("torch"):
        return str(dtype).replace("torch.", "", 1)
    dtype = np.dtype(dtype)
    name = dtype.name
    if dtype.byteorder == (">" if np.little_endian else "<") and dtype.itemsize > 1:
        name = ("big-endian " if np.little_endian else "little-endian ") + name
    return name


def to_float64(x, name="x"):
    """Return x as a float64 NumPy array (a copy; never a view of the caller's memory).

    Accepts NumPy arrays of any real dtype including ml_dtypes bfloat16, torch tensors
    on any device (through .float().cpu(): NumPy cannot read torch bfloat16), CuPy
    arrays (through .get()), and anything else np.asarray understands.  Complex, text,
    object and date values raise TypeError naming x by name and its dtype.
    """
    module = type(x).__module__ or ""
    if module.startswith("torch"):
        if x.is_complex():
            raise TypeError(f"{name} must hold real numbers, got {dtype_name(x.dtype)}")
        x = x.detach().float().cpu().numpy()
    elif module.startswith("cupy"):
        x = x.get()
    arr = np.asarray(x)
    if arr.dtype.kind in "cUSOMmV" and not _is_ml_float(arr.dtype):
        raise TypeError(f"{name} must hold real numbers, got {dtype_name(arr.dtype)}")
    return np.array(arr, dtype=np.float64, copy=True)


def _is_ml_float(dtype):
    """ml_dtypes' float types (bfloat16, float8_*): NumPy kind 'V', but real numbers
    that cast to float64 (raw bytes and records do not)."""
    return (dtype.kind == "V" and dtype.names is None and dtype.subdtype is None
            and np.can_cast(dtype, np.float64))


def _check_4d(name, x):
    if x.ndim != 4:
        raise ValueError(f"{name} must be 4-D [batch, seqlen, heads, head_dim], got shape {x.shape}")


def _key_lengths(batch, seqlen_k, cache_seqlens, seqlen_new):
    """Valid keys per batch entry: the capacity, or cache_seqlens[b] + seqlen_new."""
    if cache_seqlens is None:
        return np.full(batch, seqlen_k, dtype=np.int64)
    lengths = np.asarray(to_float64(cache_seqlens, "cache_seqlens"), dtype=np.int64).reshape(-1)
    if lengths.shape != (batch,):
        raise ValueError(f"cache_seqlens must have shape ({batch},), got {lengths.shape}")
    total = lengths + seqlen_new
    if (lengths < 0).any() or (total > seqlen_k).any():
        raise ValueError(f"cache_seqlens + seqlen_new must lie in [0, {seqlen_k}], got {total}")
    return total


def append_kv(k, v, cache_seqlens, k_new, v_new):
    """The caches after appending: copies of k and v with k_new[b, t] / v_new[b, t]
    written at row cache_seqlens[b] + t.  Rows outside that range keep their values.

    k, v: [batch, capacity, heads_kv, head_dim]; k_new, v_new: [batch, seqlen_new,
    heads_kv, head_dim]; cache_seqlens: [batch] integers.  Returns float64 arrays.
    """
    k_out, v_out = to_float64(k, "k"), to_float64(v, "v")
    k_add, v_add = to_float64(k_new, "k_new"), to_float64(v_new, "v_new")
    for name, x in (("k", k_out), ("v", v_out), ("k_new", k_add), ("v_new", v_add)):
        _check_4d(name, x)
    if k_add.shape != v_add.shape:
        raise ValueError(f"k_new {k_add.shape} and v_new {v_add.shape} must have the same shape")
    batch, capacity = k_out.shape[:2]
    seqlen_new = k_add.shape[1]
    lengths = _key_lengths(batch, capacity, cache_seqlens, seqlen_new) - seqlen_new
    for b in range(batch):
        start = int(lengths[b])
        k_out[b, start:start + seqlen_new] = k_add[b]
        v_out[b, start:start + seqlen_new] = v_add[b]
    return k_out, v_out


def _attend_one_head(q_bh, k_bh, v_bh, scale, causal, key_len):
    """One (batch, head): q_bh [seqlen_q, d], k_bh/v_bh [seqlen_k, d] -> (out, lse)."""
    seqlen_q, head_dim = q_bh.shape
    out = np.zeros((seqlen_q, head_dim))
    lse = np.full(seqlen_q, -np.inf)
    if seqlen_q == 0 or key_len == 0:
        return out, lse
    keys = k_bh[:key_len]
    values = v_bh[:key_len]
    # Bottom-right alignment: the last query row lines up with the last valid key.
    diagonal = key_len - seqlen_q
    rows_per_chunk = max(1, _MAX_CHUNK_ELEMENTS // key_len)
    key_index = np.arange(key_len)
    for r0 in range(0, seqlen_q, rows_per_chunk):
        rows = np.arange(r0, min(seqlen_q, r0 + rows_per_chunk))
        scores = scale * (q_bh[rows] @ keys.T)
        if causal:
            visible = key_index[None, :] <= rows[:, None] + diagonal
            scores = np.where(visible, scores, -np.inf)
        row_max = scores.max(axis=1, keepdims=True)
        # A row with no visible key has max -inf; shifting it by 0 keeps exp() at 0
        # instead of producing inf - inf.  NaN rows keep their NaN max and stay NaN.
        shift = np.where(np.isneginf(row_max), 0.0, row_max)
        with np.errstate(invalid="ignore", over="ignore"):
            weights = np.exp(scores - shift)
            total = weights.sum(axis=1, keepdims=True)
            empty = total == 0.0
            probs = weights / np.where(empty, 1.0, total)
        with np.errstate(divide="ignore", invalid="ignore"):
            lse[rows] = np.where(empty[:, 0], -np.inf, np.log(total[:, 0]) + shift[:, 0])
        out[rows] = probs @ values
    return out, lse


def forward(q, k, v, *, causal=False, softmax_scale=None, return_lse=True,
            cache_seqlens=None, k_new=None, v_new=None):
    """Attention forward in float64: the contract of fmha_native.forward, slowly.

    q [batch, seqlen_q, heads_q, head_dim]; k, v [batch, seqlen_k, heads_kv, head_dim].
    Returns (out, lse) as float64: out [batch, seqlen_q, heads_q, head_dim],
    lse [batch, heads_q, seqlen_q] (natural log); only out when return_lse is False.

    cache_seqlens [batch]: batch entry b attends to its first cache_seqlens[b] keys.
    k_new, v_new [batch, seqlen_new, heads_kv, head_dim] (with cache_seqlens): appended at
    row cache_seqlens[b] of copies of k and v (the inputs are never modified; use
    append_kv for the expected caches), and attention then covers
    cache_seqlens[b] + seqlen_new keys.  Causal alignment uses each entry's own length.
    """
    qf, kf, vf = to_float64(q, "q"), to_float64(k, "k"), to_float64(v, "v")
    for name, x in (("q", qf), ("k", kf), ("v", vf)):
        _check_4d(name, x)
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together")
    if k_new is not None and cache_seqlens is None:
        raise ValueError("k_new/v_new need cache_seqlens")
    seqlen_new = 0
    if k_new is not None:
        seqlen_new = np.shape(k_new)[1]
        kf, vf = append_kv(kf, vf, cache_seqlens, k_new, v_new)

    batch, seqlen_q, heads_q, head_dim = qf.shape
    if kf.shape != vf.shape or kf.shape[0] != batch or kf.shape[3] != head_dim:
        raise ValueError(f"k {kf.shape} and v {vf.shape} must be [batch={batch}, seqlen_k, "
                         f"heads_kv, head_dim={head_dim}]")
    seqlen_k, heads_kv = kf.shape[1], kf.shape[2]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    group = heads_q // heads_kv
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    lengths = _key_lengths(batch, seqlen_k, cache_seqlens, seqlen_new)

    out = np.zeros((batch, seqlen_q, heads_q, head_dim))
    lse = np.full((batch, heads_q, seqlen_q), -np.inf)
    for b in range(batch):
        for h in range(heads_q):
            kv_head = h // group
            out[b, :, h], lse[b, h] = _attend_one_head(
                qf[b, :, h], kf[b, :, kv_head], vf[b, :, kv_head], scale, causal,
                int(lengths[b]))
    return (out, lse) if return_lse else out


def combine(outs, lses):
    """Merge partial attention states in float64.

    outs [G, batch, seqlen_q, heads, head_dim], each normalised by its own row sum;
    lses [G, batch, heads, seqlen_q] their log-sum-exps.  Returns (out, lse) with
    lse = log(sum_g exp(lse_g)) and out = sum_g exp(lse_g - lse) * out_g.  Partials with
    lse = -inf contribute nothing (even if their out holds garbage); a row whose every
    partial is -inf gives out = 0, lse = -inf.
    """
    o = to_float64(outs, "outs")
    l = to_float64(lses, "lses")
    if o.ndim != 5 or l.ndim != 4:
        raise ValueError(f"outs must be 5-D and lses 4-D, got {o.shape} and {l.shape}")
    groups, batch, seqlen_q, heads, head_dim = o.shape
    if l.shape != (groups, batch, heads, seqlen_q):
        raise ValueError(f"lses must have shape {(groups, batch, heads, seqlen_q)}, got {l.shape}")
    lse_max = l.max(axis=0) if groups else np.full((batch, heads, seqlen_q), -np.inf)
    shift = np.where(np.isneginf(lse_max), 0.0, lse_max)
    with np.errstate(invalid="ignore"):
        weights = np.exp(l - shift[None])  # [G, batch, heads, seqlen_q]
    total = weights.sum(axis=0)
    empty = total == 0.0
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, np.log(np.where(empty, 1.0, total)) + shift)
    norm = weights / np.where(empty, 1.0, total)[None]
    # Weights to [G, batch, seqlen_q, heads, 1] to scale the partial outputs; empty
    # partials are masked out so garbage (even NaN) in their out cannot leak in.
    norm_o = np.transpose(norm, (0, 1, 3, 2))[..., None]
    contributes = norm_o > 0.0
    out = np.where(contributes, norm_o * np.where(contributes, o, 0.0), 0.0).sum(axis=0)
    return out, lse
