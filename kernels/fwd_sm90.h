/*
 * fwd_sm90.h: the warp-specialized Hopper (sm_90a) prefill kernel and its
 * host launcher, NVIDIA only, for head_dims 32, 64, 80, 96, 128, 192 and 256
 * (one translation unit each: fwd_sm90_d*.hip).  One CTA owns 64 query rows per
 * consumer warpgroup (192 at head_dims 32 and 64, 128 above: tile_shape) of one
 * (batch, query head) and walks, 128 keys at a time (112 at head_dim 192, 80 at 256),
 * all the key blocks that those rows can see:
 *
 *   producer warpgroup   one elected lane issues TMA loads: Q once a tile, K(j)
 *                        and V(j) into rings of shared-memory stages, each
 *                        stage with a "full" mbarrier (bytes landed) and an
 *                        "empty" one (every consumer is done with it)
 *   consumer warpgroups  64 rows each:
 *                        S = Q K(j)^T                  (wgmma, fp32)
 *                        softcap, masks                (compile-time; masks on boundary blocks)
 *                        online softmax in exp2 units  (scale folded into one FFMA)
 *                        O = O * rescale + P V(j)      (P in registers)
 *                        and at the end O / l through shared memory and a TMA
 *                        store, lse = (m + log2 l) * ln 2
 *
 * Unmasked instances up to head_dim 192 run a persistent grid (persistent_tiles says
 * which): one CTA per SM takes tile after tile (tile_walk), its rings running on from
 * one tile to the next; the others run one tile per CTA.
 *
 * Inside a consumer, S(j+1) is issued before the softmax of block j+1 runs,
 * next to O += P(j) V(j), so the tensor cores stay busy during the softmax.
 * K(j) is released as soon as S(j) has been computed, V(j) after P(j) V(j).
 *
 * Keys (fmha.h): all, bottom-right causal (query i sees key j iff j <= i +
 * seqlen_k - seqlen_q) or a window around the row's position; a tile walks
 * only the key blocks some row of it sees, and masks only the blocks where a
 * row's window starts or ends.  The softcap caps S before the masks and the
 * softmax; a sink joins the row sum in the epilogue.  Rows that see no key
 * give out 0 and lse -inf (with a sink: lse = sink).  Rows of K/V past
 * seqlen_k are outside the tensor maps, so TMA fills them with zeros, and
 * their P is exactly 0: no 0 * NaN can occur.  Packed (varlen) sequences,
 * cu_seqlens_q and/or cu_seqlens_k, run per sequence (struct sequence).
 * KV-cache calls (seqlens_k, appended keys, block tables) and split plans are
 * not this kernel's: the launcher answers FMHA_ERR_UNSUPPORTED for them, and
 * for strides TMA cannot address.
 *
 * The PTX (wgmma, mbarrier, TMA, setmaxnreg) is in mma_sm90.h.  Under sm_80
 * and AMD builds the kernel body is empty and the launcher is not declared
 * for AMD.
 */
#ifndef FMHA_FWD_SM90_H
#define FMHA_FWD_SM90_H

#include "fmha.h"
#include "hip_compat.h"

#if !FMHA_DEVICE_IS_AMD
#include "launch.h"
#include "mma_nvidia.h"
#include "mma_sm90.h"

#include <atomic>
#include <math.h>
#include <type_traits>

