/*
 * fmha.h: the C ABI of fmha_native.
 *
 * Owns the one plain-data parameter struct that every backend and kernel reads
 * (fmha_fwd_params), the combine parameters, the status codes, the plan the
 * planner fills, and the entry points of each backend.  Host C code and HIP
 * kernels both include this header, so it is C11 and C++ clean and holds no
 * vendor names.
 *
 * Conventions: dimensions are always batch, seqlen_q, seqlen_k, heads_q,
 * heads_kv, head_dim, num_splits.  Strides are in elements, not bytes.  The
 * head_dim stride of q, k, v, out and of the split scratch is 1 (the host glue
 * makes host copies where a caller's array is not like that; device tensors
 * with another head_dim stride are refused).
 */
#ifndef FMHA_H
#define FMHA_H

#include "fmha_config.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FMHA_VERSION "0.1.0"

/* Element type of q, k, v and out (lse and split partials are always fp32; out may also be
 * fp32 for fp16/bf16 inputs: fmha_fwd_params.out_dtype). */
typedef enum fmha_dtype {
    FMHA_DTYPE_F16 = 0,
    FMHA_DTYPE_BF16 = 1,
    FMHA_DTYPE_F32 = 2,
} fmha_dtype;

/* float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities,
 * 0x7f/0xff NaN, largest finite 448): only fmha_fwd_params.kv_dtype holds it (an fp8 KV
 * cache).  Not an enumerator, so that the switches over the types q and out can have
 * stay exhaustive. */
#define FMHA_DTYPE_E4M3 ((fmha_dtype)3)

typedef enum fmha_status {
    FMHA_OK = 0,
    FMHA_ERR_UNSUPPORTED = 1, /* a valid problem that this backend has no kernel for */
    FMHA_ERR_INVALID = 2,     /* the params break this header's rules: a caller bug */
    FMHA_ERR_NOMEM = 3,       /* host or device allocation failed */
    FMHA_ERR_RUNTIME = 4,     /* GPU runtime error: fmha_gpu_error_string() has the text */
    FMHA_ERR_NO_DEVICE = 5,   /* no GPU backend compiled in, or no device visible */
} fmha_status;

typedef enum fmha_backend {
    FMHA_BACKEND_CPU = 0,
    FMHA_BACKEND_GPU = 1,
} fmha_backend;

/*
 * One forward problem.  The host glue fills the problem and tensor fields; the
 * planner (fmha_plan_make) fills the plan fields; the backend fills the scratch
 * pointers before it launches.
 *
 * Layout (FlashAttention's): q [batch, seqlen_q, heads_q, head_dim],
 * k and v [batch, seqlen_k, heads_kv, head_dim], out like q,
 * lse [batch, heads_q, seqlen_q].  Query head h reads kv head
 * h / (heads_q / heads_kv).
 */
