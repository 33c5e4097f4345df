"""fmha_native.distributed: context parallelism on torch.distributed.

Owns attention over a sequence sharded across the ranks of a torch.distributed process
group: ``context_parallel_forward`` (prefill: K/V passed around a ring or all-gathered,
contiguous or zigzag layout) and ``context_parallel_decode`` (a KV cache sharded across
ranks: vLLM's decode context parallelism).  It has no communication layer of its own: it
uses torch.distributed's ``batch_isend_irecv`` (ring) and ``all_gather_into_tensor``
(all-gather, decode), so it runs on any backend that has them: NCCL on GPUs, gloo on CPUs.
Every rank of the group must make the same call with tensors of the same shapes.

    out, lse = context_parallel_forward(q, k, v, causal=True, layout="zigzag")

Layouts of the sequence dimension over the W ranks of the group (q, k and v alike):

- ``contiguous``: rank r holds positions [r*L, (r+1)*L) (L, the local length, any size).
- ``zigzag``: the sequence is cut into 2W chunks of c positions and rank r holds chunks r
  and 2W-1-r, concatenated (local length 2c).  Under a causal mask every rank then has
  the same work: with the keys of rank s, rank r's queries see

  - s == r: both of its own chunks, causally, which is the library's causal mask on the
    local [2c, 2c] block (the local order is the position order);
  - s < r: the first chunk of the keys (chunk s) only, for all 2c queries, unmasked
    (chunk 2W-1-s lies after both query chunks);
  - s > r: both key chunks, for the second query chunk (2W-1-r) only, unmasked (the
    first query chunk r lies before both key chunks).

Without a mask the layout does not matter: every query sees every key.

Windows (``window=(left, right)``: query p sees keys p - left .. p + right; -1
unbounded; causal makes right 0).  forward() aligns a call's last query with its last key,
which ties a call's query/key offset to its lengths, so each visible (query chunk, key
chunk) pair becomes one call on the box of rows that see a key of the chunk and keys that
a row sees (_window_calls): on that box the offset lies inside the window, so the window
shifted by it gives every row exactly its band.  Rows outside the box are left out of the
merge; the zigzag diagonal (two chunks apart in position) is cut into chunk pairs.
Blocks no window reaches are skipped, so a narrow window costs a ring step (or a gather)
of K/V but little compute.

The merge is exact: each visible block gives a partial state (out normalised by its own
row sum, and its log-sum-exp), and ``fmha_native.combine`` merges partials into the state
of the union of their keys (DESIGN.md, combine).  The ring keeps its running state in
float32 whatever the inputs' dtype, and each block's forward writes its partial straight
into a float32 slot (forward's out_dtype=float32), so no partial is ever rounded: only the
result is, once, to q's dtype (or not at all with out_dtype=float32).
"""
import math

import fmha_native as _fn

__all__ = ["context_parallel_forward", "context_parallel_decode"]

_METHODS = ("ring", "allgather")
_LAYOUTS = ("contiguous", "zigzag")

# The communication stream of each CUDA device, made at its first ring call.
_side_streams = {}


def _modules():
    """(torch, torch.distributed), imported on first use (importing fmha_native never
    imports torch)."""
    import torch
    import torch.distributed as dist

    return torch, dist


