"""fmha_native.reference: the float64 NumPy oracle the tests hold every backend to.

Owns the slow, obviously-correct statement of the contract in DESIGN.md section 2:
scores over a masked matrix, a plain (not online) softmax, GQA by head repetition,
bottom-right causal alignment per sequence, sliding windows, logit softcapping and
attention sinks (issue 21), rows that see no key giving out = 0 and lse = -inf (or the
sink), the KV-cache append (dense or through a block table), packed (varlen)
sequences, an fp8 (float8 e4m3fn) KV cache with its scales and quantize-on-write append
(issue 22), and the merge of partial states (combine).  A paged cache is gathered into a
dense one and packed rows are split into one array per sequence before any attention
math, so the attention itself is written once, for one sequence.

It shares no code with the C backends on purpose: an oracle that reused their tiling or
their online softmax would agree with their bugs.  Everything is float64; inputs are
converted once, after any rounding to the caller's dtype has already happened, so the
only differences against a backend are the backend's own arithmetic and its final
rounding.
"""
import math

import numpy as np

__all__ = ["forward", "combine", "append_kv", "to_float64", "dtype_name", "e4m3_values",
           "quantize_e4m3", "fp8_codes"]

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


# ---------------------------------------------------------------------------- fp8 (e4m3fn)

def _e4m3_table():
    """The value of every float8 e4m3fn code, from its bit fields: sign, 4 exponent bits
    (bias 7), 3 mantissa bits; exponent 0 is subnormal (m * 2^-9), 0x7f and 0xff are NaN,
    and there are no infinities."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e, m = (codes >> 3) & 0xF, codes & 0x7
    mag = np.where(e == 0, m * 2.0 ** -9, 2.0 ** (e - 7.0) * (1.0 + m / 8.0))
    mag = np.where((codes & 0x7F) == 0x7F, np.nan, mag)
    return sign * mag


_E4M3 = _e4m3_table()
_E4M3_MAX = 448.0


def e4m3_values(codes):
    """float64 values of float8 e4m3fn codes (a uint8 array)."""
    return _E4M3[np.asarray(codes, dtype=np.uint8)]


def quantize_e4m3(x, factor=1.0):
    """uint8 e4m3fn codes of x / factor: the division in float32 (x and factor rounded to
    float32 first), then the nearest e4m3fn value, ties to the even code, magnitudes above
    448 (infinities too) saturated to 448, NaN to the NaN code; the sign is kept (-0 and
    NaN included).  This is fmha_native's quantize-on-write append."""
    y = np.asarray(x, dtype=np.float32) / np.asarray(factor, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    neg = np.signbit(y)
    a = np.minimum(np.abs(y).astype(np.float64), _E4M3_MAX)
    mags = _E4M3[:0x7F]  # codes 0 .. 0x7e: the non-negative finite values, increasing
    hi = np.clip(np.searchsorted(mags, np.where(np.isnan(a), 0.0, a)), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    below, above = a - mags[lo], mags[hi] - a
    pick_lo = (below < above) | ((below == above) & (lo % 2 == 0))
    code = np.where(pick_lo & (a < mags[hi]), lo, hi)
    code = np.where(np.isnan(a), 0x7F, code)
    return (code | np.where(neg, 0x80, 0)).astype(np.uint8)


def _is_fp8(x, kv_dtype):
    """Whether x holds e4m3fn codes: a float8_e4m3fn tensor or array, or uint8 storage
    with kv_dtype "e4m3fn"."""
    if kv_dtype is not None and kv_dtype not in ("e4m3fn", "float8_e4m3fn"):
        raise ValueError(f"kv_dtype must be None or 'e4m3fn', got {kv_dtype!r}")
    name = dtype_name(x.dtype) if hasattr(x, "dtype") else ""
    return name == "float8_e4m3fn" or (kv_dtype is not None and name == "uint8")


def fp8_codes(x, name="x"):
    """The uint8 codes of an fp8 KV cache: a torch float8_e4m3fn tensor, an ml_dtypes
    float8_e4m3fn array or uint8 storage (a copy on the host)."""
    module = type(x).__module__ or ""
    if module.startswith("torch"):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.float8_e4m3fn:
            x = x.view(torch.uint8)
        x = x.numpy()
    elif module.startswith("cupy"):
        x = x.get()
    arr = np.asarray(x)
    if arr.dtype.name == "float8_e4m3fn":
        arr = arr.view(np.uint8)
    if arr.dtype != np.uint8:
        raise TypeError(f"{name} must hold float8 e4m3fn codes, got {dtype_name(arr.dtype)}")
    return np.array(arr, copy=True)


def _kv_factors(scale, batch, heads_kv, name):
    """An fp8 scale as float64 [batch, heads_kv] holding float32 values: None is 1, a
    number per tensor, or a float32 array of shape (), [heads_kv] or [batch, heads_kv]."""
    if scale is None:
        values = np.float32(1.0)
    elif isinstance(scale, (int, float)):
        values = np.float32(scale)
    else:
        values = to_float64(scale, name).astype(np.float32)
        if values.shape not in ((), (heads_kv,), (batch, heads_kv)):
            raise ValueError(f"{name} must have shape (), ({heads_kv},) or ({batch}, "
                             f"{heads_kv}), got {values.shape}")
    factors = np.broadcast_to(np.asarray(values, dtype=np.float32), (batch, heads_kv))
    if not (np.isfinite(factors) & (factors > 0)).all():
        raise ValueError(f"{name} must be positive and finite")
    return factors.astype(np.float64)


def _quantized_new_rows(x, factors, q_starts, q_lens, name):
    """k_new / v_new quantized on write with their sequence's factors, as float64 code
    values (dense [batch, seqlen_new, heads_kv, head_dim] or packed like q)."""
    xf = to_float64(x, name)
    if q_starts is None:
        _check_4d(name, xf)
        per_row = np.broadcast_to(factors[:, None, :, None], xf.shape)
    else:
        _check_nd(name, xf, 3, "[total_q, heads_kv, head_dim] with cu_seqlens_q")
        seq = np.repeat(np.arange(len(q_lens)), q_lens)
        if seq.shape[0] != xf.shape[0]:
            raise ValueError(f"{name} must have total_q rows, got shape {xf.shape}")
        per_row = np.broadcast_to(factors[seq][:, :, None], xf.shape)
    return e4m3_values(quantize_e4m3(xf, per_row))


def _is_ml_float(dtype):
    """ml_dtypes' float types (bfloat16, float8_*): NumPy kind 'V', but real numbers
    that cast to float64 (raw bytes and records do not)."""
    return (dtype.kind == "V" and dtype.names is None and dtype.subdtype is None
            and np.can_cast(dtype, np.float64))


def _check_4d(name, x):
    if x.ndim != 4:
        raise ValueError(f"{name} must be 4-D [batch, seqlen, heads, head_dim], got shape {x.shape}")


def _check_nd(name, x, ndim, layout):
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {x.shape}")


def _ints(x, name):
    """Integer metadata (any array kind) as an int64 NumPy array."""
    arr = to_float64(x, name)
    if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
        raise ValueError(f"{name} must hold integers")
    return arr.astype(np.int64)


def _cu_seqlens(cu, name, batch, total):
    """Per-sequence (start, length) of a packed dimension of `total` rows."""
    cu = _ints(cu, name).reshape(-1)
    if batch is not None and cu.shape != (batch + 1,):
        raise ValueError(f"{name} must have shape ({batch + 1},), got {cu.shape}")
    if cu.shape[0] < 1 or cu[0] != 0 or (np.diff(cu) < 0).any() or cu[-1] != total:
        raise ValueError(f"{name} must start at 0, never decrease and end at {total}, got {cu}")
    return cu[:-1], np.diff(cu)


def _check_bound(name, lengths, bound):
    if bound is not None and lengths.size and int(lengths.max()) > int(bound):
        raise ValueError(f"a sequence is longer than {name}={bound}: lengths {lengths}")


def _key_lengths(batch, seqlen_k, cache_seqlens, seqlen_new):
    """Valid keys per sequence: the capacity, or cache_seqlens[b] + new rows of b
    (seqlen_new: an int, or one count per sequence)."""
    if cache_seqlens is None:
        return np.full(batch, seqlen_k, dtype=np.int64)
    lengths = _ints(cache_seqlens, "cache_seqlens").reshape(-1)
    if lengths.shape != (batch,):
        raise ValueError(f"cache_seqlens must have shape ({batch},), got {lengths.shape}")
    total = lengths + seqlen_new
    if (lengths < 0).any() or (total > seqlen_k).any():
        raise ValueError(f"cache_seqlens + seqlen_new must lie in [0, {seqlen_k}], got {total}")
    return total


def _pages(block_table, batch, num_pages, page_size, lengths):
    """The block table as int64 [batch, max_blocks], every entry that holds one of the
    first lengths[b] keys of b checked to name a page; entries past a sequence's length
    may hold anything and are read as page 0 (their keys are never attended)."""
    table = _ints(block_table, "block_table")
    if table.ndim != 2 or table.shape[0] != batch:
        raise ValueError(f"block_table must be [batch={batch}, max_blocks], got {table.shape}")
    used = np.arange(table.shape[1])[None, :] * page_size < lengths[:, None]
    bad = used & ((table < 0) | (table >= num_pages))
    if bad.any():
        raise ValueError(f"block_table entries within a sequence's length must lie in "
                         f"[0, {num_pages}), got {table[bad]}")
    return np.where(used, table, 0)


def _new_rows(k_new, v_new, batch, q_starts, q_lens):
    """k_new/v_new as float64 plus, per sequence, (first row, count) of its new rows:
    packed [total_q, heads_kv, head_dim] following cu_seqlens_q when q_starts is given,
    else [batch, seqlen_new, heads_kv, head_dim]."""
    k_add, v_add = to_float64(k_new, "k_new"), to_float64(v_new, "v_new")
    if k_add.shape != v_add.shape:
        raise ValueError(f"k_new {k_add.shape} and v_new {v_add.shape} must have the same shape")
    if q_starts is not None:
        _check_nd("k_new", k_add, 3, "[total_q, heads_kv, head_dim] with cu_seqlens_q")
        if k_add.shape[0] != int(q_starts[-1] + q_lens[-1] if batch else 0):
            raise ValueError(f"k_new must have total_q rows, got shape {k_add.shape}")
        return k_add, v_add, q_starts, q_lens
    _check_4d("k_new", k_add)
    if k_add.shape[0] != batch:
        raise ValueError(f"k_new must have batch={batch} entries, got shape {k_add.shape}")
    seqlen_new = k_add.shape[1]
    # Dense new rows of b: rows [b * seqlen_new, (b + 1) * seqlen_new) of the flattened array.
    flat = (-1,) + k_add.shape[2:]
    starts = np.arange(batch, dtype=np.int64) * seqlen_new
    return (k_add.reshape(flat), v_add.reshape(flat), starts,
            np.full(batch, seqlen_new, dtype=np.int64))


def append_kv(k, v, cache_seqlens, k_new, v_new, *, block_table=None, cu_seqlens_q=None):
    """The caches after appending: copies of k and v (float64, in their own layout) with
    the new rows of each sequence written at key positions cache_seqlens[b] + t.
    Everything else keeps its values; the caller's arrays are never modified.

    Dense caches k, v [batch, capacity, heads_kv, head_dim]; paged caches
    [num_pages, page_size, heads_kv, head_dim] with block_table [batch, max_blocks]:
    key position p of b is slot p % page_size of page block_table[b, p // page_size].
    k_new, v_new [batch, seqlen_new, heads_kv, head_dim], or packed
    [total_q, heads_kv, head_dim] with cu_seqlens_q (sequence b appends its
    cu_seqlens_q[b+1] - cu_seqlens_q[b] rows).  cache_seqlens: [batch] integers.
    """
    k_out, v_out = to_float64(k, "k"), to_float64(v, "v")
    for name, x in (("k", k_out), ("v", v_out)):
        _check_4d(name, x)
    if block_table is not None:
        batch = np.shape(block_table)[0]
        page_size = k_out.shape[1]
        capacity = np.shape(block_table)[1] * page_size
    else:
        batch, capacity = k_out.shape[:2]
    q_starts = q_lens = None
    if cu_seqlens_q is not None:
        total_q = np.shape(k_new)[0]
        q_starts, q_lens = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q", batch, total_q)
    k_add, v_add, starts, counts = _new_rows(k_new, v_new, batch, q_starts, q_lens)
    cached = _key_lengths(batch, capacity, cache_seqlens, counts) - counts
    if block_table is not None:
        table = _pages(block_table, batch, k_out.shape[0], page_size, cached + counts)
    for b in range(batch):
        for t in range(int(counts[b])):
            pos, src = int(cached[b]) + t, int(starts[b]) + t
            if block_table is None:
                k_out[b, pos], v_out[b, pos] = k_add[src], v_add[src]
            else:
                page = table[b, pos // page_size]
                k_out[page, pos % page_size] = k_add[src]
                v_out[page, pos % page_size] = v_add[src]
    return k_out, v_out


def _visible(rows, key_index, diagonal, causal, window):
    """[rows, keys] bool: which keys each query row sees.  Query i sits at position
    i + diagonal; window (left, right) bounds the keys to [pos - left, pos + right], -1
    leaving a side open; causal closes the right side at pos."""
    pos = rows[:, None] + diagonal
    keys = key_index[None, :]
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    seen = np.ones((rows.size, key_index.size), dtype=bool)
    if right >= 0:
        seen &= keys <= pos + right
    if left >= 0:
        seen &= keys >= pos - left
    return seen


def _attend_one_head(q_bh, k_bh, v_bh, scale, causal, key_len, window=None, softcap=0.0,
                     sink=None):
    """One (sequence, head): q_bh [seqlen_q, d], k_bh/v_bh [>= key_len, d] -> (out, lse).

    softcap c > 0 maps each scaled score s to c * tanh(s / c); sink (a float or None)
    adds e^sink to the softmax denominator only."""
    seqlen_q, head_dim = q_bh.shape
    out = np.zeros((seqlen_q, head_dim))
    lse = np.full(seqlen_q, -np.inf if sink is None else float(sink))
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
        if softcap > 0.0:
            scores = softcap * np.tanh(scores / softcap)
        if causal or window is not None:
            scores = np.where(_visible(rows, key_index, diagonal, causal, window), scores,
                              -np.inf)
        if sink is not None:
            # The sink is one more logit in every row's denominator with no value: a
            # column of scores whose value row is 0.
            scores = np.concatenate([scores, np.full((rows.size, 1), float(sink))], axis=1)
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
        if sink is not None:
            probs = probs[:, :-1]
        out[rows] = probs @ values
    return out, lse


def forward(q, k, v, *, causal=False, softmax_scale=None, return_lse=True,
            cache_seqlens=None, k_new=None, v_new=None, block_table=None,
            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
            window=None, softcap=0.0, sinks=None, kv_dtype=None, k_scale=None, v_scale=None):
    """Attention forward in float64: the contract of fmha_native.forward, slowly.

    q [batch, seqlen_q, heads_q, head_dim]; k, v [batch, seqlen_k, heads_kv, head_dim].
    Returns (out, lse) as float64: out like q, lse [batch, heads_q, seqlen_q] (natural
    log); only out when return_lse is False.

    cache_seqlens [batch]: sequence b attends to its first cache_seqlens[b] keys.
    k_new, v_new [batch, seqlen_new, heads_kv, head_dim] (with cache_seqlens): appended at
    key position cache_seqlens[b] of copies of k and v (the inputs are never modified;
    use append_kv for the expected caches), and attention then covers
    cache_seqlens[b] + seqlen_new keys.

    block_table int [batch, max_blocks]: k and v are a paged cache
    [num_pages, page_size, heads_kv, head_dim]; key j of b is slot j % page_size of page
    block_table[b, j // page_size]; the capacity is max_blocks * page_size.

    cu_seqlens_q int [batch + 1]: q is packed [total_q, heads_q, head_dim], sequence b
    owning rows [cu_seqlens_q[b], cu_seqlens_q[b+1]); out is packed like q and lse is
    [heads_q, total_q].  k_new/v_new are then packed like q too (sequence b appends as
    many rows as it has queries).  cu_seqlens_k int [batch + 1] (with cu_seqlens_q, no
    cache): k and v are packed [total_k, heads_kv, head_dim] the same way.
    max_seqlen_q / max_seqlen_k: bounds only; a longer packed sequence is a ValueError.

    Causal alignment is bottom-right per sequence: query i of b sees key j iff
    j <= i + len_k(b) - len_q(b).

    window (left, right): query i of b, at position p = i + len_k(b) - len_q(b), sees
    key j iff p - left <= j <= p + right (-1 leaves a side unbounded; causal sets
    right = 0).  softcap c > 0: scores s = scale * q.k become c * tanh(s / c).  sinks
    [heads_q]: one logit per query head in the softmax denominator only, so
    out = sum_j e^s_j v_j / (e^sink + sum_j e^s_j), lse = log(e^sink + sum_j e^s_j); a
    row that sees no key gives out 0 and lse = sink.

    fp8 KV cache: k and v float8_e4m3fn (torch or ml_dtypes), or uint8 codes with
    kv_dtype="e4m3fn".  Key j of kv head h in sequence b is k_scale[b, h] times its
    code's value (k_scale: None = 1, a number, or float32 (), [heads_kv] or
    [batch, heads_kv]); v likewise.  k_new/v_new are quantized on write
    (quantize_e4m3(x, factor of b, h)) before the attention reads them back.
    """
    if window is not None:
        window = tuple(int(x) for x in window)
        if len(window) != 2 or min(window) < -1:
            raise ValueError(f"window must be (left, right) with values >= -1, got {window}")
    softcap = float(softcap)
    if not softcap >= 0.0:
        raise ValueError(f"softcap must be >= 0, got {softcap}")
    sink_values = None
    if sinks is not None:
        sink_values = to_float64(sinks, "sinks").reshape(-1)
    fp8 = _is_fp8(k, kv_dtype)
    if fp8:
        if not _is_fp8(v, kv_dtype) or dtype_name(k.dtype) != dtype_name(v.dtype):
            raise TypeError("k and v must both hold float8 e4m3fn codes of one dtype")
        qf = to_float64(q, "q")
        kf, vf = e4m3_values(fp8_codes(k, "k")), e4m3_values(fp8_codes(v, "v"))
    else:
        if k_scale is not None or v_scale is not None:
            raise ValueError("k_scale / v_scale apply to an fp8 KV cache only")
        qf, kf, vf = to_float64(q, "q"), to_float64(k, "k"), to_float64(v, "v")
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together")
    if k_new is not None and cache_seqlens is None:
        raise ValueError("k_new/v_new need cache_seqlens")
    if cu_seqlens_k is not None and cu_seqlens_q is None:
        raise ValueError("cu_seqlens_k needs cu_seqlens_q")
    if cu_seqlens_k is not None and (cache_seqlens is not None or block_table is not None):
        raise ValueError("cu_seqlens_k cannot be combined with cache_seqlens or block_table")

    # Queries: one [len_q, heads_q, head_dim] array per sequence.
    if cu_seqlens_q is not None:
        _check_nd("q", qf, 3, "[total_q, heads_q, head_dim] with cu_seqlens_q")
        batch = np.shape(cu_seqlens_q)[0] - 1
        q_starts, q_lens = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q", batch, qf.shape[0])
        _check_bound("max_seqlen_q", q_lens, max_seqlen_q)
        q_seqs = [qf[s:s + n] for s, n in zip(q_starts, q_lens)]
    else:
        _check_4d("q", qf)
        batch = qf.shape[0]
        q_starts = q_lens = None
        q_seqs = list(qf)
    heads_q, head_dim = qf.shape[-2:]

    # Keys: one [>= len_k, heads_kv, head_dim] array per sequence, plus len_k.
    if cu_seqlens_k is not None:
        _check_nd("k", kf, 3, "[total_k, heads_kv, head_dim] with cu_seqlens_k")
        if kf.shape != vf.shape:
            raise ValueError(f"k {kf.shape} and v {vf.shape} must have the same shape")
        k_starts, lengths = _cu_seqlens(cu_seqlens_k, "cu_seqlens_k", batch, kf.shape[0])
        _check_bound("max_seqlen_k", lengths, max_seqlen_k)
        k_seqs = [kf[s:s + n] for s, n in zip(k_starts, lengths)]
        v_seqs = [vf[s:s + n] for s, n in zip(k_starts, lengths)]
    else:
        _check_4d("k", kf)
        _check_4d("v", vf)
        if kf.shape != vf.shape:
            raise ValueError(f"k {kf.shape} and v {vf.shape} must have the same shape")
        paged = block_table is not None
        if paged:
            page_size = kf.shape[1]
            capacity = np.shape(block_table)[1] * page_size
        else:
            if kf.shape[0] != batch:
                raise ValueError(f"k {kf.shape} must be [batch={batch}, seqlen_k, heads_kv, "
                                 f"head_dim]")
            capacity = kf.shape[1]
        new_counts = 0
        if k_new is not None and fp8:
            # Quantized on write: what the cache holds afterwards is read back.
            heads_kv_new = kf.shape[-2]
            k_new = _quantized_new_rows(k_new, _kv_factors(k_scale, batch, heads_kv_new,
                                                           "k_scale"), q_starts, q_lens, "k_new")
            v_new = _quantized_new_rows(v_new, _kv_factors(v_scale, batch, heads_kv_new,
                                                           "v_scale"), q_starts, q_lens, "v_new")
        if k_new is not None:
            kf, vf = append_kv(kf, vf, cache_seqlens, k_new, v_new, block_table=block_table,
                               cu_seqlens_q=cu_seqlens_q)
            new_counts = q_lens if q_lens is not None else np.shape(k_new)[1]
        lengths = _key_lengths(batch, capacity, cache_seqlens, new_counts)
        if max_seqlen_k is not None and int(max_seqlen_k) > capacity:
            raise ValueError(f"max_seqlen_k={max_seqlen_k} is above the capacity {capacity}")
        if paged:
            table = _pages(block_table, batch, kf.shape[0], page_size, lengths)
            tail = kf.shape[2:]
            k_seqs = [kf[table[b]].reshape((capacity,) + tail) for b in range(batch)]
            v_seqs = [vf[table[b]].reshape((capacity,) + tail) for b in range(batch)]
        else:
            k_seqs, v_seqs = list(kf), list(vf)
    heads_kv = kf.shape[-2]
    if fp8:
        # Dequantize per sequence and kv head (after the pages are gathered: the factor
        # belongs to the sequence, not to the page).
        k_fac = _kv_factors(k_scale, batch, heads_kv, "k_scale")
        v_fac = _kv_factors(v_scale, batch, heads_kv, "v_scale")
        k_seqs = [k_seqs[b] * k_fac[b][None, :, None] for b in range(batch)]
        v_seqs = [v_seqs[b] * v_fac[b][None, :, None] for b in range(batch)]
    if kf.shape[-1] != head_dim:
        raise ValueError(f"k has head_dim {kf.shape[-1]}, q has {head_dim}")
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    group = heads_q // heads_kv
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    if sink_values is not None and sink_values.shape != (heads_q,):
        raise ValueError(f"sinks must have shape ({heads_q},), got {sink_values.shape}")

    outs, lses = [], []
    for b in range(batch):
        q_b = q_seqs[b]
        out_b = np.zeros(q_b.shape)
        lse_b = np.full((heads_q, q_b.shape[0]), -np.inf)
        for h in range(heads_q):
            out_b[:, h], lse_b[h] = _attend_one_head(
                q_b[:, h], k_seqs[b][:, h // group], v_seqs[b][:, h // group], scale, causal,
                int(lengths[b]), window, softcap,
                None if sink_values is None else sink_values[h])
        outs.append(out_b)
        lses.append(lse_b)
    if cu_seqlens_q is not None:
        out = np.zeros(qf.shape)
        lse = np.full((heads_q, qf.shape[0]), -np.inf)
        for b in range(batch):
            out[q_starts[b]:q_starts[b] + q_lens[b]] = outs[b]
            lse[:, q_starts[b]:q_starts[b] + q_lens[b]] = lses[b]
    else:
        out = np.stack(outs) if batch else np.zeros(qf.shape)
        lse = np.stack(lses) if batch else np.full((0, heads_q, qf.shape[1]), -np.inf)
    return (out, lse) if return_lse else out


def combine(outs, lses, *, sinks=None):
    """Merge partial attention states in float64.

    outs [G, batch, seqlen_q, heads, head_dim], each normalised by its own row sum;
    lses [G, batch, heads, seqlen_q] their log-sum-exps.  Returns (out, lse) with
    lse = log(sum_g exp(lse_g)) and out = sum_g exp(lse_g - lse) * out_g.  Partials with
    lse = -inf contribute nothing (even if their out holds garbage); a row whose every
    partial is -inf gives out = 0, lse = -inf.

    sinks [heads]: folded in once, after the merge, as one more partial with that lse
    whose out is 0 (a logit in the denominator only); a row whose partials are all -inf
    then gives out = 0, lse = sink.
    """
    o = to_float64(outs, "outs")
    l = to_float64(lses, "lses")
    if o.ndim != 5 or l.ndim != 4:
        raise ValueError(f"outs must be 5-D and lses 4-D, got {o.shape} and {l.shape}")
    groups, batch, seqlen_q, heads, head_dim = o.shape
    if l.shape != (groups, batch, heads, seqlen_q):
        raise ValueError(f"lses must have shape {(groups, batch, heads, seqlen_q)}, got {l.shape}")
    if sinks is not None:
        sink = to_float64(sinks, "sinks").reshape(-1)
        if sink.shape != (heads,):
            raise ValueError(f"sinks must have shape ({heads},), got {sink.shape}")
        o = np.concatenate([o, np.zeros((1,) + o.shape[1:])], axis=0)
        l = np.concatenate([l, np.broadcast_to(sink[None, None, :, None],
                                               (1, batch, heads, seqlen_q))], axis=0)
        groups += 1
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