typedef struct fmha_fwd_params {
    /* ---- problem ---- */
    int64_t batch;          /* number of independent sequences */
    int64_t seqlen_q;       /* query rows per sequence */
    int64_t seqlen_k;       /* key rows per sequence (the cache capacity when seqlens_k is set) */
    int64_t heads_q;        /* query heads */
    int64_t heads_kv;       /* key/value heads; divides heads_q */
    int64_t head_dim;       /* features per head, shared by q, k and v */
    fmha_dtype dtype;       /* of q, k, v, k_new and v_new */
    fmha_dtype out_dtype;   /* of out: dtype, or FMHA_DTYPE_F32 (partial states that later
                               merges, e.g. context parallelism's, must not round) */
    int causal;             /* bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q */
    float softmax_scale;    /* s = softmax_scale * q.k */
    float scale_log2;       /* softmax_scale * log2(e): scores feed exp2 directly */
    /* Model features (issue 21; the attention rule is under "sequence geometry" below).
     * window_left / window_right: keys a query sees before / after its own position,
     * -1 = unbounded on that side; causal sets the right bound to 0 whatever
     * window_right says (the host glue refuses a positive one with causal).
     * softcap: c > 0 caps every scaled score s to c * tanh(s / c) before the softmax;
     * 0 = off.  sinks: [heads_q] fp32 logits, in the memory of q, that join the
     * softmax denominator only; NULL = none. */
    int64_t window_left;
    int64_t window_right;
    float softcap;
    const float *sinks;

    /* ---- tensors (element strides; head_dim stride is 1) ---- */
    const void *q;
    const void *k;
    const void *v;
    void *out;
    float *lse;             /* may be NULL when the caller does not want it */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t lse_batch_stride, lse_head_stride, lse_row_stride;

    /* ---- variable key lengths and KV append (NULL / 0 when unused) ---- */
    const int32_t *seqlens_k; /* [batch] valid keys per sequence, in the memory of k/v; NULL = seqlen_k */
    const void *k_new;        /* [batch, seqlen_new, heads_kv, head_dim] appended at seqlens_k[b] */
    const void *v_new;
    int64_t seqlen_new;       /* rows of k_new/v_new; attention then covers seqlens_k[b] + seqlen_new keys
                                 (with cu_seqlens_q: the longest append, max_seqlen_q; each sequence
                                 appends its own len_q(b) rows, see below) */
    int64_t total_keys;       /* sum over the batch of seqlens_k[b] + seqlen_new (0 = not known);
                                 the planner sizes ragged batches by it */
    int64_t knew_batch_stride, knew_row_stride, knew_head_stride;
    int64_t vnew_batch_stride, vnew_row_stride, vnew_head_stride;

    /* ---- packed (varlen) sequences and a paged KV cache (NULL / 0 when unused) ----
     *
     * Sequence geometry, the one rule every backend, kernel and the reference follow.
     * For sequence b (0 <= b < batch):
     *   len_q(b)   = cu_seqlens_q ? cu_seqlens_q[b+1] - cu_seqlens_q[b] : seqlen_q
     *   new_len(b) = !k_new ? 0 : cu_seqlens_q ? len_q(b) : seqlen_new
     *   len_k(b)   = seqlens_k ? seqlens_k[b] + new_len(b)
     *              : cu_seqlens_k ? cu_seqlens_k[b+1] - cu_seqlens_k[b] : seqlen_k
     * Query-indexed tensors (q, out, lse, k_new, v_new, the split scratch; combine's
     * partials and outputs) hold row i of sequence b at row cu_seqlens_q[b] + i of their
     * row dimension when cu_seqlens_q is set (their batch stride is then unused), else
     * at batch b, row i.  k/v: with cu_seqlens_k, key j of b is row cu_seqlens_k[b] + j;
     * with block_table, key j of b is row j % page_size of page
     * block_table[b * block_table_stride + j / page_size] (k_batch_stride / v_batch_stride
     * are the page strides); else batch b, row j.  Causal is bottom-right per sequence:
     * query i of b sees key j iff j <= i + len_k(b) - len_q(b).
     *
     * Windows, softcap and sinks.  Query i of b sits at position p = i + len_k(b) - len_q(b)
     * and sees key j (0 <= j < len_k(b)) iff
     *   (window_left < 0 || j >= p - window_left) && j <= p + right,
     * with right = 0 when causal, else window_right (unbounded when -1).  Its scores are
     * s_j = softmax_scale * q.k_j, capped to softcap * tanh(s_j / softcap) when softcap > 0.
     * Without sinks, out = sum_j e^{s_j} v_j / sum_j e^{s_j} and lse = log sum_j e^{s_j}
     * over the visible j (no visible key: out 0, lse -inf).  With sinks, the sink of
     * the row's query head h joins the denominator only:
     *   out = sum_j e^{s_j} v_j / (e^{sinks[h]} + sum_j e^{s_j}),
     *   lse = log(e^{sinks[h]} + sum_j e^{s_j})
     * (no visible key: out 0, lse = sinks[h]).  Split partials (o_accum / lse_accum)
     * never hold the sink: it is folded in once, after the merge.
     *
     * seqlen_q / seqlen_k are then the longest sequence the grid and the plan are made
     * for (max_seqlen_q / max_seqlen_k, or total_q / total_k when not known), and
     * seqlen_k is the capacity (max_blocks_per_seq * page_size) of a paged cache.
     *
     * Device metadata is not checked on the host (no sync).  The kernels clamp, never
     * touching memory outside the tensors, and the rows of an offending sequence come out
     * NaN (out and lse):
     *  - cu_seqlens_q: rows [start, end) with start = clamp(cu[b], 0, total_q) and
     *    end = clamp(cu[b+1], start, min(total_q, start + seqlen_q)); b is bad when
     *    (start, end) != (cu[b], cu[b+1]); its clamped rows are written NaN;
     *  - cu_seqlens_k: the same with total_k and seqlen_k; the rows of b are NaN;
     *  - seqlens_k: bad when seqlens_k[b] < 0 or seqlens_k[b] + new_len(b) > seqlen_k
     *    (the capacity); nothing is appended for b and its rows are NaN (a bad
     *    cu_seqlens_q entry likewise appends nothing for b);
     *  - block_table: an entry outside [0, num_pages) is never dereferenced (nor written
     *    through by the append); every row that would see a key of that page comes out
     *    NaN (GPU tiles may also NaN the other rows of the tile that read it). */
    const int32_t *cu_seqlens_q; /* [batch + 1] */
    const int32_t *cu_seqlens_k; /* [batch + 1] */
    int64_t total_q;             /* rows of q/out when cu_seqlens_q is set */
    int64_t total_k;             /* rows of k/v when cu_seqlens_k is set */
    const int32_t *block_table;  /* [batch, max_blocks_per_seq] */
    int64_t block_table_stride;  /* elements between rows of block_table */
    int64_t page_size;           /* keys per page: a multiple of 16 */
    int64_t num_pages;           /* pages of k/v (k.shape[0]) */

    /* ---- fp8 KV cache (issue 22; unused unless kv_dtype is FMHA_DTYPE_E4M3) ----
     * kv_dtype FMHA_DTYPE_E4M3: k and v (dense, packed or paged) hold float8 e4m3fn
     * codes, one byte per element (their strides count bytes then); any other value
     * (a zeroed field included): k and v hold `dtype`.  q, out, k_new and v_new keep
     * `dtype`.  Key row j of kv head h in sequence b stands for
     *   k_scale * (k_scales ? k_scales[b * k_scales_batch_stride + h * k_scales_head_stride] : 1)
     *   * e4m3(k[...]),
     * and v likewise with v_scale / v_scales (the scale arrays are fp32, in the memory of k,
     * batch stride 0 for per-head scales; b is the sequence, not the page).  Backends may
     * fold K's factor into the softmax scale and V's into the output (DESIGN.md states the
     * bound).  The append quantizes: k_new row x of kv head h is stored as
     * e4m3_rne_saturate(x / that factor) (round to nearest even, |values| above 448
     * stored as +-448, NaN stays NaN); device factors <= 0 are not checked (the math
     * gives what it gives, never an access outside the tensors). */
    fmha_dtype kv_dtype;
    float k_scale, v_scale;
    const float *k_scales, *v_scales;
    int64_t k_scales_batch_stride, k_scales_head_stride;
    int64_t v_scales_batch_stride, v_scales_head_stride;

    /* ---- plan (filled by fmha_plan_make) ---- */
    int num_splits;         /* key splits of every query row (1 = none) */
    int partials;           /* 1: producers write fp32 partials into the split scratch and the
                               combine writes out/lse (num_splits >= 2, or a GPU out_dtype
                               other than dtype); 0: producers write out/lse directly */
    int block_m;            /* query rows per tile (packed rows when pack_gqa) */
    int block_n;            /* key rows per tile */
    int pack_gqa;           /* 1: the heads_q/heads_kv query heads of one kv head share a tile */
    int kernel;             /* backend-specific kernel id chosen by the planner */
    int split_blocks;       /* GPU: key blocks per split for every batch entry (ragged batches:
                               long entries get more non-empty splits); 0 = each entry's blocks
                               divided by num_splits.  Decode tiles' splits take the blocks
                               interleaved (fwd_mma.h make_work), prefill tiles' contiguous */
    int64_t device_pieces;  /* GPU, lengths on the device: > 0 sizes the splits' chunk on the device
                               from the lengths it finds (fmha_device_chunk; split_blocks unused),
                               about this many pieces per tile over the batch; 0 = off */
    int walkers_per_split;  /* GPU: walkers (fmha_config.h: groups of a CTA's warps, each with
                               its own Q tile and K/V ring) that share one split's key blocks,
                               block j of the split going to walker j % walkers_per_split, and
                               merge in shared memory; 1, 2 or 4 (CPU: 1) */
    int kv_read_once;       /* GPU decode tiles: ask L2 to evict the K/V lines they read first
                               (plan.c says when); 0 = the cache's own replacement */
    int schedule;           /* GPU sm90 kernel: FMHA_SM90_INTERLEAVED or FMHA_SM90_PINGPONG
                               (fmha_config.h) */

    /* ---- split scratch (backend-owned, used when partials is 1) ----
     * o_accum   [num_splits, batch, seqlen_q, heads_q, head_dim] fp32, contiguous
     * lse_accum [num_splits, batch, heads_q, seqlen_q] fp32, contiguous
     * With cu_seqlens_q: the same with batch 1 and seqlen_q = total_q, sequence b
     * starting at row cu_seqlens_q[b]. */
    float *o_accum;
    float *lse_accum;

    /* ---- execution ---- */
    void *stream;           /* GPU stream handle (NULL = the legacy default stream) */
    int device;             /* GPU ordinal */
    int num_threads;        /* CPU worker threads (0 = the pool's size) */
} fmha_fwd_params;