def _group_of(dist, group):
    """(rank in group, world size, global rank of group rank i) for an initialised group."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group first")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the given process group")
    world = dist.get_world_size(group)
    if group is None:
        return rank, world, lambda i: i
    return rank, world, lambda i: dist.get_global_rank(group, i)


def _check_tensors(torch, names_and_tensors):
    first_name, first = names_and_tensors[0]
    for name, x in names_and_tensors:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor (context parallelism runs on "
                            f"torch.distributed), got {type(x).__module__}.{type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D [batch, seqlen, heads, head_dim], got shape "
                             f"{tuple(x.shape)}")
        if x.device != first.device:
            raise ValueError(f"{name} is on {x.device} but {first_name} on {first.device}: "
                             "they must be on one device")
        if x.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {str(x.dtype).replace('torch.', '')} but "
                            f"{first_name} {str(first.dtype).replace('torch.', '')}: they must "
                            "share one dtype")


def _float32_out(torch, q, out_dtype):
    """Whether the result is float32: out_dtype float32 (any spelling forward takes), or
    float32 inputs; ValueError naming out_dtype for anything but None and float32."""
    if out_dtype is not None and not _fn._out_dtype_is_float32(out_dtype):
        raise ValueError(f"out_dtype must be None (q's dtype) or float32 (\"float32\", "
                         f"torch.float32 or numpy.float32), got {out_dtype!r}")
    return out_dtype is not None or q.dtype == torch.float32


def _window_bounds(window, causal):
    """(left, right) of a window that bounds something, as forward reads it (-1 =
    unbounded; causal makes right 0), or None when it bounds nothing (None; (-1, -1); or
    (-1, 0 or -1) under causal: plain attention).  Values as forward checks them."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2 or any(
            isinstance(x, bool) or not isinstance(x, int) for x in window):
        raise TypeError(f"window must be a (left, right) tuple of two ints or None, got "
                        f"{window!r}")
    left, right = window
    if left < -1 or right < -1:
        raise ValueError(f"window values must be >= -1 (-1 = unbounded), got {window!r}")
    if causal:
        if right > 0:
            raise ValueError(f"window=({left}, {right}) with causal=True: causal sets the "
                             "right bound to 0, so window's right must be 0 or -1")
        right = 0
    if left == -1 and right in (-1, 0 if causal else -1):
        return None
    return left, right


def _choice(name, value, allowed):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, got "
                         f"{value!r}")


def _all_gather(dist, output, tensor, group):
    """all_gather_into_tensor under the name this torch prefers (newer ones call it
    all_gather_single and warn on the old name); output is the ranks' tensors
    concatenated along dim 0."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor, group=group)


def _pack_kv(torch, k, v):
    """K and V side by side in one buffer [batch, seqlen, 2, heads_kv, head_dim], so one
    message carries both; k and v are its views [:, :, 0] and [:, :, 1]."""
    b, s, h, d = k.shape
    kv = torch.empty((b, s, 2, h, d), dtype=k.dtype, device=k.device)
    kv[:, :, 0].copy_(k)
    kv[:, :, 1].copy_(v)
    return kv


def _ring_blocks(rank, world, seqlen_q, seqlen_k, causal, layout):
    """The work of rank ``rank`` at each ring step without a window: a list of ``world``
    entries, entry s for the keys of rank (rank - s) mod world, each a list of calls (none
    when the mask hides them), a call being (query rows, key rows, causal, window) with
    rows as slices of the local q and of the K/V shard."""
    everything = slice(None)
    blocks = []
    for step in range(world):
        src = (rank - step) % world
        if not causal:
            block = (everything, everything, False)
        elif src == rank:
            block = (everything, everything, True)
        elif layout == "contiguous":
            block = (everything, everything, False) if src < rank else None
        elif src < rank:
            block = (everything, slice(0, seqlen_k // 2), False)
        else:
            block = (slice(seqlen_q // 2, seqlen_q), everything, False)
        blocks.append([] if block is None else [block + (None,)])
    return blocks


def _chunks(layout, rank, world, local):
    """The position ranges [start, end) that rank's ``local`` rows hold, in local order."""
    if layout == "contiguous":
        return [(rank * local, (rank + 1) * local)]
    chunk, second = local // 2, 2 * world - 1 - rank
    return [(rank * chunk, (rank + 1) * chunk), (second * chunk, (second + 1) * chunk)]


def _window_calls(q_chunks, k_chunks, window):
    """The forward calls that give queries at the positions of q_chunks exactly the keys
    at the positions of k_chunks that ``window`` = (left, right) lets them see: query p
    sees key j iff p - left <= j <= p + right (-1: that side unbounded; a causal window
    has right 0).

    q_chunks / k_chunks: position ranges (start, end), in the order the local q / the
    K/V shard hold them (rows are consecutive across chunks).  Returns a list of
    (query rows, key rows, causal, window): slices of the local q and of the shard, and
    forward's causal and window for the call.  forward aligns a call's last query with
    its last key (bottom-right), so each (query chunk, key chunk) pair becomes at most one
    call on the box of rows that see a key of the chunk and keys that a row sees
    (_pair_call): on that box the alignment's offset lies inside the window, so shifting
    the window by it expresses every row's band exactly.  Rows outside the box see none
    of the chunk's keys: no call writes them (the caller merges nothing for them).
    """
    calls = []
    q_at = 0
    for q0, q1 in q_chunks:
        k_at = 0
        for k0, k1 in k_chunks:
            if q1 > q0 and k1 > k0:
                call = _pair_call(q0, q1, k0, k1, window)
                if call is not None:
                    (i0, i1), (j0, j1), causal, call_window = call
                    calls.append((slice(q_at + i0, q_at + i1), slice(k_at + j0, k_at + j1),
                                  causal, call_window))
            k_at += k1 - k0
        q_at += q1 - q0
    return calls