namespace fmha {
namespace sm90 {

constexpr int PANEL_COLS = 64;                /* features per 128-byte swizzled panel */
constexpr int PRODUCER_REGS = 24;             /* the producer only issues copies */
constexpr int MAX_CONSUMERS = 3;
constexpr int EPILOGUE_BARRIER = 1;           /* named barrier 1 + consumer index */
constexpr int TURN_BARRIER = 1 + MAX_CONSUMERS; /* named barrier TURN_BARRIER + consumer index (ping-pong) */

/*
 * Consumer warpgroups of 64 rows per CTA.  A warpgroup's softmax must hide
 * under the other warpgroups' products: at head_dim 128 one block's products
 * take about as long as its softmax, so two suffice; at 64 they take half as
 * long and it takes three (a 192-row tile; FMHA_SM90_D64_CONSUMERS in
 * fmha_config.h, whose tile table says the same).  Head_dim 32 takes the d64
 * tiles (the `<= 64` consumers and stages below): it is the same one 64-column
 * panel (smem_plan), so O takes the same registers, and its products are
 * shorter still (S over 32 features).  80 takes the tiles of 96: two panels,
 * O at 128 columns.
 */
/*
 * How the consumer warpgroups share the tensor cores:
 *   INTERLEAVED  each issues its products as soon as its data is there
 *   PINGPONG     they take turns issuing (named barriers), so one's softmax
 *                runs while the others' products do
 */
enum schedule { INTERLEAVED = 0, PINGPONG = 1 };

template <int HEAD_DIM, bool WIDE> struct tile_shape {
    static constexpr int consumers = HEAD_DIM <= 64 ? FMHA_SM90_D64_CONSUMERS : 2;
    static constexpr int block_m = consumers * WGMMA_M;         /* query rows per CTA */
    /* keys per main-loop step: 128, but 112 at head_dim 192, where two stages of 128-key K and
     * V (48 KB each) next to Q (48 KB) would not fit (smem_plan), and 80 at 256, where O takes
     * 128 registers a thread and Q 64 KB (two stages of 80-key K and V: 160 KB); WIDE tiles
     * (wide_blocks() below) may take wider blocks (fmha_config.h) */
    static constexpr int narrow_block_n = HEAD_DIM > 192 ? 80 : HEAD_DIM > 128 ? 112 : 128;
    static constexpr int block_n = WIDE ? FMHA_SM90_WIDE_BLOCK_N(HEAD_DIM, narrow_block_n) : narrow_block_n;
    static constexpr int threads = (1 + consumers) * WARPGROUP_THREADS;
    /* the registers the producer gives up, shared by the consumers (setmaxnreg: multiples of 8) */
    static constexpr int consumer_regs =
        (65536 - PRODUCER_REGS * WARPGROUP_THREADS) / (consumers * WARPGROUP_THREADS) / 8 * 8;
    static_assert(consumers >= 1 && consumers <= MAX_CONSUMERS, "consumer warpgroups");
    static_assert(block_n % WGMMA_K == 0 && block_n <= 256, "wgmma's N and P V's K steps");
    static_assert(consumer_regs <= 256, "setmaxnreg's ceiling");
};

constexpr float LN2 = 0.693147180559945309f;
constexpr float LOG2E = 1.44269504088896341f;

/*
 * Shared memory of one CTA (offsets from a 1024-aligned base).  A head_dim that
 * is not a multiple of 64 (32, 80, 96) takes whole panels all the same: the tensor maps'
 * inner extent is head_dim, so TMA fills a box's columns past it with zeros
 * (and a store drops them).  S then runs over the head_dim features only, and
 * O += P V over all `cols` (zero V columns give zero O columns, never read).
 */
template <int HEAD_DIM, bool WIDE> struct smem_plan {
    static constexpr int panels = (HEAD_DIM + PANEL_COLS - 1) / PANEL_COLS;
    static constexpr int cols = panels * PANEL_COLS; /* O's columns, as P V computes them */
    static constexpr int stages = HEAD_DIM <= 64 ? 3 : 2; /* 3 at d128 fit in 227 KB but gain nothing */
    static constexpr int q_panel = tile_shape<HEAD_DIM, WIDE>::block_m * SWIZZLE_ROW_BYTES;
    static constexpr int kv_panel = tile_shape<HEAD_DIM, WIDE>::block_n * SWIZZLE_ROW_BYTES;
    static constexpr int q_bytes = panels * q_panel;
    static constexpr int kv_bytes = panels * kv_panel; /* one stage of K or of V */
    static constexpr int q_off = 0;
    static constexpr int k_off = q_off + q_bytes;
    static constexpr int v_off = k_off + stages * kv_bytes;
    static constexpr int bar_off = v_off + stages * kv_bytes;
    /* barriers: q_full, then k_full, k_empty, v_full, v_empty of each stage, then q_free */
    static constexpr int bar_bytes = 8 * (2 + 4 * stages);
    static constexpr int bytes = bar_off + bar_bytes + 1024; /* + slack to align the base */
    static_assert(HEAD_DIM % WGMMA_K == 0, "whole K steps of S = Q K^T");
    static_assert(kv_panel % SWIZZLE_ATOM_BYTES == 0, "stages keep the swizzle's 1024-byte phase");
    static_assert(bytes <= 227 * 1024, "fits one SM's shared memory");
};

/* The planner sizes tiles and splits from fmha_config.h's rows: they must be these constants
 * (one CTA per SM: __launch_bounds__(threads, 1) below; one walker, no split partials). */
#define FMHA_SM90_CHECK_ROW(hd, bm, bn, w, st, ctas, wk)                                             \
    static_assert(bm == tile_shape<hd, false>::block_m && bn == tile_shape<hd, false>::block_n &&                    \
                      (w) * WARP_LANES == tile_shape<hd, false>::threads &&                          \
                      st == smem_plan<hd, false>::stages && st == smem_plan<hd, true>::stages &&     \
                      ctas == 1 && wk == 1,                                                          \
                  "FMHA_GPU_SM90_CONFIGS row for head_dim " #hd " matches the sm90 kernel");
FMHA_GPU_SM90_CONFIGS(FMHA_SM90_CHECK_ROW)
#undef FMHA_SM90_CHECK_ROW
static_assert(INTERLEAVED == FMHA_SM90_INTERLEAVED && PINGPONG == FMHA_SM90_PINGPONG,
              "fmha_fwd_params.schedule names these schedules");

/* The CTA's mbarriers.  q_full: a tile's Q has landed (or, for a tile with no key block,
 * the producer says go); q_free: every consumer is done with the Q buffer (its epilogue's
 * TMA store has read it), so the next tile's Q may overwrite it. */
template <int STAGES> struct barriers {
    uint32_t base;
    __device__ uint32_t q_full() const { return base; }
    __device__ uint32_t k_full(int s) const { return base + 8 * (1 + s); }
    __device__ uint32_t k_empty(int s) const { return base + 8 * (1 + STAGES + s); }
    __device__ uint32_t v_full(int s) const { return base + 8 * (1 + 2 * STAGES + s); }
    __device__ uint32_t v_empty(int s) const { return base + 8 * (1 + 3 * STAGES + s); }
    __device__ uint32_t q_free() const { return base + 8 * (1 + 4 * STAGES); }
};

/* Position in a ring: stage, and the parity of its current round. */
template <int STAGES> struct ring_pos {
    int stage = 0;
    uint32_t phase = 0;
    __device__ void advance()
    {
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
};

/* Tensor maps of q (boxes of 64 features x block_m rows), k, v (x block_n rows) and out (x 64 rows). */
struct tensor_maps {
    CUtensorMap q, k, v, o;
};

/*
 * Which keys a row sees (fmha.h's rule), fixed at compile time so that plain
 * and causal launches carry no window arithmetic:
 *   MASK_NONE    every key of the sequence
 *   MASK_CAUSAL  keys up to the row's position (bottom-right)
 *   MASK_WINDOW  keys [pos - left, pos + right], either side unbounded when
 *                negative; causal with a window is a window with right = 0
 * and the score and row-sum extras, compile-time bits of FEATURES:
 *   FEATURE_SOFTCAP  s = c tanh(s / c) before the softmax
 *   FEATURE_SINKS    the head's sink logit joins the row sum in the epilogue
 * Compile-time rather than uniform run-time branches: a branch would keep the
 * cap's code, constants and registers in every plain instance, next to the
 * softmax that the d64 tiles already fill to their register ceiling.
 */
enum mask_kind { MASK_NONE = 0, MASK_CAUSAL = 1, MASK_WINDOW = 2 };
enum feature_bits { FEATURE_SOFTCAP = 1, FEATURE_SINKS = 2 };

/* Whether an instance walks wide key blocks (tile_shape): plan.c's rule (fmha_config.h). */
__host__ __device__ constexpr bool wide_blocks(int schedule, int features)
{
    return FMHA_SM90_WIDE_BLOCKS(schedule, (features & FEATURE_SOFTCAP) != 0);
}

/*
 * Whether an instance runs a persistent grid (tile_walk below): one CTA per SM, each
 * taking tiles in turn, so that the next tile's K/V loads run during a tile's epilogue
 * and a CTA's setup (barriers, register hand-over, tensor-map prefetch) is paid once
 * per SM rather than once per tile.  Only the instances without a mask: the tiles of a
 * dense batch then all walk the same keys, so a fixed stride over them balances the
 * SMs, while causal and windowed tiles keep one tile per CTA, heaviest first, and the
 * hardware hands the next CTA to whichever SM is free.  Not at head_dim 256 (O alone
 * holds 128 registers a thread) nor for the d64 instances with a softcap or sinks,
 * whose consumers already run at their register ceiling.
 */
__host__ __device__ constexpr bool persistent_tiles(int head_dim, int mask, int features)
{
    return FMHA_SM90_PERSISTENT && mask == MASK_NONE && head_dim <= 192 && (head_dim > 64 || features == 0);
}

/* Keys a row sees before / after its position; negative = unbounded. */
struct window {
    int64_t left, right;
};
template <int MASK> __host__ __device__ inline window window_of(const fmha_fwd_params &p)
{
    if (MASK == MASK_NONE)
        return {-1, -1};
    if (MASK == MASK_CAUSAL)
        return {-1, 0};
    /* past any sequence's length a bound changes nothing; capped, it cannot overflow the sums below */
    constexpr int64_t FAR = (int64_t)1 << 40;
    const int64_t right = p.causal ? 0 : p.window_right;
    return {p.window_left > FAR ? FAR : p.window_left, right > FAR ? FAR : right};
}

/*
 * Key blocks [begin, end) some row of the tile [m0, m0 + BLOCK_M) sees (empty
 * when none does).  Positions are consecutive, so the first row's window start
 * and the last row's window end bound the tile's keys.
 */
struct block_span {
    int begin, end;
};
template <int BLOCK_M, int BLOCK_N>
__host__ __device__ inline block_span key_blocks(int64_t m0, int64_t seqlen_q, int64_t seqlen_k, window w)
{
    /* row i sits at key position i + seqlen_k - seqlen_q */
    int64_t begin = 0, end = seqlen_k;
    if (w.right >= 0) {
        const int64_t last_row = (m0 + BLOCK_M < seqlen_q ? m0 + BLOCK_M : seqlen_q) - 1;
        const int64_t last_key = last_row + seqlen_k - seqlen_q + w.right;
        end = last_key + 1 < end ? last_key + 1 : end;
    }
    if (w.left >= 0) {
        const int64_t first_key = m0 + seqlen_k - seqlen_q - w.left;
        begin = first_key > 0 ? first_key : 0;
    }
    if (end <= begin)
        return {0, 0};
    return {(int)(begin / BLOCK_N), (int)((end + BLOCK_N - 1) / BLOCK_N)};
}

/*
 * Where sequence b is (fmha.h's geometry, packed or not): its queries are rows
 * q_row0 + i of batch q_batch in the q/out tensor maps, its keys rows k_row0 + j of
 * batch k_batch in the k/v maps.  Packed rows past a sequence belong to the next
 * one: TMA loads them, the masks drop those keys (P is exactly 0; V rows there are
 * other sequences' values, not garbage) and no row past len_q is stored.  `bad`:
 * device cu_seqlens out of range (clamped; the rows come out NaN).
 */
struct sequence {
    int64_t q_row0, k_row0;
    int q_batch, k_batch;
    int len_q, len_k;
    bool bad;
};
__device__ __forceinline__ sequence sequence_of(const fmha_fwd_params &p, int b)
{
    sequence s{0, 0, b, b, (int)p.seqlen_q, (int)p.seqlen_k, false};
    if (p.cu_seqlens_q) {
        const packed_span q = packed_span_of(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
        s.q_row0 = q.start;
        s.q_batch = 0;
        s.len_q = (int)q.len;
        s.bad = q.bad;
    }
    if (p.cu_seqlens_k) {
        const packed_span k = packed_span_of(p.cu_seqlens_k, b, p.total_k, p.seqlen_k);
        s.k_row0 = k.start;
        s.k_batch = 0;
        s.len_k = (int)k.len;
        s.bad = s.bad || k.bad;
    }
    return s;
}

/*
 * The tiles of a launch: (m_block, head, batch entry) for m_blocks x heads x batch
 * tiles.  Linear index t takes them in the order in which a 3D grid
 * (m_blocks, heads, batch) starts its CTAs (m_block fastest, then head, then batch
 * entry), so the tiles that run at the same time read the same K/V head, which stays
 * in L2.  `last_first` numbers the m_blocks from the last (the heaviest tile first,
 * where the last rows see the most keys).
 */
struct tile {
    int m_block, head, b;
};
struct tile_walk {
    int m_blocks, heads, tiles; /* tiles = m_blocks * heads * batch; < 2^30 when persistent */
    bool last_first;
    __device__ tile place(int m, int head, int b) const { return {last_first ? m_blocks - 1 - m : m, head, b}; }
    __device__ tile at(int t) const
    {
        const int hb = t / m_blocks;
        return place(t - hb * m_blocks, hb % heads, hb / heads);
    }
};

/*
 * Visit this CTA's tiles in order: persistent (1D grid), tiles blockIdx.x,
 * blockIdx.x + gridDim.x, ... below walk.tiles; else the one tile of the 3D grid's
 * blockIdx.  The producer and the consumers run the same walk, so they visit the same
 * tiles in the same order.
 */
template <bool PERSISTENT, typename F> __device__ __forceinline__ void for_each_tile(const tile_walk &walk, F &&visit)
{
    if constexpr (PERSISTENT) {
        for (int t = (int)blockIdx.x; t < walk.tiles; t += (int)gridDim.x)
            visit(walk.at(t));
    } else {
        visit(walk.place((int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z));
    }
}

/*
 * What a tile covers, worked out alike by the producer and the consumers (from the same
 * tile, so they agree): its sequence, first row m0 and key blocks [first_block,
 * end_block).  A tile with no row (m0 >= len_q: a packed sequence shorter than the
 * longest) is skipped by both and touches no barrier; one with rows but no key block (a
 * sequence without keys, a bad one) still runs its epilogue (rows of 0, or NaN).
 */
struct tile_work {
    sequence seq;
    int m0, first_block, end_block;
    __device__ bool has_rows() const { return m0 < seq.len_q; }
};
template <int MASK, int BLOCK_M, int BLOCK_N>
__device__ __forceinline__ tile_work work_of(const fmha_fwd_params &p, window win, const tile &t)
{
    tile_work w;
    w.seq = sequence_of(p, t.b);
    w.m0 = t.m_block * BLOCK_M;
    const block_span span = w.seq.bad || !w.has_rows()
                                ? block_span{0, 0}
                                : key_blocks<BLOCK_M, BLOCK_N>(w.m0, w.seq.len_q, w.seq.len_k, win);
    /* only a window's left side skips leading blocks */
    w.first_block = MASK == MASK_WINDOW ? span.begin : 0;
    w.end_block = span.end;
    return w;
}

/* for_each_tile over the tiles with rows: visit(tile, its tile_work). */
template <bool PERSISTENT, int MASK, int BLOCK_M, int BLOCK_N, typename F>
__device__ __forceinline__ void for_each_work(const tile_walk &walk, const fmha_fwd_params &p, window win,
                                              F &&visit)
{
    for_each_tile<PERSISTENT>(walk, [&](const tile &cur) {
        const tile_work w = work_of<MASK, BLOCK_M, BLOCK_N>(p, win, cur);
        if (w.has_rows())
            visit(cur, w);
    });
}

#if FMHA_HAS_WGMMA
/* The tile products of one consumer warpgroup (its 64 rows), from descriptors built once. */
template <typename T, int HEAD_DIM, bool WIDE> struct tile_products {
    using plan = smem_plan<HEAD_DIM, WIDE>;
    static constexpr int BLOCK_N = tile_shape<HEAD_DIM, WIDE>::block_n;
    static constexpr int K_STEP_BYTES = WGMMA_K * 2; /* 16 features of a 128-byte row */
    static constexpr int K_STEPS_PER_PANEL = SWIZZLE_ROW_BYTES / K_STEP_BYTES;
    uint64_t q_desc, k_desc, v_desc;

    __device__ tile_products(uint32_t base, int consumer)
    {
        /* Q and K are K-major (8-row groups 1024 B apart); V is MN-major, its
         * 64-feature panels kv_panel bytes apart. */
        q_desc = smem_desc(base + plan::q_off + consumer * WGMMA_M * SWIZZLE_ROW_BYTES, 16, SWIZZLE_ATOM_BYTES);
        k_desc = smem_desc(base + plan::k_off, 16, SWIZZLE_ATOM_BYTES);
        v_desc = smem_desc(base + plan::v_off, plan::kv_panel, SWIZZLE_ATOM_BYTES);
    }

    /* Issue S = Q K^T from K stage `stage` as one wgmma group. */
    __device__ void scores(float (&s)[BLOCK_N / 2], int stage) const
    {
        const uint64_t k_stage = desc_advance(k_desc, (uint32_t)stage * plan::kv_bytes);
        wgmma_fence();
#pragma unroll
        for (int kd = 0; kd < HEAD_DIM / WGMMA_K; kd++) {
            const uint32_t panel = kd / K_STEPS_PER_PANEL, within = kd % K_STEPS_PER_PANEL * K_STEP_BYTES;
            wgmma<T, BLOCK_N>::ss(s, desc_advance(q_desc, panel * plan::q_panel + within),
                                  desc_advance(k_stage, panel * plan::kv_panel + within), kd > 0);
        }
        wgmma_commit();
    }

    /* Issue O += P V from V stage `stage` as one wgmma group; p must not change until it completes. */
    __device__ void accumulate(float (&o)[plan::cols / 2], const uint32_t (&p)[BLOCK_N / WGMMA_K][4], int stage) const
    {
        const uint64_t v_stage = desc_advance(v_desc, (uint32_t)stage * plan::kv_bytes);
        wgmma_fence();
#pragma unroll
        for (int kn = 0; kn < BLOCK_N / WGMMA_K; kn++)
            wgmma<T, plan::cols>::rs(o, p[kn], desc_advance(v_stage, kn * WGMMA_K * SWIZZLE_ROW_BYTES));
        wgmma_commit();
    }

    /* Until at most N groups are in flight; then acc may be read. */
    template <int N, int R> static __device__ void wait(float (&acc)[R])
    {
        wgmma_wait<N>();
        fence_regs(acc);
    }
};

/*
 * Accumulator layout (mma_sm90.h): of a 64 x N tile, warp w of the warpgroup
 * holds rows 16w + g and 16w + g + 8 (g = lane / 4); float 4t + e is column
 * 8t + 2 (lane % 4) + e % 2 of row half e / 2.
 */
constexpr int ROW_HALVES = 2;

/* The running max (log2 units, scale applied) and the thread's part of the row sum. */
struct softmax_rows {
    float max[ROW_HALVES], sum[ROW_HALVES];
};

/* Keys above `last[half]` (block-relative) become -inf.  S holds SN = BLOCK_N / 2 floats. */
template <int SN> __device__ __forceinline__ void mask_scores(float (&s)[SN], const int (&last)[ROW_HALVES], int lane)
{
    constexpr int BLOCK_N = 2 * SN;
    const int col0 = 2 * (lane % LANES_PER_ROW);
#pragma unroll
    for (int t = 0; t < BLOCK_N / 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (t * 8 + col0 + e % 2 > last[e / 2])
                s[t * 4 + e] = -INFINITY;
}

/* Keys outside [first[half], last[half]] (block-relative) become -inf: a window's two edges. */
template <int SN>
__device__ __forceinline__ void mask_scores(float (&s)[SN], const int (&first)[ROW_HALVES],
                                            const int (&last)[ROW_HALVES], int lane)
{
    constexpr int BLOCK_N = 2 * SN;
    const int col0 = 2 * (lane % LANES_PER_ROW);
#pragma unroll
    for (int t = 0; t < BLOCK_N / 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = t * 8 + col0 + e % 2;
            if (col < first[e / 2] || col > last[e / 2])
                s[t * 4 + e] = -INFINITY;
        }
}

/*
 * The logit softcap, in place: S -> tanh(S * scale / c), the capped score
 * c tanh(scale q.k / c) in units of c (the softmax then takes it times
 * c log2(e)).  tanh_fast's relative error (about 2^-11) moves a capped score
 * s by at most |s| 2^-11, so its weight e^s by a factor within e^(|s| 2^-11):
 * under one bfloat16 ulp (2^-8) of the weight while |s| <= 8, 2.5% at the cap
 * of c = 50.  Masks come after it, so masked keys stay -inf.
 */
template <int SN> __device__ __forceinline__ void softcap_scores(float (&s)[SN], float scale_over_cap)
{
#pragma unroll
    for (int i = 0; i < SN; i++)
        s[i] = tanh_fast(s[i] * scale_over_cap);
}

/*
 * One block of the online softmax, in place: S -> P = exp2(S * scale_log2 -
 * m_new), the running max and sum updated, and rescale[half] = exp2(m - m_new)
 * for the O rows accumulated so far.  A row that has seen only masked keys
 * keeps m = -inf and shifts by 0, so its P and rescale are 0, not NaN.
 * fixed (warp-uniform): scores with known bounds (a softcap's: fixed_shift_of)
 * shift by fixed_shift in every block, so the max stays unused and rescale is 1.
 */
template <int SN>
__device__ __forceinline__ void online_softmax(float (&s)[SN], softmax_rows &st, float (&rescale)[ROW_HALVES],
                                               float scale_log2, bool fixed, float fixed_shift)
{
    constexpr int BLOCK_N = 2 * SN;
#pragma unroll
    for (int half = 0; half < ROW_HALVES; half++) {
        float shift = fixed_shift;
        rescale[half] = 1.f;
        if (!fixed) {
            float mx0 = s[2 * half], mx1 = s[2 * half + 1];
#pragma unroll
            for (int t = 1; t < BLOCK_N / 8; t++) {
                mx0 = fmaxf(mx0, s[t * 4 + 2 * half]);
                mx1 = fmaxf(mx1, s[t * 4 + 2 * half + 1]);
            }
            const float m_new = fmaxf(st.max[half], quad_max(fmaxf(mx0, mx1)) * scale_log2);
            shift = m_new == -INFINITY ? 0.f : m_new;
            rescale[half] = exp2_fast(st.max[half] - shift);
            st.max[half] = m_new;
        }
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int t = 0; t < BLOCK_N / 8; t++) {
            float &a = s[t * 4 + 2 * half], &b = s[t * 4 + 2 * half + 1];
            a = exp2_fast(fmaf(a, scale_log2, -shift));
            b = exp2_fast(fmaf(b, scale_log2, -shift));
            sum0 += a;
            sum1 += b;
        }
        st.sum[half] = st.sum[half] * rescale[half] + (sum0 + sum1);
    }
}

/*
 * The fixed shift (log2 units) of bfloat16 scores under a softcap c up to
 * FMHA_SM90_FIXED_SHIFT_MAX_CAP (fmha_config.h says why it is safe), else -1 for
 * the running max: the capped scores lie in (-c log2 e, c log2 e).
 */
template <typename T> __device__ __forceinline__ float fixed_shift_of(bool softcap, float cap)
{
    if (!std::is_same<T, fmha_bf16>::value || !softcap || !(cap <= FMHA_SM90_FIXED_SHIFT_MAX_CAP))
        return -1.f;
    return rintf(fminf(cap, FMHA_SM90_FIXED_SHIFT_FLOOR - cap) * LOG2E);
}

template <int D> __device__ __forceinline__ void rescale_rows(float (&o)[D], const float (&rescale)[ROW_HALVES])
{
#pragma unroll
    for (int i = 0; i < D; i++)
        o[i] *= rescale[(i % 4) / 2];
}

/* P (fp32, accumulator layout) as the 16-bit A operands of O += P V, 16 keys each. */
template <typename T, int SN>
__device__ __forceinline__ void p_operands(uint32_t (&p)[SN / 8][4], const float (&s)[SN])
{
    constexpr int BLOCK_N = 2 * SN;
#pragma unroll
    for (int kn = 0; kn < BLOCK_N / WGMMA_K; kn++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            p[kn][r] = mma_type<T>::pack(s[8 * kn + 2 * r], s[8 * kn + 2 * r + 1]);
}
#endif /* FMHA_HAS_WGMMA */

template <typename T, int HEAD_DIM, int MASK, int FEATURES, int SCHEDULE>
__global__ void __launch_bounds__(tile_shape<HEAD_DIM, wide_blocks(SCHEDULE, FEATURES)>::threads, 1)
fwd_sm90_kernel(const __grid_constant__ tensor_maps maps, const fmha_fwd_params p)
{
#if FMHA_HAS_WGMMA
    constexpr bool WIDE = wide_blocks(SCHEDULE, FEATURES);
    using plan = smem_plan<HEAD_DIM, WIDE>;
    using shape = tile_shape<HEAD_DIM, WIDE>;
    constexpr int STAGES = plan::stages;
    constexpr int BLOCK_M = shape::block_m, CONSUMERS = shape::consumers;
    constexpr int BLOCK_N = shape::block_n;
    extern __shared__ unsigned char smem_raw[];
    /* The 128-byte swizzle repeats every 1024 bytes: align the base to it. */
    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t base = (raw + 1023u) & ~1023u;
    unsigned char *smem = smem_raw + (base - raw);
    const barriers<STAGES> bars{base + plan::bar_off};
    constexpr bool PERSISTENT = persistent_tiles(HEAD_DIM, MASK, FEATURES);

    /* The tiles, heaviest first: where the window's right side is bounded (causal) the
     * last rows see the most keys; with only its left side bounded, the first rows. */
    const window win = window_of<MASK>(p);
    const bool last_first = MASK == MASK_CAUSAL || (MASK == MASK_WINDOW && win.right >= 0);
    const int m_blocks = (int)((p.seqlen_q + BLOCK_M - 1) / BLOCK_M); /* the 3D grid's x */
    const tile_walk walk{m_blocks, (int)p.heads_q, PERSISTENT ? m_blocks * (int)p.heads_q * (int)p.batch : 0,
                         last_first};

    if (threadIdx.x == 0) {
        mbar_init(bars.q_full(), 1);
        mbar_init(bars.q_free(), CONSUMERS); /* one thread of each consumer warpgroup */
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bars.k_full(s), 1); /* the producer's arrive + the bytes */
            mbar_init(bars.v_full(s), 1);
            mbar_init(bars.k_empty(s), CONSUMERS * WARPGROUP_THREADS); /* every consumer thread */
            mbar_init(bars.v_empty(s), CONSUMERS * WARPGROUP_THREADS);
        }
        mbar_init_fence();
    }
    __syncthreads();
    /* Launched overlapped, nothing in memory is touched before the grid before this one is done. */
    fmha_wait_prior_grid();

    /*
     * Across the tiles a CTA visits (tile_work::has_rows), the barriers run on:
     * - the K/V rings are one stream of key blocks, tile after tile: producer and
     *   consumers keep their ring positions from one tile to the next;
     * - q_full and q_free complete one phase per visited tile, so the parity of the
     *   count of visited tiles picks the phase to wait for;
     * - the named barriers (turns, epilogue) complete every phase they begin within the
     *   tile.
     */
    const int warpgroup = (int)threadIdx.x / WARPGROUP_THREADS;
    if (warpgroup == 0) {
        /* ---- producer ---- */
        warpgroup_reg_dealloc<PRODUCER_REGS>();
        if (threadIdx.x / WARP_LANES == 0 && elect_one()) {
            const int group = (int)(p.heads_q / p.heads_kv);
            tma_prefetch_map(&maps.k);
            tma_prefetch_map(&maps.v);
            ring_pos<STAGES> pos;
            uint32_t visited = 0;
            for_each_work<PERSISTENT, MASK, BLOCK_M, BLOCK_N>(walk, p, win, [&](const tile &cur, const tile_work &w) {
                const sequence &seq = w.seq;
                const int kv_head = cur.head / group, n_blocks = w.end_block - w.first_block;
                const uint32_t q_parity = visited++ & 1;
                /* Wait until every consumer released this stage's previous round
                 * (in the first round the parity before the first phase passes at once). */
                auto load_k = [&](int j) {
                    mbar_wait(bars.k_empty(pos.stage), pos.phase ^ 1);
                    mbar_arrive_expect_tx(bars.k_full(pos.stage), plan::kv_bytes);
#pragma unroll
                    for (int pn = 0; pn < plan::panels; pn++)
                        tma_load_4d(base + plan::k_off + pos.stage * plan::kv_bytes + pn * plan::kv_panel, &maps.k,
                                    bars.k_full(pos.stage), pn * PANEL_COLS, (int)(seq.k_row0 + (int64_t)j * BLOCK_N),
                                    kv_head, seq.k_batch);
                };
                auto load_v = [&](int j) {
                    mbar_wait(bars.v_empty(pos.stage), pos.phase ^ 1);
                    mbar_arrive_expect_tx(bars.v_full(pos.stage), plan::kv_bytes);
#pragma unroll
                    for (int pn = 0; pn < plan::panels; pn++)
                        tma_load_4d(base + plan::v_off + pos.stage * plan::kv_bytes + pn * plan::kv_panel, &maps.v,
                                    bars.v_full(pos.stage), pn * PANEL_COLS, (int)(seq.k_row0 + (int64_t)j * BLOCK_N),
                                    kv_head, seq.k_batch);
                };
                /* The Q buffer is the previous tile's output buffer: wait until every consumer's
                 * epilogue is done with it (the first tile's wait passes at once).  A tile without
                 * key blocks loads no Q, but its consumers still wait for this go: their epilogue
                 * writes the same buffer. */
                auto load_q = [&] {
                    mbar_wait(bars.q_free(), q_parity ^ 1);
                    if (n_blocks == 0) {
                        mbar_arrive(bars.q_full());
                        return;
                    }
                    mbar_arrive_expect_tx(bars.q_full(), plan::q_bytes);
#pragma unroll
                    for (int pn = 0; pn < plan::panels; pn++)
                        tma_load_4d(base + plan::q_off + pn * plan::q_panel, &maps.q, bars.q_full(), pn * PANEL_COLS,
                                    (int)(seq.q_row0 + w.m0), cur.head, seq.q_batch);
                };
                /* K of the first block goes ahead of Q: its stage is free while the previous
                 * tile's epilogue still holds the Q buffer. */
                if (n_blocks > 0)
                    load_k(w.first_block);
                load_q();
                for (int j = w.first_block; j < w.end_block; j++, pos.advance()) {
                    if (j > w.first_block)
                        load_k(j);
                    load_v(j);
                }
            });
        }
    } else {
        /* ---- consumers: 64 rows each ---- */
        warpgroup_reg_alloc<shape::consumer_regs>();
        const int consumer = warpgroup - 1;
        const int tid = (int)threadIdx.x % WARPGROUP_THREADS, warp = tid / WARP_LANES, lane = tid % WARP_LANES;
        const int row_in_tile = consumer * WGMMA_M + warp * 16 + lane / LANES_PER_ROW; /* + 8 * half */
        const tile_products<T, HEAD_DIM, WIDE> mma(base, consumer);

        /* The scores as exp2 arguments come from S * score_log2 (online_softmax); with the
         * softcap S is first tanh(S * scale / c), the capped score over c. */
        constexpr bool SOFTCAP = (FEATURES & FEATURE_SOFTCAP) != 0;
        const float scale_over_cap = SOFTCAP ? p.softmax_scale / p.softcap : 0.f;
        auto score_log2 = [&] { return SOFTCAP ? p.softcap * LOG2E : p.scale_log2; };
        const float fixed_shift = fixed_shift_of<T>(SOFTCAP, p.softcap);
        const bool fixed = fixed_shift >= 0.f;

        /*
         * Ping-pong: a warpgroup issues a group of products only on its turn
         * (its barrier: its own 128 threads sync, the previous warpgroup's 128
         * arrive) and then hands the turn to the next, round the ring.
         * Consumer 0 goes first; all issue the same n_blocks + 1 groups, and the
         * last consumer does not hand over after its last, so every barrier
         * phase completes exactly.
         */
        auto take_turn = [&] {
            if constexpr (SCHEDULE == PINGPONG)
                named_barrier_sync(TURN_BARRIER + consumer, 2 * WARPGROUP_THREADS);
        };
        auto pass_turn = [&](bool last) {
            if constexpr (SCHEDULE == PINGPONG)
                if (!(last && consumer == CONSUMERS - 1))
                    named_barrier_arrive(TURN_BARRIER + (consumer + 1) % CONSUMERS, 2 * WARPGROUP_THREADS);
        };

        ring_pos<STAGES> ring; /* the K/V ring position at the start of the next tile */
        uint32_t visited = 0;
        for_each_work<PERSISTENT, MASK, BLOCK_M, BLOCK_N>(walk, p, win, [&](const tile &cur, const tile_work &w) {
            const sequence &seq = w.seq;
            const int m0 = w.m0, head = cur.head, b = cur.b, seqlen_q = seq.len_q, seqlen_k = seq.len_k;
            const int first_block = w.first_block, end_block = w.end_block, n_blocks = end_block - first_block;

            /*
             * Masks: block j needs one when it runs past seqlen_k, past the window's end
             * of this warpgroup's first row (the causal diagonal) or before the window's
             * start of its last row; the blocks between go unmasked.
             */
            const int64_t diag = (int64_t)seqlen_k - seqlen_q; /* row i sits at key position i + diag */
            const int64_t first_pos = (int64_t)m0 + consumer * WGMMA_M + diag;
            const int64_t mask_free_end =
                win.right >= 0 && first_pos + win.right + 1 < seqlen_k ? first_pos + win.right + 1 : seqlen_k;
            /* A window's keys [key_lo, key_hi] of each row and its mask-free start, clamped
             * into [-1, seqlen_k] so that ints hold them: worked out once, few registers. */
            int key_lo[ROW_HALVES] = {0, 0}, key_hi[ROW_HALVES] = {0, 0}, free_begin = 0, free_end = 0;
            if constexpr (MASK == MASK_WINDOW) {
                auto in_keys = [&](int64_t key) {
                    return (int)(key < -1 ? -1 : key > seqlen_k ? seqlen_k : key);
                };
#pragma unroll
                for (int half = 0; half < ROW_HALVES; half++) {
                    const int64_t pos = m0 + row_in_tile + 8 * half + diag;
                    key_lo[half] = win.left >= 0 ? in_keys(pos - win.left) : 0;
                    key_hi[half] =
                        in_keys(win.right >= 0 && pos + win.right < seqlen_k - 1 ? pos + win.right : seqlen_k - 1);
                }
                free_begin = win.left >= 0 ? in_keys(first_pos + WGMMA_M - 1 - win.left) : 0;
                free_end = in_keys(mask_free_end);
            }
            auto masked = [&](float(&s)[BLOCK_N / 2], int j) {
                if constexpr (MASK == MASK_WINDOW) {
                    const int key0 = j * BLOCK_N;
                    if (key0 >= free_begin && key0 + BLOCK_N <= free_end)
                        return;
                    int first[ROW_HALVES], last[ROW_HALVES];
#pragma unroll
                    for (int half = 0; half < ROW_HALVES; half++) {
                        const int f = key_lo[half] - key0, l = key_hi[half] - key0;
                        first[half] = f < 0 ? 0 : f > BLOCK_N ? BLOCK_N : f;
                        last[half] = l < -1 ? -1 : l > BLOCK_N ? BLOCK_N : l;
                    }
                    mask_scores(s, first, last, lane);
                } else {
                    const int64_t key0 = (int64_t)j * BLOCK_N;
                    if (key0 + BLOCK_N <= mask_free_end)
                        return;
                    int last[ROW_HALVES];
#pragma unroll
                    for (int half = 0; half < ROW_HALVES; half++) {
                        int64_t l = seqlen_k - 1 - key0;
                        if (MASK == MASK_CAUSAL) {
                            const int64_t c = m0 + row_in_tile + 8 * half + diag - key0;
                            l = c < l ? c : l;
                        }
                        last[half] = l < -1 ? -1 : l > BLOCK_N ? BLOCK_N : (int)l;
                    }
                    mask_scores(s, last, lane);
                }
            };
            /* S of block j as the softmax takes it: capped, then masked. */
            auto logits = [&](float(&s)[BLOCK_N / 2], int j) {
                if constexpr (SOFTCAP)
                    softcap_scores(s, scale_over_cap);
                masked(s, j);
            };

            float o[plan::cols / 2];
#pragma unroll
            for (int i = 0; i < plan::cols / 2; i++)
                o[i] = 0.f;
            softmax_rows st;
#pragma unroll
            for (int half = 0; half < ROW_HALVES; half++) {
                st.max[half] = -INFINITY;
                st.sum[half] = 0.f;
            }
            /* the softmax of block j's S (after logits(s, j)) */
            auto softmax = [&](float(&s)[BLOCK_N / 2], float(&rescale)[ROW_HALVES]) {
                online_softmax(s, st, rescale, score_log2(), fixed, fixed_shift);
            };

            /* With key blocks: Q has landed.  Without: the previous tile's store is done with
             * the buffer the epilogue writes (the producer waited for q_free). */
            if (SCHEDULE == PINGPONG && consumer == CONSUMERS - 1 && n_blocks > 0)
                named_barrier_arrive(TURN_BARRIER, 2 * WARPGROUP_THREADS); /* consumer 0 first */
            mbar_wait(bars.q_full(), visited++ & 1);
            if (n_blocks > 0) {
                float s[BLOCK_N / 2], rescale[ROW_HALVES];
                uint32_t pv[BLOCK_N / WGMMA_K][4];
                ring_pos<STAGES> k_pos = ring, v_pos = ring;

                /* Block 0: S = Q K^T, softmax (O is still 0: nothing to rescale). */
                mbar_wait(bars.k_full(k_pos.stage), k_pos.phase);
                take_turn();
                mma.scores(s, k_pos.stage);
                pass_turn(false);
                mma.template wait<0>(s);
                mbar_arrive(bars.k_empty(k_pos.stage));
                k_pos.advance();
                logits(s, first_block);
                softmax(s, rescale);
                p_operands<T>(pv, s);

                for (int j = first_block; j + 1 < end_block; j++) {
                    /* S(j+1) = Q K(j+1)^T, issued ahead of O += P(j) V(j). */
                    mbar_wait(bars.k_full(k_pos.stage), k_pos.phase);
                    take_turn();
                    mma.scores(s, k_pos.stage);
                    mbar_wait(bars.v_full(v_pos.stage), v_pos.phase);
                    mma.accumulate(o, pv, v_pos.stage);
                    pass_turn(false);

                    /* S(j+1) done: K(j+1) free; the softmax runs under P(j) V(j). */
                    mma.template wait<1>(s);
                    mbar_arrive(bars.k_empty(k_pos.stage));
                    k_pos.advance();
                    logits(s, j + 1);
                    softmax(s, rescale);

                    /* P(j) V(j) done: V(j) free; O takes the new max, P(j+1) replaces P(j). */
                    mma.template wait<0>(o);
                    mbar_arrive(bars.v_empty(v_pos.stage));
                    v_pos.advance();
                    /* A rescale of exactly 1 (no row of the warp found a new max: exp2(0) is 1)
                     * changes no bit of O, so at d64 a warp skips the multiplies then; at d128
                     * the vote costs more than it saves (fmha_config.h).  A fixed shift never
                     * rescales. */
                    if (!fixed && (HEAD_DIM > FMHA_SM90_SKIP_UNIT_RESCALE_MAX_HEAD_DIM ||
                                   __any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)))
                        rescale_rows(o, rescale);
                    p_operands<T>(pv, s);
                }

                /* O += P(last) V(last). */
                mbar_wait(bars.v_full(v_pos.stage), v_pos.phase);
                take_turn();
                mma.accumulate(o, pv, v_pos.stage);
                pass_turn(true);
                mma.template wait<0>(o);
                mbar_arrive(bars.v_empty(v_pos.stage));
                ring = k_pos; /* past this tile's n_blocks blocks, as v_pos is once advanced */
            }

            /*
             * Epilogue: O / l into this warpgroup's own Q rows (no other reader:
             * its S products are complete), in the same swizzled panels, then one
             * thread stores them with TMA, which drops rows past the tensor.  A
             * packed sequence's last rows are followed by the next sequence's, so a
             * warpgroup whose 64 rows run past len_q stores from registers instead,
             * row by row.  A bad sequence's rows are NaN (0 * NaN for out).
             *
             * A sink joins the row sum here (one split: nothing else holds it): in the
             * units of the larger of m and the sink, l' = l 2^(m - mx) + 2^(sink - mx),
             * out = O 2^(m - mx) / l', lse = mx + log2 l'; a row with no key (m = -inf)
             * gets out 0 and lse = sink, and a NaN sink gives NaN rows.
             */
            float inv[ROW_HALVES], lse[ROW_HALVES];
            const float sink = (FEATURES & FEATURE_SINKS) ? p.sinks[head] : -INFINITY, sink_log2 = sink * LOG2E;
#pragma unroll
            for (int half = 0; half < ROW_HALVES; half++) {
                float l = quad_sum(st.sum[half]), o_scale = 1.f;
                float m = !fixed ? st.max[half] : l == 0.f ? -INFINITY : fixed_shift;
                const bool no_key = m == -INFINITY;
                if constexpr ((FEATURES & FEATURE_SINKS) != 0) {
                    const float mx = fmaxf(m, sink_log2);
                    if (mx != -INFINITY || sink != sink) {
                        o_scale = exp2_fast(m - mx);
                        l = l * o_scale + exp2_fast(sink_log2 - mx);
                        m = mx;
                    }
                }
                inv[half] = seq.bad ? NAN : l == 0.f ? 0.f : o_scale / l;
                lse[half] = seq.bad ? NAN : l == 0.f ? -INFINITY : (m + log2f(l)) * LN2;
                if ((FEATURES & FEATURE_SINKS) && no_key && !seq.bad)
                    lse[half] = sink; /* exactly, not through log2 units */
            }
            const int row0 = m0 + consumer * WGMMA_M;
            const bool tma_out = row0 < seqlen_q && (!p.cu_seqlens_q || row0 + WGMMA_M <= seqlen_q);
            if (!tma_out && row0 < seqlen_q) {
                T *out = static_cast<T *>(p.out) + seq.q_row0 * p.o_row_stride +
                         (int64_t)seq.q_batch * p.o_batch_stride + (int64_t)head * p.o_head_stride;
#pragma unroll
                for (int half = 0; half < ROW_HALVES; half++) {
                    const int row = m0 + row_in_tile + 8 * half;
                    if (row < seqlen_q)
#pragma unroll
                        for (int t = 0; t < HEAD_DIM / 8; t++)
                            *reinterpret_cast<uint32_t *>(out + (int64_t)row * p.o_row_stride + t * 8 +
                                                          2 * (lane % LANES_PER_ROW)) =
                                mma_type<T>::pack(o[t * 4 + 2 * half] * inv[half], o[t * 4 + 2 * half + 1] * inv[half]);
                }
            }
            const int g = lane / LANES_PER_ROW, col_pair = (lane % LANES_PER_ROW) * 4; /* bytes */
#pragma unroll
            for (int t = 0; t < HEAD_DIM / 8; t++)
#pragma unroll
                for (int half = 0; half < ROW_HALVES; half++) {
                    const int row = row_in_tile + 8 * half, chunk = t % 8;
                    /* row % 8 == g: the swizzle XOR; lanes of a warp hit 32 different banks */
                    const int off = plan::q_off + t / 8 * plan::q_panel + row * SWIZZLE_ROW_BYTES +
                                    ((chunk ^ g) * 16) + col_pair;
                    *reinterpret_cast<uint32_t *>(smem + off) =
                        mma_type<T>::pack(o[t * 4 + 2 * half] * inv[half], o[t * 4 + 2 * half + 1] * inv[half]);
                }
            fence_proxy_async(); /* ordinary stores, read next by the TMA engine */
            named_barrier_sync(EPILOGUE_BARRIER + consumer, WARPGROUP_THREADS);
            if (tid == 0 && tma_out) {
#pragma unroll
                for (int pn = 0; pn < plan::panels; pn++)
                    tma_store_4d(&maps.o,
                                 base + plan::q_off + pn * plan::q_panel + consumer * WGMMA_M * SWIZZLE_ROW_BYTES,
                                 pn * PANEL_COLS, (int)(seq.q_row0 + row0), head, seq.q_batch);
                tma_store_commit();
            }
            if (p.lse && lane % LANES_PER_ROW == 0) {
                float *lse_rows = p.lse + (p.cu_seqlens_q ? seq.q_row0 * p.lse_row_stride : b * p.lse_batch_stride) +
                                  head * p.lse_head_stride;
#pragma unroll
                for (int half = 0; half < ROW_HALVES; half++) {
                    const int64_t row = (int64_t)m0 + row_in_tile + 8 * half;
                    if (row < seqlen_q)
                        lse_rows[row * p.lse_row_stride] = lse[half];
                }
            }
            /* The shared memory stays until the store has read it; then this warpgroup is done
             * with the Q buffer (its other threads wrote their rows before the epilogue's
             * barrier), and the producer may load the next tile's Q into it. */
            if (tid == 0) {
                if (tma_out)
                    tma_store_wait_read();
                mbar_arrive(bars.q_free());
            }
        });
    }
#endif /* FMHA_HAS_WGMMA */
}

/* The device's SM count, read once per device (past 64 devices on every call). */
inline cudaError_t multiprocessors(int device, int *count)
{
    static std::atomic<int> known[64]; /* 0: not read yet */
    const bool cached = device >= 0 && device < 64;
    if (cached && (*count = known[device].load(std::memory_order_relaxed)) > 0)
        return cudaSuccess;
    cudaError_t err = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess)
        return err;
    if (cached)
        known[device].store(*count, std::memory_order_relaxed);
    return cudaSuccess;
}

/* Launch one instance on `grid`, the 3D grid of tiles (m_blocks, heads_q, batch); a
 * persistent instance (persistent_tiles) runs them on a 1D grid of one CTA per SM, or
 * fewer CTAs when there are fewer tiles (the caller checked that they count < 2^30). */
template <typename T, int HEAD_DIM, int MASK, int FEATURES, int SCHEDULE>
inline cudaError_t launch_instance(const tensor_maps &maps, const fmha_fwd_params &p, dim3 grid)
{
    auto kernel = fwd_sm90_kernel<T, HEAD_DIM, MASK, FEATURES, SCHEDULE>;
    if constexpr (persistent_tiles(HEAD_DIM, MASK, FEATURES)) {
        int sms = 0;
        cudaError_t err = multiprocessors(p.device, &sms);
        if (err != cudaSuccess)
            return err;
        const uint64_t tiles = (uint64_t)grid.x * grid.y * grid.z;
        grid = dim3((unsigned)(tiles < (uint64_t)sms ? tiles : (uint64_t)sms));
    }
    constexpr bool WIDE = wide_blocks(SCHEDULE, FEATURES);
    constexpr int smem = smem_plan<HEAD_DIM, WIDE>::bytes;
    /* The shared-memory limit is an attribute per device: set it once on each (a bit per
     * ordinal; past 64 devices on every call). */
    static std::atomic<uint64_t> smem_allowed{0};
    const uint64_t bit = p.device >= 0 && p.device < 64 ? 1ull << p.device : 0;
    if (!bit || !(smem_allowed.load(std::memory_order_acquire) & bit)) {
        cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess)
            return err;
        smem_allowed.fetch_or(bit, std::memory_order_release);
    }
    kernel<<<grid, tile_shape<HEAD_DIM, WIDE>::threads, smem, (cudaStream_t)p.stream>>>(maps, p);
    return cudaGetLastError();
}

/* The instance for the run-time choices, one compile-time parameter at a time. */
template <typename T, int HEAD_DIM, int MASK, int FEATURES>
inline cudaError_t launch_schedule(const tensor_maps &maps, const fmha_fwd_params &p, dim3 grid, int sched)
{
    return sched == PINGPONG ? launch_instance<T, HEAD_DIM, MASK, FEATURES, PINGPONG>(maps, p, grid)
                             : launch_instance<T, HEAD_DIM, MASK, FEATURES, INTERLEAVED>(maps, p, grid);
}
/* The instance's mask (mask_kind) and features (feature_bits) for p; fmha_features' rule:
 * a window bounds a side, causal alone is no window. */
inline int mask_of(const fmha_fwd_params &p)
{
    if (p.window_left >= 0 || (!p.causal && p.window_right >= 0))
        return MASK_WINDOW;
    return p.causal ? MASK_CAUSAL : MASK_NONE;
}
inline int features_of(const fmha_fwd_params &p)
{
    return (p.softcap > 0.f ? FEATURE_SOFTCAP : 0) | (p.sinks != nullptr ? FEATURE_SINKS : 0);
}
template <typename T, int HEAD_DIM, int MASK>
inline cudaError_t launch_features(const tensor_maps &maps, const fmha_fwd_params &p, dim3 grid, int sched)
{
    switch (features_of(p)) {
    case FEATURE_SOFTCAP | FEATURE_SINKS:
        return launch_schedule<T, HEAD_DIM, MASK, FEATURE_SOFTCAP | FEATURE_SINKS>(maps, p, grid, sched);
    case FEATURE_SOFTCAP:
        return launch_schedule<T, HEAD_DIM, MASK, FEATURE_SOFTCAP>(maps, p, grid, sched);
    case FEATURE_SINKS:
        return launch_schedule<T, HEAD_DIM, MASK, FEATURE_SINKS>(maps, p, grid, sched);
    default:
        return launch_schedule<T, HEAD_DIM, MASK, 0>(maps, p, grid, sched);
    }
}
/* Not inline: each head_dim's instances are compiled in a translation unit of their own
 * (kernels/fwd_sm90_d*.hip, built in parallel); every other includer declares them extern. */
template <typename T, int HEAD_DIM>
cudaError_t launch_mask(const tensor_maps &maps, const fmha_fwd_params &p, dim3 grid, int sched)
{
    switch (mask_of(p)) {
    case MASK_WINDOW:
        return launch_features<T, HEAD_DIM, MASK_WINDOW>(maps, p, grid, sched);
    case MASK_CAUSAL:
        return launch_features<T, HEAD_DIM, MASK_CAUSAL>(maps, p, grid, sched);
    default:
        return launch_features<T, HEAD_DIM, MASK_NONE>(maps, p, grid, sched);
    }
}
#define FMHA_SM90_INSTANCES(kind, hd)                                                                      \
    kind template cudaError_t launch_mask<fmha_half, hd>(const tensor_maps &, const fmha_fwd_params &, dim3, int); \
    kind template cudaError_t launch_mask<fmha_bf16, hd>(const tensor_maps &, const fmha_fwd_params &, dim3, int);
/* (a definition may follow its extern declaration: fwd_sm90_d*.hip) */
FMHA_SM90_INSTANCES(extern, 32)
FMHA_SM90_INSTANCES(extern, 64)
FMHA_SM90_INSTANCES(extern, 80)
FMHA_SM90_INSTANCES(extern, 96)
FMHA_SM90_INSTANCES(extern, 128)
FMHA_SM90_INSTANCES(extern, 192)
FMHA_SM90_INSTANCES(extern, 256)

template <typename T>
inline cudaError_t launch_head_dim(const tensor_maps &maps, const fmha_fwd_params &p, dim3 grid, int sched)
{
    switch (p.head_dim) {
    case 32:
        return launch_mask<T, 32>(maps, p, grid, sched);
    case 64:
        return launch_mask<T, 64>(maps, p, grid, sched);
    case 80:
        return launch_mask<T, 80>(maps, p, grid, sched);
    case 96:
        return launch_mask<T, 96>(maps, p, grid, sched);
    case 128:
        return launch_mask<T, 128>(maps, p, grid, sched);
    case 192:
        return launch_mask<T, 192>(maps, p, grid, sched);
    default:
        return launch_mask<T, 256>(maps, p, grid, sched);
    }
}

/* The tile's query rows and key block for a head_dim with an instance (false: none), of
 * wide or narrow tiles (wide_blocks()). */
inline bool tile_of(int64_t head_dim, bool wide, int *block_m, int *block_n)
{
    switch (head_dim) {
#define FMHA_SM90_TILE_OF(hd)                                                                                       \
    case hd:                                                                                                       \
        *block_m = tile_shape<hd, false>::block_m;                                                                 \
        *block_n = wide ? tile_shape<hd, true>::block_n : tile_shape<hd, false>::block_n;                          \
        return true;
        FMHA_SM90_TILE_OF(32)
        FMHA_SM90_TILE_OF(64)
        FMHA_SM90_TILE_OF(80)
        FMHA_SM90_TILE_OF(96)
        FMHA_SM90_TILE_OF(128)
        FMHA_SM90_TILE_OF(192)
        FMHA_SM90_TILE_OF(256)
#undef FMHA_SM90_TILE_OF
    default:
        return false;
    }
}

}  // namespace sm90

/*
 * Run the prefill in p on p.stream with the sm_90a kernel.  Returns
 * FMHA_ERR_UNSUPPORTED (nothing launched) when the problem is not this
 * kernel's: not a cc 9.x device, dtype or head_dim it has no instance for,
 * KV-cache lengths, block tables or appended keys, a split plan, a non-positive scale,
 * a softcap or window the host glue would have refused,
 * sizes past the grid's limits, or addresses and strides that are not
 * 16-byte multiples (TMA's rule); FMHA_ERR_RUNTIME with *error set when
 * CUDA fails.  `sched` picks how the consumers share the tensor cores
 * (sm90::schedule).  Its tensor maps come from the calling thread's cache
 * (fmha_rows_map), encoded only on a miss.  Window, softcap and sinks pick the
 * instance (mask_kind, feature_bits); plain calls run the instances without them.
 */
inline fmha_status fmha_sm90_prefill_launch(const fmha_fwd_params &p, cudaError_t *error = nullptr,
                                            int sched = sm90::INTERLEAVED)
{
    using namespace sm90;
    if (error)
        *error = cudaSuccess;
    if (p.dtype != FMHA_DTYPE_F16 && p.dtype != FMHA_DTYPE_BF16)
        return FMHA_ERR_UNSUPPORTED;
    int block_m = 0, block_n = 0;
    if (!tile_of(p.head_dim, wide_blocks(sched, features_of(p)), &block_m, &block_n))
        return FMHA_ERR_UNSUPPORTED;
    if (p.seqlens_k || p.k_new || p.v_new || p.seqlen_new != 0 || p.num_splits > 1 || p.block_table)
        return FMHA_ERR_UNSUPPORTED;
    if (!(p.scale_log2 > 0.f) || !isfinite(p.scale_log2))
        return FMHA_ERR_UNSUPPORTED;
    /* the host glue refuses these; the kernel would divide by them or misread the window */
    if (!(p.softcap >= 0.f) || !isfinite(p.softcap) || !(p.softmax_scale > 0.f) || !isfinite(p.softmax_scale) ||
        p.window_left < -1 || p.window_right < -1)
        return FMHA_ERR_UNSUPPORTED;
    if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0 || p.heads_kv <= 0 ||
        p.heads_q % p.heads_kv != 0)
        return FMHA_ERR_UNSUPPORTED;
    if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0)
        return FMHA_OK; /* nothing to write */
    /* Packed q/out (k/v) are one batch entry of total_q (total_k) rows in the tensor maps. */
    const int64_t q_batch = p.cu_seqlens_q ? 1 : p.batch, q_rows = p.cu_seqlens_q ? p.total_q : p.seqlen_q;
    const int64_t k_batch = p.cu_seqlens_k ? 1 : p.batch, k_rows = p.cu_seqlens_k ? p.total_k : p.seqlen_k;
    const int64_t MAX_ROWS = ((int64_t)1 << 31) - 2 * block_n;
    if (p.batch > 65535 || p.heads_q > 65535 || q_rows > MAX_ROWS || k_rows > MAX_ROWS || p.seqlen_q > MAX_ROWS ||
        p.seqlen_k > MAX_ROWS || q_rows < 0 || k_rows < 0)
        return FMHA_ERR_UNSUPPORTED;
    /* A persistent instance numbers its tiles with ints (tile_walk), stepping past the
     * last by up to one SM count. */
    const int64_t m_blocks = (p.seqlen_q + block_m - 1) / block_m;
    if (m_blocks * p.heads_q * p.batch >= ((int64_t)1 << 30) &&
        persistent_tiles((int)p.head_dim, mask_of(p), features_of(p)))
        return FMHA_ERR_UNSUPPORTED;
    int major = 0;
    cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device);
    if (err != cudaSuccess) {
        if (error)
            *error = err;
        return FMHA_ERR_RUNTIME;
    }
    if (major != 9)
        return FMHA_ERR_UNSUPPORTED;
    /* TMA: 16-byte aligned bases and byte strides (the driver checks too; this keeps the answer explicit). */
    auto aligned = [](const void *ptr, int64_t bs, int64_t rs, int64_t hs) {
        return ((uintptr_t)ptr % 16 == 0) && bs % 8 == 0 && rs % 8 == 0 && hs % 8 == 0;
    };
    if (!aligned(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride) ||
        !aligned(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride) ||
        !aligned(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride) ||
        !aligned(p.out, p.o_batch_stride, p.o_row_stride, p.o_head_stride))
        return FMHA_ERR_UNSUPPORTED;

    const bool bf16 = p.dtype == FMHA_DTYPE_BF16;
    /* With no keys (rows) no tile is loaded; the maps still need a row.  A packed
     * tensor's batch stride is unused (one entry): the map gets the tensor's extent. */
    const int64_t kv_rows = k_rows > 0 ? k_rows : 1, qo_rows = q_rows > 0 ? q_rows : 1;
    auto batch_stride = [](bool packed, int64_t stride, int64_t row_stride, int64_t rows) {
        return packed ? row_stride * rows : stride;
    };
    const bool pq = p.cu_seqlens_q != nullptr, pk = p.cu_seqlens_k != nullptr;
    tensor_maps maps;
    if (!fmha_rows_map(&maps.q, p.q, bf16, q_batch, qo_rows, p.heads_q, p.head_dim,
                       batch_stride(pq, p.q_batch_stride, p.q_row_stride, qo_rows), p.q_row_stride, p.q_head_stride,
                       block_m) ||
        !fmha_rows_map(&maps.k, p.k, bf16, k_batch, kv_rows, p.heads_kv, p.head_dim,
                       batch_stride(pk, p.k_batch_stride, p.k_row_stride, kv_rows), p.k_row_stride, p.k_head_stride,
                       block_n) ||
        !fmha_rows_map(&maps.v, p.v, bf16, k_batch, kv_rows, p.heads_kv, p.head_dim,
                       batch_stride(pk, p.v_batch_stride, p.v_row_stride, kv_rows), p.v_row_stride, p.v_head_stride,
                       block_n) ||
        !fmha_rows_map(&maps.o, p.out, bf16, q_batch, qo_rows, p.heads_q, p.head_dim,
                       batch_stride(pq, p.o_batch_stride, p.o_row_stride, qo_rows), p.o_row_stride, p.o_head_stride,
                       WGMMA_M))
        return FMHA_ERR_UNSUPPORTED;

    const dim3 grid((unsigned)m_blocks, (unsigned)p.heads_q, (unsigned)p.batch);
    err = bf16 ? launch_head_dim<fmha_bf16>(maps, p, grid, sched) : launch_head_dim<fmha_half>(maps, p, grid, sched);
    if (err != cudaSuccess) {
        if (error)
            *error = err;
        return FMHA_ERR_RUNTIME;
    }
    return FMHA_OK;
}

}  // namespace fmha

#endif /* !FMHA_DEVICE_IS_AMD */
#endif /* FMHA_FWD_SM90_H */