/* Compiled for the host and, in the kernels, for the device. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define FMHA_HOST_DEVICE __host__ __device__
#else
#define FMHA_HOST_DEVICE
#endif

/*
 * Key blocks per split of a plan that sizes them on the device (device_pieces > 0),
 * from the batch's `longest` entry and the `total` of its entries' key blocks (both
 * as the kernels count them: 0 for an entry whose lengths are bad): about `pieces`
 * pieces per tile in all, at least FMHA_DEVICE_CHUNK_MIN_BLOCKS each, and never more than
 * `splits` (num_splits) pieces for one entry.  The planner models its plans with
 * the same function.
 */
FMHA_HOST_DEVICE static inline int64_t fmha_device_chunk(int64_t longest, int64_t total, int64_t splits,
                                                         int64_t pieces)
{
    const int64_t fit = (longest + splits - 1) / splits;
    int64_t chunk = (total + pieces - 1) / pieces;
    chunk = chunk > fit ? chunk : fit;
    chunk = chunk > FMHA_DEVICE_CHUNK_MIN_BLOCKS ? chunk : FMHA_DEVICE_CHUNK_MIN_BLOCKS;
    return chunk > 0 ? chunk : 1;
}

/*
 * Pieces per (row block, head) of the grid of a device-chunk plan.  The grid is compact
 * (fwd_mma.h find_piece): entry b's pieces, max(1, ceil(blocks_b / chunk)) (one at
 * least, so that an empty or bad entry still writes its rows), follow entry b-1's.  As
 * chunk >= total / pieces, they sum to at most sum_b (blocks_b / chunk + 1) <= pieces +
 * batch, and no entry has more than `splits`.
 */