def _pair_call(q0, q1, k0, k1, window):
    """_window_calls for one query range and one key range: ((row lo, row hi), (key lo,
    key hi), causal, window) relative to the ranges' starts, or None when no row sees a
    key.  Row i, key j see each other iff lo <= j - i <= hi, with lo = q0 - k0 - left and
    hi = q0 - k0 + right (infinite where the window is unbounded)."""
    left, right = window
    nq, nk, shift = q1 - q0, k1 - k0, q0 - k0
    lo = -math.inf if left < 0 else shift - left
    hi = math.inf if right < 0 else shift + right
    i0, i1 = max(0, -hi), min(nq - 1, nk - 1 - lo)  # rows that see a key (inclusive)
    if i0 > i1:
        return None
    i0, i1 = int(i0), int(i1)
    j0, j1 = int(max(0, lo + i0)), int(min(nk - 1, hi + i1))  # keys some row sees
    # The call puts row i at position (i - i0) + (j1 - j0) - (i1 - i0), so its band
    # relative to that position is [lo - d, hi - d] with d = j1 - i1, and lo <= d <= hi
    # on this box: both sides stay >= 0 (or unbounded).
    d = j1 - i1
    call_left = -1 if left < 0 else d - lo
    call_right = -1 if right < 0 else hi - d
    if call_right == 0:
        return (i0, i1 + 1), (j0, j1 + 1), True, None if call_left < 0 else (int(call_left), 0)
    call_window = None if call_left < 0 and call_right < 0 else (int(call_left), int(call_right))
    return (i0, i1 + 1), (j0, j1 + 1), False, call_window


def _ring_window_blocks(rank, world, seqlen, layout, window):
    """_ring_blocks for a window (_window_bounds): each step's calls from _window_calls
    on this rank's chunks and the source rank's."""
    mine = _chunks(layout, rank, world, seqlen)
    return [_window_calls(mine, _chunks(layout, (rank - step) % world, world, seqlen), window)
            for step in range(world)]


def context_parallel_forward(q, k, v, *, group=None, causal=False, softmax_scale=None,
                             method="ring", layout="contiguous", return_lse=True,
                             out_dtype=None, window=None):
    """Attention over a sequence sharded across the ranks of ``group``: (out, lse), or out
    when ``return_lse`` is false.

    q [batch, seqlen_q, heads_q, head_dim], k and v [batch, seqlen_k, heads_kv, head_dim]
    torch tensors: this rank's shard of the sequence in ``layout`` ("contiguous" or
    "zigzag", module docstring).  Returns this rank's rows of the single-device result:
    out like q, lse float32 [batch, heads_q, seqlen_q].  ``causal`` needs q and k sharded
    alike (seqlen_q == seqlen_k); "zigzag" needs even local lengths (two equal chunks).
    ``method``: "ring" passes K/V around the ring with batch_isend_irecv (on a side stream
    on CUDA) while the block in hand is computed, skipping blocks the mask hides, and
    merges in float32; "allgather" gathers K/V with all_gather_into_tensor and runs one
    forward over the visible keys (per local chunk for zigzag).  GQA, float16, bfloat16
    and (CPU) float32 as fmha_native.forward takes them.  ``out_dtype``: None (out like
    q) or float32 (out float32 for float16/bfloat16 inputs, never rounded).
    ``window=(left, right)``: forward's sliding window (-1 unbounded; with causal=True the
    right bound is 0): query p sees keys p - left .. p + right.  Each visible block is one
    call whose bottom-right alignment is exact (_window_calls); blocks wholly outside every
    window are skipped.  A window (or causal) needs q and k sharded alike.
    Every rank must pass the same shapes, dtype, causal, method, layout, out_dtype and
    window.  Forward only (no autograd).
    """
    torch, dist = _modules()
    _check_tensors(torch, [("q", q), ("k", k), ("v", v)])
    _choice("method", method, _METHODS)
    _choice("layout", layout, _LAYOUTS)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch and "
                         "head_dim")
    win = _window_bounds(window, causal)
    positional = causal or win is not None  # a mask: positions decide what a row sees
    if positional and q.shape[1] != k.shape[1]:
        raise ValueError(f"a causal or windowed context parallelism shards q and k alike: "
                         f"q.shape[1] ({q.shape[1]}) must equal k.shape[1] ({k.shape[1]})")
    if positional and layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"layout='zigzag' holds two equal chunks per rank: q.shape[1] and "
                         f"k.shape[1] must be even, got {q.shape[1]}")
    f32 = _float32_out(torch, q, out_dtype)
    q = _fn._no_grad_input("q", q)
    k, v = _fn._no_grad_input("k", k), _fn._no_grad_input("v", v)
    rank, world, global_rank = _group_of(dist, group)
    if not causal and win is None:
        layout = "contiguous"  # every query sees every key: the layout does not matter
    out_dtype = "float32" if f32 else None
    with torch.no_grad():
        if world == 1:
            extra = {} if win is None else {"window": win}
            result = _fn.forward(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                 out_dtype=out_dtype, **extra)
        elif method == "ring":
            result = _ring(torch, dist, q, k, v, causal, softmax_scale, layout, group, rank,
                           world, global_rank, f32_result=f32, window=win)
        else:
            result = _allgather(torch, dist, q, k, v, causal, softmax_scale, layout, group,
                                rank, world, out_dtype, win)
    return result if return_lse else result[0]