FMHA_HOST_DEVICE static inline int64_t fmha_device_grid_pieces(int64_t pieces, int64_t batch, int64_t splits)
{
    const int64_t most = pieces + batch, all = splits * batch;
    return most < all ? most : all;
}

/*
 * Merge of num_splits partial states (the split-K combine, also exposed as
 * fmha_native.combine).  Partial o_g are normalised by their own row sums and
 * lse_g is their log-sum-exp; the result is sum_g exp(lse_g - lse) * o_g with
 * lse = log sum_g exp(lse_g).  Splits whose lse is -inf add nothing; a row whose
 * every split is -inf gives out = 0, lse = -inf.
 */
typedef struct fmha_combine_params {
    int64_t num_splits, batch, seqlen_q, heads, head_dim;
    fmha_dtype in_dtype;    /* of the partial outputs */
    fmha_dtype out_dtype;   /* of out */
    const void *o_partial;  /* [num_splits, batch, seqlen_q, heads, head_dim] */
    int64_t op_split_stride, op_batch_stride, op_row_stride, op_head_stride;
    const float *lse_partial; /* [num_splits, batch, heads, seqlen_q] */
    int64_t lp_split_stride, lp_batch_stride, lp_head_stride, lp_row_stride;
    void *out;              /* [batch, seqlen_q, heads, head_dim] */
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    float *lse;             /* [batch, heads, seqlen_q], may be NULL */
    int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
    /* Packed sequences (fmha_fwd_params' geometry): row i of sequence b is row
     * cu_seqlens_q[b] + i of o_partial, lse_partial, out and lse, whose batch strides
     * are then unused; seqlen_q is the longest sequence and rows i >= len_q(b) are
     * skipped.  NULL: dense. */
    const int32_t *cu_seqlens_q;
    int64_t total_q;
    /* [heads] fp32 attention-sink logits folded in after the merge (fmha_fwd_params'
     * rule: they join the denominator only; a row with no partial gives out 0 and
     * lse = sinks[h]); NULL = none. */
    const float *sinks;
    void *stream;
    int device;
    int num_threads;
    /* GPU: the split count the combine's threads are laid out for (0: num_splits).  A
     * plan of device-sized chunks fills about device_pieces / batch of its num_splits
     * slots per entry (the rest hold lse = -inf): laid out for those, half the CTAs
     * fold the same partials.  Any value covers every split. */
    int64_t shape_splits;
} fmha_combine_params;

/* Rows of each GPU tile table (fmha_config.h) that device info can describe. */
#define FMHA_GPU_MAX_CONFIGS 8

/* What a GPU is, read once per device at run time and cached by the host glue. */
typedef struct fmha_device_info {
    int ordinal;
    int is_amd;             /* 1 under a HIP/AMD build */
    int cc_major, cc_minor; /* NVIDIA compute capability; 0/0 on AMD */
    int sm_count;           /* multiprocessors (NVIDIA) or compute units (AMD) */
    int warp_size;
    int max_smem_per_block; /* opt-in limit of one CTA, bytes */
    int max_smem_per_sm;    /* shared memory of one SM, bytes */
    int64_t l2_bytes;
    char name[256];
    char arch[64];          /* "sm_90" or gcnArchName */
    /* Resident CTAs per SM of the compiled producer, [kernel id - 1] (prefill,
     * decode tiles), indexed by the row of the tile table (0 = unknown). */
    int ctas_per_sm[FMHA_GPU_KERNELS][FMHA_GPU_MAX_CONFIGS];
} fmha_device_info;

/*
 * The GPU kernels read q, k, v, k_new and v_new rows in 16-byte chunks
 * (cp.async) and write out in pairs of 16-bit elements: a row must start on a
 * multiple of these element counts, else gpu.c stages the operand into an
 * aligned copy (and the plan says so).
 */
#define FMHA_GPU_ELEM_BYTES 2
#define FMHA_GPU_ALIGN_IN 8  /* elements: 16 bytes */
#define FMHA_GPU_ALIGN_OUT 2 /* elements: 4 bytes */

/* The items of a backend's capability gate, in the order explain() lists them. */
typedef enum fmha_gate_id {
    FMHA_GATE_DEVICE = 0,   /* GPU: kernels built in and a device visible; a = SMs or CUs */
    FMHA_GATE_ARCH = 1,     /* GPU: cc >= 8.0 (a, b = major, minor) or an AMD arch built */
    FMHA_GATE_DTYPE = 2,    /* a = fmha_dtype of q; b = of k/v (FMHA_DTYPE_E4M3: fp8 cache) */
    FMHA_GATE_HEAD_DIM = 3, /* a = head_dim; GPU: a row of fmha_config.h (b: for a head_dim
                               of the sm90 kernel alone, the fmha_sm90_why that refused it,
                               FMHA_SM90_CHOSEN when it takes it), CPU: 1..max (b = max) */
    FMHA_GATE_ALIGNMENT = 4,/* GPU: a = 1 when no operand needs staging; b = 0 (not met)
                               when fp8 K/V rows are not 16-byte aligned (never staged) */
    FMHA_GATE_FEATURES = 5, /* GPU, always met (the tensor-core kernels run window, softcap
                               and sinks); a = FMHA_FEATURE_* bits asked for */
    FMHA_GATE_COUNT
} fmha_gate_id;