def _side_stream(torch, device):
    stream = _side_streams.get(device)
    if stream is None:
        stream = _side_streams[device] = torch.cuda.Stream(device=device)
    return stream


def _ring(torch, dist, q, k, v, causal, scale, layout, group, rank, world, global_rank,
          communicate=True, f32_result=False, window=None):
    """The ring method; communicate=False (benchmarks/bench_cp.py's compute-only time)
    runs the same blocks and merges on this rank's own K/V, sending nothing.  The result
    is float32 when f32_result, else q's dtype; window: _window_bounds' (left, right).

    Each block's partial is written in float32 (forward's out_dtype), so none is rounded,
    except where that would give up the kernel its 16-bit plan runs (the sm90 kernel
    writes no fp32 partials, and runs a block much faster than the tiles that do) and the
    caller did not ask for a float32 result: such a block's partial is rounded to q's
    dtype once, by the forward, and widened into its float32 slot."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    f32 = torch.float32
    dev = q.device
    # Slot 0: the running state (float32); slot 1: the partial being merged into it.
    obuf = torch.empty((2, batch, seqlen_q, heads_q, head_dim), dtype=f32, device=dev)
    lbuf = torch.empty((2, batch, heads_q, seqlen_q), dtype=f32, device=dev)
    # combine's lse may not overlap its lses: the merged lse lands here, then in slot 0.
    lse_merged = torch.empty((batch, heads_q, seqlen_q), dtype=f32, device=dev)
    part = None  # q-dtype partials of the blocks _wide_partials says no to, made at first use
    wide = {}    # (rows, keys, causal, window) -> whether its partial is written in float32
    current = _pack_kv(torch, k, v)
    spare = torch.empty_like(current)
    send_to, recv_from = global_rank((rank + 1) % world), global_rank((rank - 1) % world)
    side = _side_stream(torch, dev) if q.is_cuda else None
    if window is None:
        blocks = _ring_blocks(rank, world, seqlen_q, k.shape[1], causal, layout)
    else:
        blocks = _ring_window_blocks(rank, world, seqlen_q, layout, window)
        # Every call merges into a running state that starts empty (out 0, lse -inf): a
        # row may see keys in several calls of a step, or in none.
        obuf[0].zero_()
        lbuf[0].fill_(-math.inf)
    for step, calls in enumerate(blocks):
        requests = []
        if communicate and step + 1 < world:
            ops = [dist.P2POp(dist.isend, current, send_to, group),
                   dist.P2POp(dist.irecv, spare, recv_from, group)]
            if side is not None:
                # The side stream starts after the work already queued (spare was last
                # read by the previous step's forward).
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    requests = dist.batch_isend_irecv(ops)
            else:
                requests = dist.batch_isend_irecv(ops)
        for rows, keys, block_causal, block_window in calls:
            # Without a window step 0's one call sees every row and starts the state.
            slot = 0 if step == 0 and window is None else 1
            out_view = obuf[slot][:, rows]
            lse_view = lbuf[slot][:, :, rows]
            extra = {} if block_window is None else {"window": block_window}
            args = (q[:, rows], current[:, keys, 0], current[:, keys, 1])
            kw = dict(causal=block_causal, softmax_scale=scale, **extra)
            shape = (rows.start, rows.stop, keys.start, keys.stop, block_causal, block_window)
            if shape not in wide:
                wide[shape] = f32_result or _wide_partials(torch, args, kw)
            if wide[shape]:
                _fn.forward(*args, out=out_view, lse=lse_view, **kw)
            else:
                part = torch.empty_like(q) if part is None else part
                _fn.forward(*args, out=part[:, rows], lse=lse_view, **kw)
                out_view.copy_(part[:, rows])
            if slot == 1:
                # out= is exactly partial 0 of the stack: combine reads a row's partials
                # before writing it.
                _fn.combine(obuf[:, :, rows], lbuf[:, :, :, rows], out=obuf[0][:, rows],
                            lse=lse_merged[:, :, rows])
                lbuf[0][:, :, rows].copy_(lse_merged[:, :, rows])
        for request in requests:
            request.wait()  # on CUDA: the current stream waits for the transfer
        if communicate:
            current, spare = spare, current
    out = obuf[0].clone() if f32_result or q.dtype == f32 else obuf[0].to(q.dtype)
    return out, lbuf[0].clone()


def _wide_partials(torch, args, kw):
    """Whether a ring block's partial is written in float32: always for float32 inputs and
    on the CPU; on a GPU unless forward's 16-bit plan for the block runs another producer
    than its float32 plan (the sm90 kernel, which writes no fp32 partials)."""
    q = args[0]
    if q.dtype == torch.float32 or not q.is_cuda:
        return True
    narrow = _fn.explain(*args, **kw)["kernel"]
    return _fn.explain(*args, out_dtype="float32", **kw)["kernel"].replace(
        "+combine", "") == narrow.replace("+combine", "")


def _allgather(torch, dist, q, k, v, causal, scale, layout, group, rank, world, out_dtype,
               window=None):
    batch, seqlen_k, heads_kv, head_dim = k.shape
    kv = _pack_kv(torch, k, v)
    # Shards concatenated along dim 0 (the form every backend takes, gloo included).
    gathered = torch.empty((world * batch,) + tuple(kv.shape[1:]), dtype=kv.dtype,
                           device=kv.device)
    _all_gather(dist, gathered, kv, group)
    gathered = gathered.view((world,) + tuple(kv.shape))
    if layout == "contiguous":
        # Shards in rank order are the positions in order; a causal rank needs the
        # prefix up to its own shard.
        shards = gathered[:rank + 1] if causal else gathered
        keys = shards.transpose(0, 1).reshape(batch, shards.shape[0] * seqlen_k, 2, heads_kv,
                                              head_dim)
        if window is None:
            return _fn.forward(q, keys[:, :, 0], keys[:, :, 1], causal=causal,
                               softmax_scale=scale, out_dtype=out_dtype)
    else:
        # zigzag: chunk p < W is rank p's first chunk, chunk p >= W rank 2W-1-p's second.
        # Causal: the later local chunk (2W-1-rank) sees chunks 0 .. 2W-1-rank and the
        # earlier one (rank) a prefix of those; without causal (a window), all 2W chunks.
        chunk = seqlen_k // 2
        halves = gathered.view(world, batch, 2, chunk, 2, heads_kv, head_dim)
        first = rank if causal else 0
        count = 2 * world - first
        keys = torch.empty((batch, count, chunk, 2, heads_kv, head_dim), dtype=kv.dtype,
                           device=kv.device)
        keys[:, :world].copy_(halves[:, :, 0].transpose(0, 1))
        keys[:, world:].copy_(halves[first:, :, 1].flip(0).transpose(0, 1))
        keys = keys.view(batch, count * chunk, 2, heads_kv, head_dim)
    # keys holds positions 0 .. (end of this rank's last chunk, or of the sequence without
    # causal) in order: under causal each local chunk attends to the prefix that ends with
    # it (bottom-right causal puts query i of the chunk at its own position); a window
    # cuts each chunk's keys to one call (_window_calls: every row sees its own position).
    out = torch.empty(q.shape, dtype=torch.float32 if out_dtype else q.dtype, device=q.device)
    lse = torch.empty((batch, q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    at = 0
    for q0, q1 in _chunks(layout, rank, world, seqlen_k):
        if window is None:
            calls = [(slice(0, q1 - q0), slice(0, q1), True, None)]
        else:
            calls = _window_calls([(q0, q1)], [(0, q1 if causal else keys.shape[1])], window)
        for rows, sl, call_causal, call_window in calls:
            rows = slice(at + rows.start, at + rows.stop)
            extra = {} if call_window is None else {"window": call_window}
            _fn.forward(q[:, rows], keys[:, sl, 0], keys[:, sl, 1], causal=call_causal,
                        softmax_scale=scale, out=out[:, rows], lse=lse[:, :, rows], **extra)
        at += q1 - q0
    return out, lse


def context_parallel_decode(q, k_cache, v_cache, *, cache_seqlens, group=None,
                            block_table=None, softmax_scale=None, max_seqlen_k=None,
                            return_lse=True, out_dtype=None):
    """Attention of q over a KV cache sharded across the ranks of ``group``: (out, lse),
    or out when ``return_lse`` is false.

    Every rank passes the same q [batch, seqlen_q, heads_q, head_dim] and its own shard of
    every sequence's cache: k_cache/v_cache as fmha_native.forward takes a cache (dense
    [batch, capacity, heads_kv, head_dim], or pages with ``block_table``) and
    ``cache_seqlens`` int32 [batch], this rank's key count per sequence (0 allowed).
    Every query row attends to every key of every shard (the decode order: queries come
    after the cache), whatever order the shards hold them in.  Local forward, one
    all_gather_into_tensor of the (out, lse) partials, then combine; every rank returns
    the whole result: out like q, lse float32 [batch, heads_q, seqlen_q].  No host reads
    of device tensors (device cache_seqlens are never copied to the host), so a step can
    be captured in a CUDA graph.  ``max_seqlen_k``: forward's plan hint (the most keys a
    shard holds for one sequence).  ``out_dtype``: None (out like q: the partials travel
    in q's dtype, half the bytes of float32, each rounded once before the merge) or
    float32 (partials and result in float32, never rounded).
    """
    torch, dist = _modules()
    _check_tensors(torch, [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)])
    rank, world, _ = _group_of(dist, group)
    f32 = _float32_out(torch, q, out_dtype)
    q = _fn._no_grad_input("q", q)
    k_cache = _fn._no_grad_input("k_cache", k_cache)
    v_cache = _fn._no_grad_input("v_cache", v_cache)
    kw = {"cache_seqlens": cache_seqlens, "softmax_scale": softmax_scale}
    if block_table is not None:
        kw["block_table"] = block_table
    if max_seqlen_k is not None:
        kw["max_seqlen_k"] = max_seqlen_k
    with torch.no_grad():
        if world == 1:
            result = _fn.forward(q, k_cache, v_cache, out_dtype="float32" if f32 else None, **kw)
            return result if return_lse else result[0]
        batch, seqlen_q, heads_q, head_dim = q.shape
        part = torch.float32 if f32 else q.dtype
        # One message per rank carries both partials: out's bytes, then lse's, each
        # starting on a 16-byte boundary.  The ranks' messages are gathered in place:
        # this rank's forward writes straight into its own slot of the gathered buffer
        # (one allocation, no copy of the message; NCCL and gloo both take an input
        # that is the output's slot of this rank).
        out_bytes = batch * seqlen_q * heads_q * head_dim * (4 if f32 else q.element_size())
        lse_at = _round_up(out_bytes, 16)
        lse_bytes = batch * heads_q * seqlen_q * 4
        size = _round_up(lse_at + lse_bytes, 16)
        gathered = torch.empty((world, size), dtype=torch.uint8, device=q.device)
        outs = gathered[:, :out_bytes].view(part).view((world,) + tuple(q.shape))
        lses = gathered[:, lse_at:lse_at + lse_bytes].view(torch.float32).view(
            world, batch, heads_q, seqlen_q)
        _fn.forward(q, k_cache, v_cache, out=outs[rank], lse=lses[rank], **kw)
        if size == 0:
            return (outs[rank], lses[rank]) if return_lse else outs[rank]
        _all_gather(dist, gathered.view(-1), gathered[rank], group)
        out, lse = _fn.combine(outs, lses)
    return (out, lse) if return_lse else out


def _round_up(n, m):
    return (n + m - 1) // m * m