/* The model features of a problem (FMHA_GATE_FEATURES' a). */
enum { FMHA_FEATURE_WINDOW = 1, FMHA_FEATURE_SOFTCAP = 2, FMHA_FEATURE_SINKS = 4 };

/* Why a GPU gate item named device is (not) met, in its `b`. */
enum { FMHA_DEVICE_OK = 0, FMHA_DEVICE_NOT_BUILT = 1, FMHA_DEVICE_NONE_VISIBLE = 2 };

typedef struct fmha_gate_item {
    fmha_gate_id id;
    int met;
    int64_t a, b;           /* the numbers explain() words it with (see fmha_gate_id) */
} fmha_gate_item;

/* How the split count was decided. */
typedef enum fmha_split_rule {
    FMHA_SPLITS_FORCED = 0,    /* the caller's num_splits, clamped to the key blocks */
    FMHA_SPLITS_HEURISTIC = 1, /* equal tiles: the time model's best count */
    FMHA_SPLITS_RAGGED = 2,    /* per-entry key lengths: equal chunks of `chunk` key blocks */
    FMHA_SPLITS_DEVICE = 3,    /* lengths on the device: chunks sized there (fmha_device_chunk) */
    FMHA_SPLITS_ONE_PASS = 4,  /* one split: the kernel writes no partials (sm90, not forced) */
} fmha_split_rule;

/*
 * Why the GPU plan runs, or does not run, the sm90 prefill kernel
 * (FMHA_KERNEL_GPU_SM90), in the order plan.c checks.
 */
typedef enum fmha_sm90_why {
    FMHA_SM90_CHOSEN = 0,      /* it runs the problem */
    FMHA_SM90_DECODE,          /* few packed rows per kv head: the decode tiles */
    FMHA_SM90_NOT_HOPPER,      /* not an NVIDIA cc 9.x device */
    FMHA_SM90_NOT_BUILT,       /* the build has no sm_90a code (FMHA_CUDA_ARCHS) */
    FMHA_SM90_ASKED_MMA,       /* FMHA_GPU_PREFILL_KERNEL=mma */
    FMHA_SM90_HEAD_DIM,        /* no row of FMHA_GPU_SM90_CONFIGS */
    FMHA_SM90_KV_CACHE,        /* cache_seqlens / appended keys */
    FMHA_SM90_PAGED,           /* block_table: a paged KV cache */
    FMHA_SM90_FORCED_SPLITS,   /* num_splits >= 2: it writes no split partials */
    FMHA_SM90_UNALIGNED,       /* q/k/v/out base or strides not 16-byte multiples (TMA) */
    FMHA_SM90_SCALE,           /* softmax_scale not positive and finite */
    FMHA_SM90_GRID,            /* batch or heads_q above the grid's 65535 */
    FMHA_SM90_PACKED,          /* the query heads of a kv head fit one old prefill tile */
    FMHA_SM90_SPLITS,          /* the split rule splits the keys on its tiles */
    FMHA_SM90_OUT_DTYPE,       /* out_dtype differs from the inputs': partials + combine */
    FMHA_SM90_KV_FP8,          /* an fp8 KV cache: the tensor-core tiles widen it */
} fmha_sm90_why;

/* The numbers behind the split decision, for explain(). */
typedef struct fmha_split_why {
    fmha_split_rule rule;
    int requested;          /* FORCED: the caller's count */
    int64_t key_blocks;     /* key blocks of a tile (ragged: of the longest entry) */
    int64_t tiles;          /* work tiles (ragged: tiles of one entry) */
    int64_t units;          /* SMs or CPU threads */
    int64_t slots;          /* units x resident CTAs each */
    int64_t waves;          /* HEURISTIC: waves of CTAs over the slots */
    double busy;            /* HEURISTIC: share of the slots busy over those waves */
    int64_t all_key_blocks; /* key blocks of the longest sequence; key_blocks is fewer when a
                               window hides some from every tile (only those are counted) */
    int64_t total_blocks;   /* RAGGED: key blocks of the whole batch */
    int64_t chunk;          /* RAGGED: key blocks per split; DEVICE: at full length */
    int64_t pieces;         /* DEVICE: device_pieces */
    int min_chunk;          /* DEVICE: FMHA_DEVICE_CHUNK_MIN_BLOCKS */
} fmha_split_why;

/*
 * The planner's answer to both "is this supported here?" and "which kernel,
 * which tiles, how many splits?", in numbers and reason codes only:
 * explain.c words it, the backends run it (fmha_plan_apply).
 */
typedef struct fmha_plan {
    fmha_backend backend;
    int supported;          /* every gate item met */
    int kernel_id;          /* FMHA_KERNEL_* (fmha_config.h) */
    int num_splits;         /* effective split count */
    int partials;           /* see fmha_fwd_params.partials */
    int block_m, block_n;
    int pack_gqa;
    int split_blocks;       /* see fmha_fwd_params.split_blocks */
    int64_t device_pieces;  /* see fmha_fwd_params.device_pieces */
    int walkers_per_split;  /* see fmha_fwd_params.walkers_per_split */
    int kv_read_once;       /* see fmha_fwd_params.kv_read_once */
    int schedule;           /* see fmha_fwd_params.schedule */
    fmha_sm90_why sm90_why; /* GPU, supported: why the sm90 kernel runs or not */
    int n_gate;
    fmha_gate_item gate[FMHA_GATE_COUNT];
    fmha_split_why split;   /* valid when supported */
} fmha_plan;

/* ---- planner (plan.c) ---- */

/* Which prefill kernel a GPU plan may take (FMHA_GPU_PREFILL_KERNEL). */
typedef enum fmha_prefill_choice {
    FMHA_PREFILL_AUTO = 0, /* the planner's rule */
    FMHA_PREFILL_MMA = 1,  /* the tensor-core producer only */
    FMHA_PREFILL_SM90 = 2, /* the sm90 kernel wherever it can run, unsplit, even where the
                              rule would take the decode tiles, pack query heads or split
                              the keys */
} fmha_prefill_choice;

/* Where a plan is for: the CPU with num_threads workers, or one GPU. */
typedef struct fmha_target {
    fmha_backend backend;
    int num_threads;                 /* CPU */
    const fmha_device_info *device;  /* GPU; NULL when no device is visible */
    int gpu_compiled;                /* a GPU backend is built into this module */
    const char *hip_archs_built;     /* AMD: ';'-separated gcnArchName prefixes with code
                                        objects; NULL = this build's (FMHA_HIP_ARCHS_BUILT) */
    const char *cuda_archs_built;    /* NVIDIA: ';'-separated FMHA_CUDA_ARCHS entries with
                                        code ("80;90a"); NULL = this build's
                                        (FMHA_CUDA_ARCHS_BUILT) */
    fmha_prefill_choice prefill;     /* GPU: fmha_gpu_prefill_choice() */
} fmha_target;

/*
 * Fill plan for the problem in p (problem fields only are read) on target;
 * requested_splits is the caller's num_splits (0 = heuristic).  Returns
 * FMHA_OK when supported, FMHA_ERR_UNSUPPORTED when some gate item is not met
 * (plan->gate says which).  Never allocates, never touches memory behind p.
 */
fmha_status fmha_plan_make(const fmha_fwd_params *p, const fmha_target *target,
                           int requested_splits, fmha_plan *plan);

/* The AMD archs the gate of target compares against (';'-separated). */
const char *fmha_plan_hip_archs(const fmha_target *target);
/* The NVIDIA archs built for target (';'-separated FMHA_CUDA_ARCHS entries). */
const char *fmha_plan_cuda_archs(const fmha_target *target);
/* Whether head_dim has tiles in the sm90 kernel and none in the tensor-core tables
 * (256): then only Hopper prefill runs it (the gate's head_dim item says why not). */
int fmha_plan_sm90_only_head_dim(int64_t head_dim);

/* Copy the plan's choices into the params the backend reads. */
void fmha_plan_apply(const fmha_plan *plan, fmha_fwd_params *p);

/* Whether a [batch, rows, heads, head_dim] tensor (head_dim stride 1) starts
 * every row on an `align_elems`-element boundary given its element size. */
int fmha_rows_aligned(const void *data, int64_t batch_stride, int64_t row_stride,
                      int64_t head_stride, int64_t head_dim, int64_t align_elems, int64_t elem_bytes);

/* Whether the AMD kernels were built for a device's gcnArchName (e.g.
 * "gfx90a:sramecc+:xnack-": code objects are feature-agnostic, so only the part
 * before the first ':' counts); always 0 in a build without HIP kernels. */
int fmha_hip_arch_built(const char *arch);

/* Number of key blocks a split can own: ceil(max keys / block_n), at least 1. */
int64_t fmha_num_key_blocks(const fmha_fwd_params *p, int block_n);

/* The right bound of the window (fmha_fwd_params): 0 when causal, else window_right. */
int64_t fmha_window_right(const fmha_fwd_params *p);

/* The element type of k and v: p->dtype, or FMHA_DTYPE_E4M3 for an fp8 KV cache. */
fmha_dtype fmha_kv_dtype(const fmha_fwd_params *p);

/* The FMHA_FEATURE_* bits the problem asks for (a window that bounds some side, a softcap,
 * sinks); causal alone is no window. */
int fmha_features(const fmha_fwd_params *p);

/* Key blocks a tile of `rows` query positions can see: fmha_num_key_blocks, or fewer
 * when a window bounds both sides of what it sees (rows + left + right keys, plus one
 * block for misalignment). */
int64_t fmha_visible_key_blocks(const fmha_fwd_params *p, int64_t rows, int block_n);

/* ---- CPU backend (cpu_fwd.c) ---- */
fmha_status fmha_cpu_fwd(fmha_fwd_params *p);
fmha_status fmha_cpu_combine(const fmha_combine_params *c);
int fmha_cpu_num_threads(void);       /* pool size: FMHA_NUM_THREADS or the online CPUs */
const char *fmha_cpu_simd_name(void); /* "avx512bf16", "avx512", "avx2", "scalar": chosen at run time */
const char *fmha_cpu_kernel_name(const fmha_fwd_params *p); /* the level p's dtypes run on */

/* ---- GPU backend (gpu.c; kernels/launch.hip underneath) ---- */
int fmha_gpu_compiled(void);          /* 1 when kernels are built in */
const char *fmha_gpu_platform(void);  /* "cuda", "hip" or "none" */
int fmha_gpu_device_count(void);      /* 0 when none or no runtime */
fmha_status fmha_gpu_device_info(int ordinal, const fmha_device_info **info);
fmha_status fmha_gpu_fwd(fmha_fwd_params *p);
fmha_status fmha_gpu_combine(const fmha_combine_params *c);
const char *fmha_gpu_error_string(void); /* text of the last FMHA_ERR_RUNTIME on this thread */
/* FMHA_GPU_PREFILL_KERNEL=mma|sm90|auto, read once per process (unset, empty or
 * another value: auto). */
fmha_prefill_choice fmha_gpu_prefill_choice(void);

/* Device memory for the host glue (host arrays computed on the GPU, outputs of
 * producers that are neither torch nor CuPy).  Allocation is stream-ordered. */
typedef enum fmha_copy_kind {
    FMHA_COPY_H2D = 0,
    FMHA_COPY_D2H = 1,
} fmha_copy_kind;
fmha_status fmha_gpu_malloc(int device, void *stream, size_t bytes, void **ptr);
fmha_status fmha_gpu_free(int device, void *stream, void *ptr);
fmha_status fmha_gpu_memcpy(int device, void *stream, void *dst, const void *src,
                            size_t bytes, fmha_copy_kind kind);
fmha_status fmha_gpu_stream_sync(int device, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* FMHA_H */
