/*
 * fwd_mma.h: the tensor-core producer kernel, templated on element type,
 * head_dim, mask kind (mask_kind below) and split.  One CTA owns block_m query
 * rows of one (batch, head) pair, or, with pack_gqa, of one kv head with its query heads
 * interleaved into the rows, and walks the key blocks of its split:
 *
 *   S = Q K^T * scale * log2(e)           (mma, fp32 accumulate)
 *   m_new = max(m, rowmax(S))              (masked keys are -inf)
 *   O, l *= exp2(m - m_new);  P = exp2(S - m_new);  l += rowsum(P)
 *   O += P V                               (P stays in registers)
 *
 * and ends with O / l and lse = (m + log2 l) * ln 2, written either to the
 * output (one split) or to the split scratch for combine.hip.  With a softcap c
 * the scores are c tanh(s / c) before the max, and a sink joins l in the
 * epilogue (one split; the combine folds it after a split's merge).  K and V tiles
 * pass through a cp.async ring of `stages` shared-memory buffers.
 *
 * A walker is a group of warps (the whole CTA, or one warp of a decode CTA)
 * with its own Q tile, K/V ring and key blocks; walkers_per_split of them may
 * share one split's key blocks and merge their rows in shared memory.
 *
 * Each sequence has its own geometry (fmha.h: packed sequences, key lengths, a
 * paged KV cache): the grid is made for the longest one, and make_work gives
 * each walker its sequence's rows and keys; K/V rows of a paged cache come
 * through the block table (paged_rows, a template flag of the kernel, so
 * dense calls run the same code as before).
 */
#ifndef FMHA_FWD_MMA_H
#define FMHA_FWD_MMA_H

#include "fmha.h"
#include "convert.h" /* fp8 codes to 16-bit elements */
#include "fmha_config.h"
#include "fold.h"
#include "hip_compat.h"
#include "launch.h" /* packed_span_of: the clamp of device sequence bounds */
#if FMHA_DEVICE_IS_AMD
#include "mma_amd.h" /* MFMA engine; same fragment interface */
#else
#include "mma_nvidia.h"
#include "mma_sm90.h"
#endif

#include <float.h>
#include <math.h>
#include <type_traits>

namespace fmha {

constexpr float LN2 = 0.693147180559945309f;
constexpr float LOG2E = 1.442695040888963407f;

/*
 * Which keys a row sees besides the sequence's own (fwd_mma_kernel's MASK):
 *   MASK_NONE    every key
 *   MASK_CAUSAL  keys up to its diagonal
 *   MASK_WINDOW  fmha.h's window [pos - left, pos + right] (causal: right = 0; -1
 *                unbounds a side), and the other model features with it: the softcap
 *                (a uniform branch per key block) and sinks (the epilogue).
 * The features ride on the window kind so that the plain kinds' code stays as it
 * was and the instantiations grow by half, not by a factor per feature; the
 * launcher takes MASK_WINDOW whenever fmha_features() is not 0.
 */
enum mask_kind { MASK_NONE = 0, MASK_CAUSAL = 1, MASK_WINDOW = 2 };

constexpr int ELEMS_PER_CHUNK = 8; /* 16-byte copies of 16-bit elements */
/* Elements of T in one 16-byte copy, and the 16-bit columns of shared memory that a
 * row of HEAD_DIM of them fills: a tile of fp8 codes (an fp8 KV cache) is laid out as a
 * tile of 16-bit elements half as wide, so one loader and one layout serve both. */
template <typename T> constexpr int chunk_elems() { return 16 / (int)sizeof(T); }
template <typename T, int HEAD_DIM> constexpr int stored_cols() { return HEAD_DIM * (int)sizeof(T) / 2; }

/* Compile-time tile configuration: one instantiation per row of the tables in fmha_config.h. */
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, int CTAS, int WALKERS>
struct tile_config {
    static constexpr int head_dim = HEAD_DIM, block_m = BLOCK_M, block_n = BLOCK_N;
    static constexpr int warps = WARPS, stages = STAGES, ctas_per_sm = CTAS;
    static constexpr int walkers = WALKERS, walker_warps = WARPS / WALKERS;
    /* O's column parts (fmha_config.h): a walker keeps v_cols columns of O and reads
     * those of V, and computes S over all head_dim features. */
    static constexpr int o_parts = FMHA_GPU_O_PARTS(HEAD_DIM), v_cols = HEAD_DIM / o_parts;
    static_assert(WARPS % WALKERS == 0, "every walker has the same warps");
    static_assert(o_parts == 1 || v_cols % 64 == 0, "a part of O is whole 64-column panels");
    static_assert(WALKERS == 1 || WALKERS == 2 || WALKERS == 4, "walkers_per_split divides the walkers");
    static_assert(WALKERS == 1 || WARPS == WALKERS,
                  "a walker is the whole CTA or one warp (its barrier is __syncthreads or a warp's)");
    static_assert(BLOCK_M % (16 * walker_warps) == 0, "each warp owns whole 16-row mma tiles");
    static_assert(BLOCK_N % 16 == 0 && HEAD_DIM % 16 == 0, "tiles are whole mma k-steps");
    static_assert(STAGES >= 1, "at least one K/V stage");
};

/* The least power of two >= n (n >= 1). */
constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

/*
 * A ROWS x HEAD_DIM tile of 16-bit elements in shared memory, in 16-byte
 * chunks.  When HEAD_DIM is a multiple of 64 the tile is stored as 64-column
 * panels of 128-byte rows, chunk c of row r at c ^ (r % 8): the 8 row
 * addresses of an ldmatrix hit 8 different bank groups, and each panel is
 * exactly the 128-byte-swizzled layout wgmma reads (mma_sm90.h).  Other
 * widths pad each row by one chunk instead.  PLAIN: rows back to back, neither
 * swizzled nor padded, for the fp8 code tiles that only whole-row 16-byte copies
 * and reads touch (consecutive lanes, consecutive chunks: no bank conflict).
 */
template <int ROWS, int HEAD_DIM, bool PLAIN = false> struct smem_tile {
    static constexpr int CHUNKS = HEAD_DIM / ELEMS_PER_CHUNK;
    /* Threads per row in the K/V loaders: CHUNKS rounded up to a power of two, so a
     * pass of a warp's lanes copies whole rows; lanes past CHUNKS copy nothing. */
    static constexpr int LOAD_CHUNKS = pow2_at_least(CHUNKS);
    __device__ static bool copies(int chunk) { return LOAD_CHUNKS == CHUNKS || chunk < CHUNKS; }
    static constexpr int PANEL_CHUNKS = 8; /* 128-byte rows */
    static constexpr bool SWIZZLED = !PLAIN && CHUNKS % PANEL_CHUNKS == 0;
    static constexpr int ROW_BYTES = SWIZZLED ? PANEL_CHUNKS * 16 : (CHUNKS + (PLAIN ? 0 : 1)) * 16;
    static constexpr int PANEL_BYTES = SWIZZLED ? ROWS * ROW_BYTES : 0;
    static constexpr int BYTES = SWIZZLED ? CHUNKS / PANEL_CHUNKS * PANEL_BYTES : ROWS * ROW_BYTES;
    static constexpr int ELEMS = BYTES / 2;
    static_assert(!SWIZZLED || ROWS % 8 == 0, "swizzled panels hold whole 8-row atoms");

    /* Element offset of (row, chunk). */
    __device__ static int offset(int row, int chunk)
    {
        if (!SWIZZLED)
            return (row * ROW_BYTES + chunk * 16) / 2;
        int panel = chunk / PANEL_CHUNKS, within = chunk % PANEL_CHUNKS;
        return (panel * PANEL_BYTES + row * ROW_BYTES + ((within ^ (row & 7)) * 16)) / 2;
    }
    /*
     * Shared address of (row + row_step, chunk + chunk_step) from a lane's own
     * address of (row, chunk), for row_step a multiple of 8, chunk in {0, 1}
     * and chunk_step even.  Then the step inside a panel is an XOR with a
     * constant (chunk + step = chunk ^ step, and the swizzle is an XOR too), so
     * no per-step address registers are needed.  Tile bases are 1024-aligned.
     */
    __device__ static uint32_t step(uint32_t lane_addr, int row_step, int chunk_step)
    {
        if (!SWIZZLED)
            return lane_addr + (uint32_t)(row_step * ROW_BYTES + chunk_step * 16);
        uint32_t a = lane_addr + (uint32_t)(row_step * ROW_BYTES +
                                            chunk_step / PANEL_CHUNKS * PANEL_BYTES);
        return a ^ (uint32_t)(chunk_step % PANEL_CHUNKS * 16);
    }
};

/*
 * How a walker's THREADS threads share the rows of a tile whose rows are LOAD_CHUNKS
 * chunks (smem_tile): LANES threads a row, each copying the chunks lane, lane + LANES,
 * ...  As many lanes as keep a pass of the threads at 8 rows or more, where a row has
 * that many chunks, but at least a 128-byte line's 8: a pass then moves by whole
 * swizzle atoms (or pairs of atom halves), a row's chunks are one pointer plus
 * constants, and every copy instruction still asks for whole lines (a one-warp decode
 * walker at head_dim 128: 8 lanes a row, 2 chunks each, 8 row addresses for a 32-key
 * block instead of 16).
 */
template <int ROWS, int LOAD_CHUNKS, int THREADS> struct row_lanes {
    static constexpr int LINE = 8;                                   /* chunks of a 128-byte line */
    static constexpr int WANT = THREADS / 8 > LINE ? THREADS / 8 : LINE; /* >= 8 rows a pass, a line a row */
    static constexpr int LANES = WANT < LOAD_CHUNKS ? WANT : LOAD_CHUNKS;
    static constexpr int ROWS_PER_PASS = THREADS / LANES, PER_LANE = LOAD_CHUNKS / LANES;
    static constexpr int PASSES = ROWS / ROWS_PER_PASS;
    static_assert(THREADS % LANES == 0 && LOAD_CHUNKS % LANES == 0 && ROWS % ROWS_PER_PASS == 0,
                  "the passes of the threads cover the tile's rows exactly");
};

/*
 * Copy a ROWS x HEAD_DIM tile into shared memory with the THREADS threads of
 * a walker (this one is `tid`); row_ptr(r) gives the global address of row r,
 * or nullptr for rows past the end (zero-filled, so padded keys contribute
 * P = 0 times V = 0, never garbage; the copy names an address in any_valid's row).
 */
template <int ROWS, int HEAD_DIM, int THREADS, typename T, typename RowPtr>
__device__ __forceinline__ void load_tile(T *smem, const T *any_valid, RowPtr row_ptr, int tid)
{
    using tile = smem_tile<ROWS, HEAD_DIM>;
    using lanes = row_lanes<ROWS, tile::LOAD_CHUNKS, THREADS>;
    const int row0 = tid / lanes::LANES, lane = tid % lanes::LANES;
#pragma unroll
    for (int i = 0; i < lanes::PASSES; i++) {
        const int row = row0 + i * lanes::ROWS_PER_PASS;
        const T *src = row_ptr(row);
        const T *from = (src ? src : any_valid) + lane * ELEMS_PER_CHUNK;
#pragma unroll
        for (int c = 0; c < lanes::PER_LANE; c++) {
            const int chunk = lane + c * lanes::LANES;
            if (tile::copies(chunk))
                copy_async_16(smem + tile::offset(row, chunk), from + c * lanes::LANES * ELEMS_PER_CHUNK,
                              src != nullptr);
        }
    }
}

/* 16-byte copies into one shared-memory tile, L2 policy left to the cache (hinted_copy's
 * twin, and every copy where the MMA header has no L2 hints). */
struct plain_copy {
    unsigned char *base;
    __device__ plain_copy(void *tile, uint64_t) : base(static_cast<unsigned char *>(tile)) {}
    __device__ void operator()(int byte_offset, const void *src, bool valid) const
    {
        copy_async_16(base + byte_offset, src, valid);
    }
};

/*
 * The same for rows that are evenly spaced in global memory (K and V): one
 * running pointer instead of one per copied chunk, and rows at or past
 * `valid_rows` zero-filled; put (plain_copy or hinted_copy) writes the tile.  The
 * zero-filling copies read nothing but still name an address: any_valid, one that
 * stays the same from tile to tile, so that no instruction works it out per tile.
 * The rows are shared out as row_lanes says.
 */
template <int ROWS, int HEAD_DIM, int THREADS, typename T, typename Copy>
__device__ __forceinline__ void load_rows(const Copy &put, const T *first_row, int64_t row_stride,
                                          int64_t valid_rows, const T *any_valid, int tid)
{
    using tile = smem_tile<ROWS, stored_cols<T, HEAD_DIM>(), sizeof(T) == 1>;
    using lanes = row_lanes<ROWS, tile::LOAD_CHUNKS, THREADS>;
    constexpr int LANES = lanes::LANES, ROWS_PER_PASS = lanes::ROWS_PER_PASS;
    const int row0 = tid / LANES, lane = tid % LANES;
    const int64_t pass_stride = ROWS_PER_PASS * row_stride;
    const T *src = first_row + row0 * row_stride + lane * chunk_elems<T>();
    const T *stand_in = any_valid + lane * chunk_elems<T>(); /* inside any_valid's row */
    const int valid_here = valid_rows <= 0 ? 0 : valid_rows < ROWS ? (int)valid_rows : ROWS;
#pragma unroll
    for (int i = 0; i < lanes::PASSES; i++, src += pass_stride) {
        const int row = row0 + i * ROWS_PER_PASS;
        const bool valid = row < valid_here;
        const T *from = valid ? src : stand_in;
#pragma unroll
        for (int c = 0; c < lanes::PER_LANE; c++) {
            const int chunk = lane + c * LANES;
            if (tile::copies(chunk))
                put(tile::offset(row, chunk) * 2, from + c * LANES * chunk_elems<T>(), valid);
        }
    }
}

/*
 * fp8 KV cache: a ROWS x HEAD_DIM tile of e4m3fn codes, as load_rows left it, widened
 * into the T tile that the tile products read (exact: every code is a T).  Each item
 * is one 16-byte chunk of codes, two chunks of T.
 */
template <int ROWS, int HEAD_DIM, int THREADS, typename T>
__device__ __forceinline__ void widen_tile(T *dst, const unsigned char *src, int tid)
{
    using codes = smem_tile<ROWS, stored_cols<uint8_t, HEAD_DIM>(), true>;
    using wide = smem_tile<ROWS, HEAD_DIM>;
    constexpr int ITEMS = ROWS * codes::CHUNKS;
#pragma unroll
    for (int i = 0; i < (ITEMS + THREADS - 1) / THREADS; i++) {
        const int idx = i * THREADS + tid;
        if (ITEMS % THREADS != 0 && idx >= ITEMS)
            break;
        const int row = idx / codes::CHUNKS, chunk = idx % codes::CHUNKS;
        const uint4 c = *reinterpret_cast<const uint4 *>(src + codes::offset(row, chunk) * 2);
        const uint2 a = widen_e4m3x4<T>(c.x), b = widen_e4m3x4<T>(c.y);
        const uint2 d = widen_e4m3x4<T>(c.z), e = widen_e4m3x4<T>(c.w);
        /* Chunks 4..7 of eight lanes store their odd half first: the eight 16-byte
         * stores of a phase then land in eight different bank groups. */
        const int first = chunk & 4 ? 1 : 0;
        const uint4 lo = make_uint4(a.x, a.y, b.x, b.y), hi = make_uint4(d.x, d.y, e.x, e.y);
        *reinterpret_cast<uint4 *>(dst + wide::offset(row, 2 * chunk + first)) = first ? hi : lo;
        *reinterpret_cast<uint4 *>(dst + wide::offset(row, 2 * chunk + 1 - first)) = first ? lo : hi;
    }
}

namespace {
/* 16 bytes that are NaN as fp16, bf16 and e4m3fn codes alike (copied into K rows of a
 * bad page), and 16 that are zero (its V rows). */
__device__ const uint4 nan_chunk = {0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu};
__device__ const uint4 zero_chunk = {0u, 0u, 0u, 0u};
}  // namespace

/*
 * The K and V rows of a paged cache (fmha.h): key `key` is row key % page_size
 * of page table[key / page_size], the page stride being k/v_batch_stride.
 * page_size is a multiple of 16 and every key block starts on a multiple of
 * 16, so the 16 rows of an aligned group share a page, and a thread's rows of
 * a block fall into RUNS runs of passes, each inside one group: one page
 * per run.
 *
 * The table is read one key block ahead (fetch, while the block before is
 * being computed), so the copies of a block never wait for a table load, and
 * no division runs per block: a cursor steps the page slot and row of this
 * thread's first row by the walker's block stride (divided once).  Entries of
 * runs past the sequence's keys are not read; an entry outside [0, num_pages)
 * is never dereferenced: its K rows are copied from a NaN chunk, so every row
 * that would see one of its keys gets a NaN score and comes out NaN, while
 * rows that mask the key select -inf as for any other; its V rows are zeros.
 */
template <int ROWS, int COLS, int THREADS, bool PLAIN = false, int V_COLS = COLS> struct paged_rows {
    using tile = smem_tile<ROWS, COLS, PLAIN>; /* COLS: stored_cols of the cache's K rows */
    /* V_COLS: of the V rows a walker reads (its part of O, fmha_config.h FMHA_GPU_O_PARTS):
     * the first chunks of the rows K's copies walk */
    using v_tile = smem_tile<ROWS, V_COLS, PLAIN>;
    static_assert(V_COLS <= COLS, "a part of V is at most a whole row");
    static_assert(THREADS % tile::LOAD_CHUNKS == 0, "a pass of the threads copies whole rows");
    static constexpr int ROWS_PER_PASS = THREADS / tile::LOAD_CHUNKS;
    static_assert(ROWS % 16 == 0 && ROWS % ROWS_PER_PASS == 0, "the passes cover whole 16-row groups");
    static_assert(ROWS_PER_PASS <= 16 ? 16 % ROWS_PER_PASS == 0 : ROWS_PER_PASS % 16 == 0,
                  "a run of passes stays inside one 16-row group");
    static constexpr int RUN = ROWS_PER_PASS <= 16 ? 16 / ROWS_PER_PASS : 1; /* passes per page */
    static constexpr int RUN_ROWS = RUN * ROWS_PER_PASS;                      /* rows between runs */
    static constexpr int RUNS = ROWS / RUN_ROWS;

    /* What the copies of one block need: each run's table entry (-1 when the run has no
     * valid row; checked against num_pages only where it is used, so the check does not
     * wait for the load) and the page row of the first run's first row. */
    struct pages {
        int32_t page[RUNS];
        int32_t row;
    };

    int64_t slot;         /* table slot of this thread's first row in the next block fetched */
    int32_t row;          /* its row in that page */
    int32_t step_slot, step_row; /* the walker's block stride, in pages and rows */
    int32_t page_size;

    /* (slot, row) + n rows, for 0 <= n <= page_size: at most one page boundary crossed. */
    template <typename Slot>
    static __device__ __forceinline__ void advance(Slot &s, int32_t &r, int32_t n, int32_t page_size)
    {
        r += n;
        if (r >= page_size) {
            r -= page_size;
            s += 1;
        }
    }
    /* Run k's row from the first run's (RUN_ROWS steps of 16; page_size >= 16). */
    template <int N, typename Slot>
    static __device__ __forceinline__ void step_runs(Slot &s, int32_t &r, int32_t page_size)
    {
#pragma unroll
        for (int i = 0; i < N * RUN_ROWS / 16; i++)
            advance(s, r, 16, page_size);
    }

    /* The cursor of a walker whose blocks are first_block + j * block_step. */
    __device__ __forceinline__ paged_rows(const fmha_fwd_params &p, int first_block, int block_step, int tid)
    {
        page_size = (int32_t)p.page_size;
        const fmha_qr at = fmha_divide((int64_t)first_block * ROWS + tid / tile::LOAD_CHUNKS, page_size);
        const fmha_qr step = fmha_divide((int64_t)block_step * ROWS, page_size);
        slot = at.q;
        row = (int32_t)at.r;
        step_slot = (int32_t)step.q;
        step_row = (int32_t)step.r;
    }

    /* The pages of key block n_block (the cursor's next block), and step to the one
     * after.  Loads are issued, not waited for: the registers are read by load(). */
    __device__ __forceinline__ pages fetch(const int32_t *table, int64_t n_block, int64_t len_k, int tid)
    {
        pages out;
        out.row = row;
        /* Keys of the sequence from this thread's first row on, clamped to the block
         * (32-bit compares below); the run's rows ascend: none is valid past its first. */
        const int64_t left = len_k - (n_block * ROWS + tid / tile::LOAD_CHUNKS);
        const int32_t keys_left = left < 0 ? 0 : left > ROWS ? ROWS : (int32_t)left;
        const int32_t *entry = table + slot;
        int32_t ds = 0, r = row; /* slots past `slot`, and the row, of each run */
#pragma unroll
        for (int run = 0; run < RUNS; run++) {
            if (run > 0)
                step_runs<1>(ds, r, page_size);
            out.page[run] = run * RUN_ROWS < keys_left ? entry[ds] : -1;
        }
        slot += step_slot;
        advance(slot, row, step_row, page_size);
        return out;
    }

    /* Start the copies of the block whose pages are `at` (fetched for it); rows at or
     * past valid_rows are zero-filled. */
    template <typename T, typename Copy>
    __device__ __forceinline__ void load(const Copy &put_k, const Copy &put_v, const T *k, const T *v,
                                         const fmha_fwd_params &p, const pages &at, int64_t valid_rows,
                                         int tid) const
    {
        const int row0 = tid / tile::LOAD_CHUNKS, chunk = tid % tile::LOAD_CHUNKS;
        if (!tile::copies(chunk))
            return;
        const T *nan_src = reinterpret_cast<const T *>(&nan_chunk);
        const T *zero_src = reinterpret_cast<const T *>(&zero_chunk);
        int32_t unused_slot = 0, r = at.row;
        const int valid_end = valid_rows < ROWS ? (int)valid_rows : ROWS; /* 32-bit row compares */
#pragma unroll
        for (int run = 0; run < RUNS; run++) {
            if (run > 0)
                step_runs<1>(unused_slot, r, page_size);
            const int first = row0 + run * RUN_ROWS;
            const int32_t page = at.page[run];
            const bool ok = (uint64_t)(int64_t)page < (uint64_t)p.num_pages; /* -1 or out of range: not ok */
            /* One base and one row step per run: a bad page repeats the NaN chunk (K) and the
             * zero chunk (V), so K and V rows share one predicate (valid). */
            const T *k_src = ok ? k + page * p.k_batch_stride + r * p.k_row_stride + chunk * chunk_elems<T>() : nan_src;
            const T *v_src = ok ? v + page * p.v_batch_stride + r * p.v_row_stride + chunk * chunk_elems<T>() : zero_src;
            const int64_t k_step = ok ? ROWS_PER_PASS * p.k_row_stride : 0;
            const int64_t v_step = ok ? ROWS_PER_PASS * p.v_row_stride : 0;
#pragma unroll
            for (int i = 0; i < RUN; i++, k_src += k_step, v_src += v_step) {
                const int row = first + i * ROWS_PER_PASS;
                const bool valid = row < valid_end;
                put_k(tile::offset(row, chunk) * 2, k_src, valid);
                if (V_COLS == COLS || chunk < v_tile::CHUNKS)
                    put_v(v_tile::offset(row, chunk) * 2, v_src, valid);
            }
        }
    }
};

/*
 * The work of one walker: which batch entry, heads, rows, and key blocks.
 * Walker unit u runs piece u / walkers_per_split (a tile, a split of its
 * key blocks and a column part of O) and, of that split's blocks, every
 * walkers_per_split-th from sub = u % walkers_per_split on.  The parts of a
 * piece are neighbours, so they read the same K at about the same time.  The
 * splits of a decode tile interleave: its key blocks go round them in groups
 * of walkers_per_split, one block per walker (make_work).
 */
struct cta_work {
    int64_t b;        /* batch entry */
    int64_t slot;     /* query head, or kv head when pack_gqa */
    int64_t group;    /* query heads per kv head */
    int64_t rows;     /* tile rows of this sequence: len_q(b), times group when packed; 0 for an
                         idle walker (the last CTA's walkers past the problem's pieces) */
    int64_t row0;     /* first row of this tile (at or past rows: the tile idles) */
    int64_t len_k;    /* keys of this sequence (0 when its device metadata is bad) */
    int64_t diag;     /* len_k(b) - len_q(b): query i sees keys j <= i + diag (causal) */
    int64_t q_batch;  /* batch index of q/out/lse/scratch rows: b, or 0 when packed */
    int64_t q_start;  /* their row of query 0: cu_seqlens_q[b] (clamped), or 0 */
    int64_t kv_batch; /* batch index of K/V rows: b, or 0 when packed or paged */
    int64_t kv_start; /* their row of key 0: cu_seqlens_k[b] (clamped), or 0 */
    bool bad_len;     /* device lengths that fmha.h's clamp rules reject: rows come out NaN */
    int split;        /* which split of the key blocks */
    int part;         /* which column part of O (fmha_config.h FMHA_GPU_O_PARTS); the LSE,
                         the same in every part, is part 0's to write */
    int unused_from;  /* compact grid (find_piece): the entry's piece count when this walker
                         marks the split slots past it empty (its last piece, sub 0), else 0 */
    int n_first, n_step, n_count; /* this walker's key blocks: n_first + j * n_step, j < n_count */

    bool packed;      /* rows interleave the query heads of kv head `slot` */

    __device__ int block(int j) const { return n_first + j * n_step; }

    /* Packed row r is query r / group of query head slot * group + r % group. */
    __device__ int64_t query_of(int64_t row) const { return packed ? row / group : row; }
    __device__ int64_t head_of(int64_t row) const
    {
        return packed ? slot * group + row % group : slot;
    }
    __device__ int64_t kv_head() const { return packed ? slot : slot / group; }
    /* (query, head) of a row, with 32-bit division where it fits (epilogue only:
     * in the main loop's address math it costs the prefill kernels registers). */
    __device__ fmha_qr place(int64_t row) const
    {
        if (!packed)
            return {row, slot};
        const fmha_qr d = fmha_divide(row, group);
        return {d.q, slot * group + d.r};
    }
};

/* A side of the window (fmha.h), -1 when unbounded; sides past any sequence's length are
 * cut to 2^62, which sees the same keys and keeps position +- side from overflowing. */
__device__ __forceinline__ int64_t window_side(int64_t side)
{
    constexpr int64_t FAR = (int64_t)1 << 62;
    return side > FAR ? FAR : side;
}
__device__ __forceinline__ int64_t window_left(const fmha_fwd_params &p) { return window_side(p.window_left); }
/* The right bound: causal's 0, else window_right. */
__device__ __forceinline__ int64_t window_right(const fmha_fwd_params &p)
{
    return p.causal ? 0 : window_side(p.window_right);
}

/*
 * MASK_WINDOW: the key blocks [first, end) that some row of the tile can see.  The
 * tile's positions ascend with its rows, so its first row's window starts first and
 * its last row's ends last; empty (first == end) when no row sees a key.
 */
struct block_span {
    int64_t first, end;
};
template <int BLOCK_N>
__device__ __forceinline__ block_span window_blocks(const fmha_fwd_params &p, int64_t first_pos, int64_t last_pos,
                                                    int64_t len_k)
{
    const int64_t left = window_left(p), right = window_right(p);
    int64_t lo = left < 0 ? 0 : first_pos - left;
    lo = lo < 0 ? 0 : lo;
    int64_t hi = right < 0 ? len_k - 1 : last_pos + right;
    hi = hi < len_k - 1 ? hi : len_k - 1;
    const int64_t first = lo / BLOCK_N;
    return {first, hi < lo ? first : hi / BLOCK_N + 1};
}

/*
 * Sequence b's lengths and where its rows start (fmha.h's geometry, packed or not).
 * Device lengths are not checked on the host (no sync): they are clamped so that no
 * row outside the tensors is touched, and a sequence they do not describe (`bad`)
 * reads no key (len_k 0) and its rows become NaN.
 */
struct entry_geometry {
    int64_t len_q, len_k;
    int64_t q_start, kv_start; /* row of query 0 / key 0: cu_seqlens (clamped), or 0 */
    bool q_packed, k_packed;   /* rows of one batch entry 0 (cu_seqlens_q / cu_seqlens_k) */
    bool bad;
};
__device__ __forceinline__ entry_geometry entry_of(const fmha_fwd_params &p, int64_t b)
{
    entry_geometry e{p.seqlen_q, p.seqlen_k, 0, 0, p.cu_seqlens_q != nullptr, p.cu_seqlens_k != nullptr, false};
    if (p.cu_seqlens_q) {
        const packed_span s = packed_span_of(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
        e.len_q = s.len;
        e.q_start = s.start;
        e.bad = s.bad;
    }
    if (p.cu_seqlens_k) {
        const packed_span s = packed_span_of(p.cu_seqlens_k, b, p.total_k, p.seqlen_k);
        e.len_k = s.len;
        e.kv_start = s.start;
        e.bad = e.bad || s.bad;
    } else if (p.seqlens_k) {
        /* Cached keys plus the appended ones must fit the capacity: else no key outside the
         * cache is ever read. */
        const int64_t new_len = !p.k_new ? 0 : p.cu_seqlens_q ? e.len_q : p.seqlen_new;
        const int64_t cached = p.seqlens_k[b];
        e.bad = e.bad || cached < 0 || cached + new_len > p.seqlen_k;
        e.len_k = cached + new_len;
    }
    if (e.bad)
        e.len_k = 0;
    return e;
}

/* Key blocks of entry b (0 past the batch). */
template <int BLOCK_N> __device__ __forceinline__ int64_t entry_blocks(const fmha_fwd_params &p, int64_t b)
{
    return b < p.batch ? (entry_of(p, b).len_k + BLOCK_N - 1) / BLOCK_N : 0;
}

/*
 * A plan of device-sized chunks (p.device_pieces > 0, lengths the host never read):
 * the chunk comes from the batch's longest entry and the sum of its entries' key blocks
 * (fmha_device_chunk), and the grid is compact: per (row block, head), entry b's
 * pieces (max(1, ceil(blocks / chunk))) follow entry b - 1's, so piece q is split q -
 * first_b of the entry b with first_b <= q < first_b + pieces_b.  Each warp gathers
 * the lengths and finds its entry with a prefix sum, WARP_LANES entries at a time
 * (the first 2 * WARP_LANES lengths are read once, together); a q past every
 * entry's pieces (the grid is sized for the most there can be,
 * fmha_device_grid_pieces) idles: b = -1.  Every lane of the warp must call it
 * (uniform: it depends on p and q only).
 */
struct device_piece {
    int64_t chunk, b;
    int split, count; /* split of entry b, and the entry's pieces */
};
template <int BLOCK_N>
__device__ __forceinline__ device_piece find_piece(const fmha_fwd_params &p, int64_t q)
{
    constexpr int KEPT = 2; /* rounds of lengths kept in registers (loaded together) */
    const int lane = (int)(threadIdx.x % WARP_LANES);
    int64_t kept[KEPT], total = 0, longest = 0;
#pragma unroll
    for (int k = 0; k < KEPT; k++) {
        kept[k] = entry_blocks<BLOCK_N>(p, lane + k * WARP_LANES);
        total += kept[k];
        longest = kept[k] > longest ? kept[k] : longest;
    }
    for (int64_t b = lane + KEPT * WARP_LANES; b < p.batch; b += WARP_LANES) {
        const int64_t n = entry_blocks<BLOCK_N>(p, b);
        total += n;
        longest = n > longest ? n : longest;
    }
    device_piece found{fmha_device_chunk(warp_max(longest), warp_sum(total), p.num_splits, p.device_pieces),
                       -1, 0, 0};
    int64_t before = 0; /* pieces of the entries before this round's */
    for (int round = 0; (int64_t)round * WARP_LANES < p.batch; round++) {
        const int64_t b = (int64_t)round * WARP_LANES + lane;
        int64_t blocks = round >= KEPT ? entry_blocks<BLOCK_N>(p, b) : 0;
#pragma unroll
        for (int k = 0; k < KEPT; k++)
            blocks = round == k ? kept[k] : blocks; /* selects: no local-memory array */
        /* the entry's pieces, with the 32-bit division where it fits */
        const int64_t n = fmha_divide(blocks + found.chunk - 1, found.chunk).q;
        const int count = b >= p.batch ? 0 : n > 1 ? (int)n : 1;
        const int end = warp_prefix_sum(count), here = warp_read(end, WARP_LANES - 1);
        if (q < before + here) {
            const int at = warp_first(q < before + end);
            found.b = (int64_t)round * WARP_LANES + at;
            found.count = warp_read(count, at);
            found.split = (int)(q - before - warp_read(end, at)) + found.count;
            return found;
        }
        before += here;
    }
    return found;
}

template <int BLOCK_M, int BLOCK_N, int MASK, int WALKERS, int O_PARTS>
__device__ __forceinline__ cta_work make_work(const fmha_fwd_params &p, int64_t unit)
{
    /* A CTA of one walker never shares a split (and the compiler sees the step is 1). */
    const int ws = WALKERS == 1 ? 1 : p.walkers_per_split;
    cta_work w;
    w.packed = p.pack_gqa != 0;
    w.group = p.heads_q / p.heads_kv;
    /* The grid is made for the longest sequence (seqlen_q); tiles past a shorter one's rows idle. */
    const int64_t grid_rows = p.pack_gqa ? p.seqlen_q * w.group : p.seqlen_q;
    int64_t slots = p.pack_gqa ? p.heads_kv : p.heads_q;
    int64_t m_blocks = (grid_rows + BLOCK_M - 1) / BLOCK_M;
    fmha_qr d = fmha_divide(unit, ws);
    const int sub = (int)d.r;
    w.part = 0;
    if constexpr (O_PARTS > 1) {
        d = fmha_divide(d.q, O_PARTS);
        w.part = (int)d.r;
    }
    /* Flattened pieces, rows fastest then heads: pieces that share K/V run together. */
    d = fmha_divide(d.q, m_blocks);
    /* Causal: the last query blocks see the most keys; start them first so the
     * short ones fill the tail of the grid instead of the long ones (a causal
     * window: the first blocks see the fewest). */
    const bool late_first = MASK == MASK_CAUSAL || (MASK == MASK_WINDOW && p.causal);
    const int64_t m_block = late_first ? m_blocks - 1 - d.r : d.r;
    d = fmha_divide(d.q, slots);
    w.slot = d.r;
    /* Then the (entry, split) pieces: all num_splits of each entry, or with device-sized
     * chunks only the ones the entry's length needs (find_piece). */
    int64_t chunk = 0;
    w.unused_from = 0;
    if (p.device_pieces > 0) {
        const device_piece piece = find_piece<BLOCK_N>(p, d.q);
        chunk = piece.chunk;
        w.b = piece.b < 0 ? p.batch : piece.b;
        w.split = piece.split;
        w.unused_from = sub == 0 && piece.split == piece.count - 1 && piece.count < p.num_splits ? piece.count : 0;
    } else {
        d = fmha_divide(d.q, p.num_splits);
        w.split = (int)d.r;
        w.b = d.q;
    }
    const bool active = w.b < p.batch;
    if (!active)
        w.b = 0;
    w.row0 = m_block * BLOCK_M;

    /* This sequence's geometry (fmha.h), its device lengths clamped (entry_of). */
    const entry_geometry e = entry_of(p, w.b);
    const int64_t len_q = active ? e.len_q : p.seqlen_q;
    w.q_batch = active && e.q_packed ? 0 : w.b;
    w.kv_batch = (active && e.k_packed) || p.block_table ? 0 : w.b; /* pages: the batch stride is the page stride */
    w.q_start = active ? e.q_start : 0;
    w.kv_start = active ? e.kv_start : 0;
    w.bad_len = active && e.bad;
    const int64_t len_k = e.len_k;
    w.rows = !active ? 0 : p.pack_gqa ? len_q * w.group : len_q;
    w.len_k = active && !w.bad_len ? len_k : 0;
    w.diag = w.len_k - len_q;

    int64_t n_blocks = (w.len_k + BLOCK_N - 1) / BLOCK_N;
    /* MASK_WINDOW: the splits share only the blocks [base, base + n_blocks) that the
     * tile's rows see (the planner counts these), so the work grows with the window. */
    int64_t base = 0;
    if constexpr (MASK == MASK_WINDOW) {
        const int64_t last_row = (w.row0 + BLOCK_M < w.rows ? w.row0 + BLOCK_M : w.rows) - 1;
        const block_span seen = window_blocks<BLOCK_N>(p, w.query_of(w.row0) + w.diag,
                                                       w.query_of(last_row) + w.diag, w.len_k);
        base = seen.first;
        n_blocks = seen.end - seen.first;
    }
    int64_t per_split = p.device_pieces > 0   ? chunk
                        : p.split_blocks > 0 ? p.split_blocks
                                             : fmha_divide(n_blocks + p.num_splits - 1, p.num_splits).q;
    if constexpr (MASK == MASK_WINDOW) {
        /* The plan's chunk covers the visible blocks of any tile; never drop one if not. */
        const int64_t even = fmha_divide(n_blocks + p.num_splits - 1, p.num_splits).q;
        per_split = per_split > even ? per_split : even;
    }
    /* Decode tiles: the splits interleave.  Of the `used` splits that hold blocks (fewer
     * than num_splits when the blocks run out), split s takes groups s, s + used, ... of
     * ws blocks, so all the splits of a tile walk the keys together: one moving window of
     * K/V in DRAM instead of one per split.  Prefill tiles (one walker) keep contiguous
     * ranges and a step the compiler sees is 1, which saves them a run-time multiply per
     * block. */
    int64_t first, step, end;
    if constexpr (WALKERS > 1) {
        const int64_t used = per_split > 0 ? fmha_divide(n_blocks + per_split - 1, per_split).q : 0;
        first = base + (int64_t)w.split * ws + sub;
        step = used * ws;
        end = w.split < used ? base + n_blocks : 0;
    } else {
        first = base + w.split * per_split;
        step = 1;
        end = first + per_split < base + n_blocks ? first + per_split : base + n_blocks;
    }
    if constexpr (MASK == MASK_CAUSAL) {
        /* The last row of the tile sees keys up to last_query + len_k - len_q. */
        int64_t last_row = (w.row0 + BLOCK_M < w.rows ? w.row0 + BLOCK_M : w.rows) - 1;
        int64_t last_key = w.query_of(last_row) + w.diag;
        int64_t visible = last_key < 0 ? 0 : last_key / BLOCK_N + 1;
        end = end < visible ? end : visible;
    }
    w.n_first = (int)first;
    w.n_step = (int)step;
    /* A tile past this sequence's rows walks nothing (it still meets the CTA's barriers). */
    w.n_count = end > first && w.row0 < w.rows ? (int)((end - first + step - 1) / step) : 0;
    return w;
}

/* x clamped to [-1, BLOCK_N]: an offset within a key block as a small int. */
template <int BLOCK_N> __device__ __forceinline__ int clamp_to_block(int64_t x)
{
    return x < -1 ? -1 : x > BLOCK_N ? BLOCK_N : (int)x;
}

/* The keys [first, last] each of a thread's rows may see (MASK_CAUSAL: last only;
 * MASK_NONE: neither), as absolute key indices. */
template <int MT> struct row_keys {
    int64_t first[MT][ACC_ROWS], last[MT][ACC_ROWS];
};

/*
 * S entries of keys at block offset >= keys_left (past the end), above a
 * row's last visible key or (window) below its first become -inf.  Offsets
 * are block-relative ints, so the compares are cheap; float e of each
 * MMA_N-key tile is key column acc_col(lane) + e % ACC_COLS of row slot
 * e / ACC_COLS (mma_*.h).
 */
template <int MASK, int MT, int NT>
__device__ __forceinline__ void mask_block(float (&s)[MT][NT][4], int keys_left, const row_keys<MT> &keys,
                                           int64_t key0, int lane)
{
    constexpr int BLOCK_N = NT * MMA_N;
    int first_visible[MT][ACC_ROWS], last_visible[MT][ACC_ROWS];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < ACC_ROWS; half++) {
            last_visible[mt][half] = MASK != MASK_NONE ? clamp_to_block<BLOCK_N>(keys.last[mt][half] - key0) : BLOCK_N;
            first_visible[mt][half] = MASK == MASK_WINDOW ? clamp_to_block<BLOCK_N>(keys.first[mt][half] - key0) : 0;
        }
    const int col = acc_col(lane);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = nt * MMA_N + col + e % ACC_COLS;
                if (key >= keys_left || key > last_visible[mt][e / ACC_COLS] ||
                    (MASK == MASK_WINDOW && key < first_visible[mt][e / ACC_COLS]))
                    s[mt][nt][e] = -INFINITY;
            }
}

/*
 * tanh for the softcap, as 1 - 2 / (e^{2x} + 1) from the fast exp2 and reciprocal:
 * its absolute error is a few ulp of 1 (about 3e-7) over the whole range, so the capped
 * score c tanh(s / c) is off by about c * 3e-7, far below the 16-bit rounding of P even
 * at caps of 50.  It saturates to +-1 as e^{2x} overflows or vanishes.  (tanh.approx is
 * one special-function op instead of two, but its relative error of about 2^-11 puts an
 * error of |s| 2^-11 into the exponent: 1e-2 at capped scores of 20, above fp16's
 * rounding of P.)
 */
__device__ __forceinline__ float softcap_tanh(float x)
{
    return 1.f - 2.f * rcp_fast(exp2_fast(2.f * LOG2E * x) + 1.f);
}

/*
 * The scores of a key block in the kernel's log2 units: S * scale_log2, or with a
 * softcap c (MASK_WINDOW, p.softcap > 0, a uniform branch) c tanh(s / c) of the
 * scaled score s = S * softmax_scale, taken in natural units and then times log2(e):
 * (c log2 e) tanh(S * softmax_scale / c).
 */
template <int MASK, int MT, int NT>
__device__ __forceinline__ void scale_scores(float (&s)[MT][NT][4], const fmha_fwd_params &p)
{
    if (MASK == MASK_WINDOW && p.softcap > 0.f) {
        const float in = p.softmax_scale / p.softcap, out = p.softcap * LOG2E;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] = out * softcap_tanh(s[mt][nt][e] * in);
        return;
    }
    const float scale_log2 = p.scale_log2;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[mt][nt][e] *= scale_log2;
}

/* Where a tile's rows stand in the online softmax: running max and sum per row. */
template <int MT> struct softmax_state {
    float row_max[MT][ACC_ROWS], row_sum[MT][ACC_ROWS];
};

/*
 * One key block of the online softmax, in place: S -> P = exp2(S * scale_log2
 * - m_new) (scale_scores: with the softcap) with keys past the end or outside a
 * row's causal limit or window masked (only the blocks outside [mask_free_begin,
 * mask_free_end) need it: one uniform branch skips the rest).  Masking comes after
 * the cap, so a masked key stays -inf.  Updates the running max and sum and returns
 * in `rescale` the factor exp2(m - m_new) that the rows accumulated so far must take.
 */
template <int MASK, int MT, int NT>
__device__ __forceinline__ void softmax_block(float (&s)[MT][NT][4], softmax_state<MT> &st,
                                              float (&rescale)[MT][ACC_ROWS], const fmha_fwd_params &p,
                                              int64_t key0, int64_t mask_free_begin, int64_t mask_free_end,
                                              int64_t len_k, const row_keys<MT> &keys, int lane)
{
    constexpr int BLOCK_N = NT * MMA_N;
    scale_scores<MASK>(s, p);
    if (key0 + BLOCK_N > mask_free_end || (MASK == MASK_WINDOW && key0 < mask_free_begin))
        mask_block<MASK>(s, clamp_to_block<BLOCK_N>(len_k - key0), keys, key0, lane);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < ACC_ROWS; half++) {
            float m_new = st.row_max[mt][half];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float m_tile = s[mt][nt][half * ACC_COLS];
#pragma unroll
                for (int c = 1; c < ACC_COLS; c++)
                    m_tile = fmaxf(m_tile, s[mt][nt][half * ACC_COLS + c]);
                m_new = fmaxf(m_new, m_tile);
            }
            m_new = quad_max(m_new);
            /* A row that has seen only masked keys keeps m = -inf; shift by 0 then. */
            const float shift = m_new == -INFINITY ? 0.f : m_new;
            rescale[mt][half] = exp2_fast(st.row_max[mt][half] - shift);
            st.row_max[mt][half] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = half * ACC_COLS; e < (half + 1) * ACC_COLS; e++) {
                    float pe = exp2_fast(s[mt][nt][e] - shift);
                    s[mt][nt][e] = pe;
                    sum += pe;
                }
            st.row_sum[mt][half] = st.row_sum[mt][half] * rescale[mt][half] + sum;
        }
}

/* Whether some row of this thread must rescale O: a factor of exactly 1 leaves it as it
 * is, so a warp whose rows' maxima all stayed may skip the multiplies (bit-exact). */
template <int MT> __device__ __forceinline__ bool some_row_moved(const float (&rescale)[MT][ACC_ROWS])
{
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < ACC_ROWS; half++)
            moved = moved || rescale[mt][half] != 1.f;
    return moved;
}

/* O rows *= their rescale factor (any accumulator's rows by a factor per row). */
template <int MT, int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[MT][DT][4], const float (&rescale)[MT][ACC_ROWS])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][dt][e] *= rescale[mt][e / ACC_COLS];
}

#if FMHA_DEVICE_IS_AMD
template <typename T, typename cfg, bool WGMMA> struct tile_math
    : mfma_tile_math<T, cfg, smem_tile<cfg::block_m, cfg::head_dim>, smem_tile<cfg::block_n, cfg::head_dim>> {
    using mfma_tile_math<T, cfg, smem_tile<cfg::block_m, cfg::head_dim>,
                         smem_tile<cfg::block_n, cfg::head_dim>>::mfma_tile_math;
};
#else
/* P (the C fragments of 8-key tiles 2kn, 2kn+1) as the A fragment of 16-key step kn. */
template <typename T, int MT, int NT>
__device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&s)[MT][NT][4], int mt, int kn)
{
    a[0] = mma_type<T>::pack(s[mt][2 * kn][0], s[mt][2 * kn][1]);
    a[1] = mma_type<T>::pack(s[mt][2 * kn][2], s[mt][2 * kn][3]);
    a[2] = mma_type<T>::pack(s[mt][2 * kn + 1][0], s[mt][2 * kn + 1][1]);
    a[3] = mma_type<T>::pack(s[mt][2 * kn + 1][2], s[mt][2 * kn + 1][3]);
}

/*
 * The two tile products of the main loop, S = Q K^T and O += P V, for the
 * rows this warp owns.  Two engines share the fragment layout, so the
 * softmax around them is the same code:
 *   tile_math<..., false>  mma.sync m16n8k16 fed by ldmatrix (sm_80+)
 *   tile_math<..., true>   wgmma from shared-memory descriptors (sm_90a)
 */
template <typename T, typename cfg, bool WGMMA> struct tile_math;

template <typename T, typename cfg> struct tile_math<T, cfg, false> {
    static constexpr int HEAD_DIM = cfg::head_dim, BLOCK_N = cfg::block_n;
    static constexpr int WARP_M = cfg::block_m / cfg::walker_warps, MT = WARP_M / MMA_M;
    static constexpr int NT = BLOCK_N / MMA_N, DT = cfg::v_cols / MMA_N;
    using q_tile = smem_tile<cfg::block_m, HEAD_DIM>;
    using kv_tile = smem_tile<BLOCK_N, HEAD_DIM>;
    using v_tile = smem_tile<BLOCK_N, cfg::v_cols>; /* this walker's part of V */
    uint32_t q_addr, k_addr, v_addr; /* this lane's ldmatrix addresses, stage 0 */

    __device__ tile_math(const T *s_q, const T *s_k, const T *s_v, int warp, int lane)
    {
        const ldsm_lane la = ldsm_A(lane), lb = ldsm_B(lane), lv = ldsm_B_trans(lane);
        q_addr = smem_addr(s_q + q_tile::offset(warp * WARP_M + la.row, la.chunk));
        k_addr = smem_addr(s_k + kv_tile::offset(lb.row, lb.chunk));
        v_addr = smem_addr(s_v + v_tile::offset(lv.row, lv.chunk));
    }

    __device__ void scores(float (&s)[MT][NT][4], int stage) const
    {
        const uint32_t k_stage = k_addr + stage * kv_tile::BYTES;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] = 0.f;
#pragma unroll
        for (int kd = 0; kd < HEAD_DIM / MMA_K; kd++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldmatrix_x4(a[mt], q_tile::step(q_addr, mt * MMA_M, kd * 2));
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                uint32_t b[4];
                ldmatrix_x4(b, kv_tile::step(k_stage, nt * MMA_N, kd * 2));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_AB<T>(s[mt][nt], a[mt], b);
                    mma_AB<T>(s[mt][nt + 1], a[mt], b + 2);
                }
            }
        }
    }

    __device__ void accumulate(float (&o)[MT][DT][4], const float (&s)[MT][NT][4], int stage) const
    {
        const uint32_t v_stage = v_addr + stage * v_tile::BYTES;
#pragma unroll
        for (int kn = 0; kn < BLOCK_N / MMA_K; kn++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                p_fragment<T>(pa[mt], s, mt, kn);
#pragma unroll
            for (int dt = 0; dt < DT; dt += 2) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, v_tile::step(v_stage, kn * MMA_K, dt));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_AB<T>(o[mt][dt], pa[mt], b);
                    mma_AB<T>(o[mt][dt + 1], pa[mt], b + 2);
                }
            }
        }
    }
};

#if FMHA_HAS_WGMMA
template <typename T, typename cfg> struct tile_math<T, cfg, true> {
    static constexpr int HEAD_DIM = cfg::head_dim, BLOCK_N = cfg::block_n;
    static constexpr int MT = 1, NT = BLOCK_N / MMA_N, DT = HEAD_DIM / MMA_N;
    using q_tile = smem_tile<cfg::block_m, HEAD_DIM>;
    using kv_tile = smem_tile<BLOCK_N, HEAD_DIM>;
    static constexpr int K_STEPS_PER_PANEL = SWIZZLE_ROW_BYTES / (WGMMA_K * 2);
    static_assert(q_tile::SWIZZLED && kv_tile::SWIZZLED, "wgmma reads 128-byte swizzled panels");
    static_assert(cfg::o_parts == 1, "use_wgmma() takes whole-O tiles");
    uint32_t q_base, k_base, v_base; /* shared addresses: this warpgroup's Q rows, K and V stage 0 */

    __device__ tile_math(const T *s_q, const T *s_k, const T *s_v, int warp, int)
    {
        q_base = smem_addr(s_q) + (warp / 4) * WGMMA_M * SWIZZLE_ROW_BYTES;
        k_base = smem_addr(s_k);
        v_base = smem_addr(s_v);
    }

    /* Issue S = Q K^T for `stage` (one wgmma group); wait<> before reading s. */
    __device__ void scores_async(float (&s)[1][NT][4], int stage) const
    {
        float(&d)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(s[0]);
        const uint32_t k_stage = k_base + stage * kv_tile::BYTES;
        wgmma_fence();
#pragma unroll
        for (int kd = 0; kd < HEAD_DIM / WGMMA_K; kd++) {
            const uint32_t panel = kd / K_STEPS_PER_PANEL, within = kd % K_STEPS_PER_PANEL * WGMMA_K * 2;
            const uint64_t da = smem_desc(q_base + panel * q_tile::PANEL_BYTES + within, 16, SWIZZLE_ATOM_BYTES);
            const uint64_t db = smem_desc(k_stage + panel * kv_tile::PANEL_BYTES + within, 16, SWIZZLE_ATOM_BYTES);
            wgmma<T, BLOCK_N>::ss(d, da, db, kd > 0);
        }
        wgmma_commit();
    }

    /* P (fp32, the C layout) as the A operands of O += P V. */
    static __device__ void p_operands(uint32_t (&pa)[BLOCK_N / WGMMA_K][4], const float (&s)[1][NT][4])
    {
#pragma unroll
        for (int kn = 0; kn < BLOCK_N / WGMMA_K; kn++)
            p_fragment<T>(pa[kn], s, 0, kn);
    }

    /* Issue O += P V for `stage` (one wgmma group); pa must stay unchanged until it completes. */
    __device__ void accumulate_async(float (&o)[1][DT][4], const uint32_t (&pa)[BLOCK_N / WGMMA_K][4],
                                     int stage) const
    {
        float(&d)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(o[0]);
        const uint32_t v_stage = v_base + stage * kv_tile::BYTES;
        wgmma_fence();
#pragma unroll
        for (int kn = 0; kn < BLOCK_N / WGMMA_K; kn++) {
            /* V is MN-major: 16 key rows of 128 B per step, panels kv_tile::PANEL_BYTES apart. */
            const uint64_t db = smem_desc(v_stage + kn * WGMMA_K * SWIZZLE_ROW_BYTES,
                                          kv_tile::PANEL_BYTES, SWIZZLE_ATOM_BYTES);
            wgmma<T, HEAD_DIM>::rs(d, pa[kn], db);
        }
        wgmma_commit();
    }

    /* Wait until at most N groups are in flight; then `acc` may be read. */
    template <int N, int A, int B> static __device__ void wait(float (&acc)[1][A][B])
    {
        wgmma_wait<N>();
        fence_regs(reinterpret_cast<float(&)[A * B]>(acc[0]));
    }

    __device__ void scores(float (&s)[1][NT][4], int stage) const
    {
        scores_async(s, stage);
        wait<0>(s);
    }

    __device__ void accumulate(float (&o)[1][DT][4], const float (&s)[1][NT][4], int stage) const
    {
        uint32_t pa[BLOCK_N / WGMMA_K][4];
        p_operands(pa, s);
        accumulate_async(o, pa, stage);
        wait<0>(o);
    }
};
#endif
#endif /* FMHA_DEVICE_IS_AMD */

/* Whether this build target and tile config run the wgmma engine. */
template <typename cfg> __host__ __device__ constexpr bool use_wgmma()
{
    return FMHA_HAS_WGMMA && cfg::walker_warps % 4 == 0 && cfg::block_m == MMA_M * cfg::walker_warps &&
           (cfg::head_dim == 64 || cfg::head_dim == 128) && (cfg::block_n == 64 || cfg::block_n == 128);
}

/* n rounded up to whole 1024-byte swizzle atoms. */
constexpr int atom_align(int n) { return (n + 1023) / 1024 * 1024; }

/* Bytes of one K stage (COLS = head_dim) or V stage (COLS = v_cols, the walker's part) of
 * the ring: 16-bit rows, or (KV8) e4m3fn codes in plain rows. */
template <typename cfg, bool KV8, int COLS = cfg::head_dim> constexpr int stage_bytes()
{
    return smem_tile<cfg::block_n, stored_cols<std::conditional_t<KV8, uint8_t, uint16_t>, COLS>(), KV8>::BYTES;
}

/* Where a walker's widened K and V tiles (KV8) start: after its Q tile and K/V ring,
 * 1024-aligned. */
template <typename cfg, bool KV8> constexpr int wide_tiles_offset()
{
    return atom_align(smem_tile<cfg::block_m, cfg::head_dim>::BYTES +
                      ring_stages(cfg::stages) * (stage_bytes<cfg, KV8>() + stage_bytes<cfg, KV8, cfg::v_cols>()));
}

/* Shared memory of one walker: its Q tile and K/V ring (KV8: then one widened K and V
 * tile), rounded up to whole 1024-byte swizzle atoms (padded-row tiles are not), so
 * every walker's tiles stay aligned. */
template <typename cfg, bool KV8 = false> constexpr int walker_smem_bytes()
{
    return wide_tiles_offset<cfg, KV8>() +
           (KV8 ? atom_align(smem_tile<cfg::block_n, cfg::head_dim>::BYTES + smem_tile<cfg::block_n, cfg::v_cols>::BYTES)
                : 0);
}

/* The per-walker sizes of a tile config, as the pieces below use them. */
template <typename cfg, bool KV8 = false> struct walker_shape {
    static constexpr int HEAD_DIM = cfg::head_dim, BLOCK_M = cfg::block_m, BLOCK_N = cfg::block_n;
    static constexpr int STAGES = ring_stages(cfg::stages);
    static constexpr int THREADS = cfg::walker_warps * WARP_LANES; /* of one walker */
    static constexpr int WARP_M = BLOCK_M / cfg::walker_warps;     /* rows per warp */
    static constexpr int MT = WARP_M / MMA_M;                      /* 16-row mma tiles per warp */
    static constexpr int NT = BLOCK_N / MMA_N;                     /* 8-key column tiles of S */
    static constexpr int V_COLS = cfg::v_cols;                     /* O's and V's columns per walker */
    static constexpr int DT = V_COLS / MMA_N;                      /* 8-feature column tiles of O */
    static constexpr int BYTES = walker_smem_bytes<cfg, KV8>();    /* shared memory per walker */
    static constexpr bool WGMMA = use_wgmma<cfg>();
    using q_tile = smem_tile<BLOCK_M, HEAD_DIM>;
    using kv_tile = smem_tile<BLOCK_N, HEAD_DIM>;
    static_assert(cfg::walkers == 1 || BYTES % 1024 == 0, "walkers' tiles stay 1024-aligned");
};

/*
 * This thread's walker (a group of warps with its own Q tile, K/V ring and key
 * blocks: the whole CTA, or one warp of a decode CTA) and its place in it.
 * The walker index is made warp-uniform where the compiler can use it (the
 * work and its branches are then uniform too).  The kernel asks for walker and
 * tid first and makes the struct after make_work, where warp and lane are
 * first needed (worked out before it, the code took more registers).
 */
template <typename cfg> struct walker_thread {
    using shape = walker_shape<cfg>;
    int walker, tid, warp, lane;

    /* Which walker of the CTA this thread is in, and its thread index in that walker. */
    static __device__ __forceinline__ int walker_of_thread()
    {
        return cfg::walkers == 1 ? 0 : warp_uniform((int)threadIdx.x / shape::THREADS);
    }
    static __device__ __forceinline__ int tid_in_walker()
    {
        return cfg::walkers == 1 ? (int)threadIdx.x : (int)threadIdx.x % shape::THREADS;
    }
    __device__ __forceinline__ walker_thread(int walker_, int tid_)
        : walker(walker_), tid(tid_), warp(tid_ / WARP_LANES), lane(tid_ % WARP_LANES)
    {
    }
    /* The walker's barrier: its warps share the ring (a warp's own when it is one warp). */
    static __device__ __forceinline__ void sync()
    {
        if constexpr (cfg::walker_warps == 1)
            warp_sync();
        else
            __syncthreads();
    }
};

/*
 * Addressing: where the rows of a walker's piece (cta_work) are in global
 * memory.  Q row r of the tile, the K and V of its kv head, and for result row
 * (query i, head h) its O row (the output, or the split's fp32 scratch) and its
 * LSE slot (nullptr when the caller asked for none, and in every column part of O
 * but the first).  V and the O rows start at the walker's part: V_COLS columns of
 * HEAD_DIM.  The K/V bases are worked out when asked for, not kept: kept here, they
 * changed what the compiler hoisted out of the main loop and cost registers.
 */
template <typename T, int HEAD_DIM, bool SPLIT, int V_COLS = HEAD_DIM> struct tile_addresses {
    using out_t = std::conditional_t<SPLIT, float, T>;
    const fmha_fwd_params &p;
    const cta_work &w;
    const T *q;

    __device__ __forceinline__ tile_addresses(const fmha_fwd_params &p_, const cta_work &w_)
        : p(p_), w(w_), q(static_cast<const T *>(p_.q))
    {
    }
    /* Key 0 of the K and V of the piece's kv head (of page 0 when paged), elements KT. */
    template <typename KT> __device__ __forceinline__ const KT *k() const
    {
        return static_cast<const KT *>(p.k) + w.kv_batch * p.k_batch_stride + w.kv_start * p.k_row_stride +
               w.kv_head() * p.k_head_stride;
    }
    template <typename KT> __device__ __forceinline__ const KT *v() const
    {
        return static_cast<const KT *>(p.v) + w.kv_batch * p.v_batch_stride + w.kv_start * p.v_row_stride +
               w.kv_head() * p.v_head_stride + col0();
    }
    /* The first column of this walker's part of V and O. */
    __device__ __forceinline__ int col0() const { return V_COLS == HEAD_DIM ? 0 : w.part * V_COLS; }
    /* Whether this walker writes its rows' LSE (the same in every part). */
    __device__ __forceinline__ bool writes_lse() const { return V_COLS == HEAD_DIM || w.part == 0; }
    /* Q row r of the tile, or nullptr past the sequence's rows (zero-filled). */
    __device__ __forceinline__ const T *q_row(int r) const
    {
        int64_t row = w.row0 + r;
        if (row >= w.rows)
            return nullptr;
        return q + w.q_batch * p.q_batch_stride + (w.q_start + w.query_of(row)) * p.q_row_stride +
               w.head_of(row) * p.q_head_stride;
    }
    /* The split scratch (fmha.h) is [num_splits, batch, seqlen_q, ...], or with packed
     * sequences [num_splits, 1, total_q, ...]: its (split, batch) index and rows per batch. */
    __device__ __forceinline__ int64_t scratch_batch(int split) const
    {
        return (int64_t)split * (p.cu_seqlens_q ? 1 : p.batch) + w.q_batch;
    }
    __device__ __forceinline__ int64_t scratch_batch() const { return scratch_batch(w.split); }
    __device__ __forceinline__ int64_t scratch_rows() const { return p.cu_seqlens_q ? p.total_q : p.seqlen_q; }
    __device__ __forceinline__ out_t *o_row(int64_t i, int64_t h) const
    {
        if constexpr (SPLIT)
            return p.o_accum + ((scratch_batch() * scratch_rows() + w.q_start + i) * p.heads_q + h) * HEAD_DIM +
                   col0();
        else
            return static_cast<T *>(p.out) + w.q_batch * p.o_batch_stride + (w.q_start + i) * p.o_row_stride +
                   h * p.o_head_stride + col0();
    }
    /* The split scratch's lse of (i, h) in another split of the entry. */
    __device__ __forceinline__ float *split_lse_slot(int split, int64_t i, int64_t h) const
    {
        if (!writes_lse())
            return nullptr;
        return p.lse_accum + (scratch_batch(split) * p.heads_q + h) * scratch_rows() + w.q_start + i;
    }
    __device__ __forceinline__ float *lse_slot(int64_t i, int64_t h) const
    {
        if constexpr (SPLIT) {
            return split_lse_slot(w.split, i, h);
        } else {
            return p.lse && writes_lse() ? p.lse + w.q_batch * p.lse_batch_stride + h * p.lse_head_stride +
                                               (w.q_start + i) * p.lse_row_stride
                                         : nullptr;
        }
    }
};

/* "At most N later copy groups still in flight", as an argument. */
template <int N> using in_flight = std::integral_constant<int, N>;

/*
 * The tile products' element type: T, or for an fp8 cache with bfloat16 q on NVIDIA,
 * float16.  A code widens to fp16 in one conversion (to bf16 it takes several), Q's
 * rows are rescaled into fp16 by a power of two each (to_half_rows), and P is
 * rounded to fp16, which is finer than bf16.
 */
template <typename T, bool KV8>
using product_type =
    std::conditional_t<KV8 && std::is_same<T, fmha_bf16>::value && !FMHA_DEVICE_IS_AMD, fmha_half, T>;

/*
 * A bfloat16 Q tile in shared memory rewritten in place as float16, row r times 2^e_r,
 * e_r putting the row's largest |q| in [2^14, 2^15).  A bf16 has 8 significant bits, so
 * every element above 2^-31 of its row's largest is exact in fp16; smaller ones lie
 * below what the fp32 dot product keeps of the largest term anyway.  The lanes that
 * hold a row's accumulators (acc_row) share its chunks and its max; `inv` gets 2^-e_r
 * for this thread's rows.  A row whose max is not finite keeps e = 0 (inf, NaN stay).
 */
template <typename cfg, int MT>
__device__ __forceinline__ void to_half_rows(void *s_q, float (&inv)[MT][ACC_ROWS], int warp, int lane)
{
    using shape = walker_shape<cfg>;
    using tile = typename shape::q_tile;
    uint16_t *q = static_cast<uint16_t *>(s_q);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < ACC_ROWS; half++) {
            const int row = warp * shape::WARP_M + mt * MMA_M + acc_row(lane) + half * ACC_ROW_STRIDE;
            float top = 0.f;
            for (int c = lane % LANES_PER_ROW; c < tile::CHUNKS; c += LANES_PER_ROW) {
                const uint4 raw = *reinterpret_cast<const uint4 *>(q + tile::offset(row, c));
                const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
                    top = fmaxf(top, fmaxf(fabsf(__uint_as_float(w[i] << 16)),
                                           fabsf(__uint_as_float(w[i] & 0xffff0000u))));
            }
            top = quad_max(top);
            int e = 0;
            if (top > 0.f && top <= FLT_MAX) {
                const int floor_log2 = (int)(__float_as_uint(top) >> 23) - 127; /* -127: fp32 subnormal */
                e = 14 - floor_log2 < 126 ? 14 - floor_log2 : 126;
            }
            const float scale = __uint_as_float((uint32_t)(127 + e) << 23);
            inv[mt][half] = __uint_as_float((uint32_t)(127 - e) << 23);
            for (int c = lane % LANES_PER_ROW; c < tile::CHUNKS; c += LANES_PER_ROW) {
                uint4 *at = reinterpret_cast<uint4 *>(q + tile::offset(row, c));
                const uint4 raw = *at;
                uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const __half2 h = __floats2half2_rn(__uint_as_float(w[i] << 16) * scale,
                                                        __uint_as_float(w[i] & 0xffff0000u) * scale);
                    w[i] = *reinterpret_cast<const uint32_t *>(&h);
                }
                *at = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
}

/*
 * The K/V copy pipeline of one walker: a ring of STAGES shared-memory stages,
 * one cp.async commit group per key block, block j in stage j % STAGES.  PAGED:
 * the rows come through the sequence's block table.  KV8: the cache holds
 * e4m3fn codes; a stage holds codes, and once it has landed the walker widens it
 * into one T tile of K and one of V (widen), which the tile products read
 * (product_stage).  K's factor then multiplies S (online_softmax's row factors) and
 * V's the finished rows (v_factor): both are per (sequence, kv head), so per walker.
 * T is the products' type (product_type).
 */
template <typename T, typename cfg, bool PAGED, bool KV8> struct kv_ring {
    using shape = walker_shape<cfg, KV8>;
    using KT = std::conditional_t<KV8, uint8_t, T>; /* what the cache holds */
    /* fp8 walkers are short of issue slots: a warp skips O *= 1 (walk_keys), except at
     * head dims whose O leaves no registers for the vote (192). */
    static constexpr bool SKIP_UNIT_RESCALE = KV8 && cfg::head_dim <= 128;
    static constexpr int BLOCK_N = shape::BLOCK_N, HEAD_DIM = shape::HEAD_DIM, STAGES = shape::STAGES;
    static constexpr int V_COLS = shape::V_COLS; /* the walker's part of each V row */
    static constexpr int K_STAGE_BYTES = stage_bytes<cfg, KV8>(), V_STAGE_BYTES = stage_bytes<cfg, KV8, V_COLS>();
    /* A decode tile is the only reader of its K/V: the plan may have those lines leave
     * L2 first (kv_read_once).  Prefill row tiles of a head share K/V through L2. */
    using kv_copy = std::conditional_t<HAS_L2_HINTS && (cfg::walkers > 1), hinted_copy, plain_copy>;

    using paged = paged_rows<BLOCK_N, stored_cols<KT, HEAD_DIM>(), shape::THREADS, KV8, stored_cols<KT, V_COLS>()>;
    struct no_cursor {
        __device__ no_cursor(const fmha_fwd_params &, int, int, int) {}
    };
    struct no_pages {};

    const fmha_fwd_params &p;
    const cta_work &w;
    const KT *k, *v;           /* this piece's kv head (v: at its part's first column) */
    unsigned char *s_k, *s_v;  /* stage 0 of the K and V rings */
    T *wide_k, *wide_v;        /* KV8: the widened tiles */
    float k_factor, v_factor;  /* KV8: the dequantization factors (else 1) */
    uint64_t policy;           /* the copies' L2 word: the kernel's kv_policy argument */
    int tid;
    /* PAGED: the table cursor, and the pages of the block the next refill loads (fetched
     * one block ahead: see paged_rows).  Empty for dense K/V. */
    mutable std::conditional_t<PAGED, paged, no_cursor> cursor;
    mutable std::conditional_t<PAGED, typename paged::pages, no_pages> next;

    /* The ring's stages start after the walker's Q tile, the widened tiles (KV8) at
     * wide_tiles_offset. */
    __device__ __forceinline__ kv_ring(const fmha_fwd_params &p_, const cta_work &w_, const KT *k_, const KT *v_,
                                       unsigned char *walker_smem, uint64_t policy_, int tid_)
        : p(p_), w(w_), k(k_), v(v_), s_k(walker_smem + shape::q_tile::BYTES),
          s_v(walker_smem + shape::q_tile::BYTES + STAGES * K_STAGE_BYTES),
          wide_k(reinterpret_cast<T *>(walker_smem + wide_tiles_offset<cfg, KV8>())),
          wide_v(wide_k + shape::kv_tile::ELEMS), k_factor(1.f), v_factor(1.f),
          policy(policy_), tid(tid_),
          cursor(p_, w_.n_first, w_.n_step, tid_)
    {
        if constexpr (KV8) {
            k_factor = kv_factor(p.k_scale, p.k_scales, p.k_scales_batch_stride, p.k_scales_head_stride, w.b,
                                 w.kv_head());
            v_factor = kv_factor(p.v_scale, p.v_scales, p.v_scales_batch_stride, p.v_scales_head_stride, w.b,
                                 w.kv_head());
        }
    }

    /* The K and V tiles the products read: stage 0 of the ring, or the widened ones. */
    __device__ __forceinline__ const T *product_k() const
    {
        return KV8 ? wide_k : reinterpret_cast<const T *>(s_k);
    }
    __device__ __forceinline__ const T *product_v() const
    {
        return KV8 ? wide_v : reinterpret_cast<const T *>(s_v);
    }
    /* Which stage of those tiles holds the block of ring stage `stage`. */
    __device__ __forceinline__ int product_stage(int stage) const { return KV8 ? 0 : stage; }

    /* KV8: the K of ring stage k_stage and the V of v_stage (landed: wait; -1: neither)
     * widened into the product tiles, which every warp of the walker may read on
     * return.  The products that read those tiles before are done: the barrier of the
     * last refill came after them. */
    __device__ __forceinline__ void widen(int k_stage, int v_stage) const
    {
        if constexpr (KV8) {
            if (k_stage >= 0)
                widen_tile<BLOCK_N, HEAD_DIM, shape::THREADS>(wide_k, s_k + k_stage * K_STAGE_BYTES, tid);
            if (v_stage >= 0)
                widen_tile<BLOCK_N, V_COLS, shape::THREADS>(wide_v, s_v + v_stage * V_STAGE_BYTES, tid);
            if (shape::WGMMA)
                fence_proxy_async(); /* generic-proxy writes that wgmma reads next */
            walker_thread<cfg>::sync();
        }
    }

    /* PAGED: this sequence's row of the block table, and the pages of block n_block (the
     * cursor's next). */
    __device__ __forceinline__ typename paged::pages fetch(int n_block) const
    {
        return cursor.fetch(p.block_table + w.b * p.block_table_stride, n_block, w.len_k, tid);
    }

    /* Start the copies of key block n_block into `stage` (no commit); paged, its pages are `at`. */
    template <typename Pages> __device__ __forceinline__ void load(int n_block, int stage, const Pages &at) const
    {
        const int64_t key0 = (int64_t)n_block * BLOCK_N;
        if constexpr (PAGED) {
            cursor.load(kv_copy(s_k + stage * K_STAGE_BYTES, policy), kv_copy(s_v + stage * V_STAGE_BYTES, policy),
                        k, v, p, at, w.len_k - key0, tid);
        } else {
            load_rows<BLOCK_N, HEAD_DIM, shape::THREADS>(kv_copy(s_k + stage * K_STAGE_BYTES, policy),
                                                         k + key0 * p.k_row_stride, p.k_row_stride, w.len_k - key0,
                                                         k, tid);
            load_rows<BLOCK_N, V_COLS, shape::THREADS>(kv_copy(s_v + stage * V_STAGE_BYTES, policy),
                                                         v + key0 * p.v_row_stride, p.v_row_stride, w.len_k - key0,
                                                         v, tid);
        }
    }

    /* Prologue: the first K/V block, then the Q tile (its row addresses take longer to
     * work out, and DRAM should be busy meanwhile), then the next stages, one commit
     * group each.  PAGED: the table entries of every stage and of the first refill are
     * asked for first, and the Q tile's copies go out while they come. */
    template <typename LoadQ> __device__ __forceinline__ void fill(LoadQ load_q) const
    {
        if constexpr (PAGED) {
            typename paged::pages at[STAGES];
#pragma unroll
            for (int s = 0; s < STAGES; s++)
                at[s] = fetch(w.block(s));
            next = fetch(w.block(STAGES));
#pragma unroll
            for (int s = 0; s < STAGES; s++) {
                if (s == 0)
                    load_q();
                if (s < w.n_count)
                    load(w.block(s), s, at[s]);
                copy_async_commit();
            }
        } else {
            /* Rolled: one copy of the block loader, which a short decode walk runs once. */
#pragma unroll 1
            for (int s = 0; s < STAGES; s++) {
                if (s < w.n_count)
                    load(w.block(s), s, next);
                if (s == 0)
                    load_q();
                copy_async_commit();
            }
        }
    }

    /* The stage about to be read has landed and every warp (and wgmma) may read it:
     * at most N later copy groups still in flight. */
    template <int N> __device__ __forceinline__ void wait(in_flight<N>) const
    {
        copy_async_wait<N>();
        if (shape::WGMMA)
            fence_proxy_async(); /* cp.async wrote what the async proxy reads next */
        walker_thread<cfg>::sync();
    }

    /* Everyone is done with block j's stage: refill it with the block STAGES ahead. */
    __device__ __forceinline__ void refill(int j, int stage) const
    {
        walker_thread<cfg>::sync();
        if (j + STAGES < w.n_count) {
            load(w.block(j + STAGES), stage, next);
            if constexpr (PAGED)
                next = fetch(w.block(j + STAGES + 1)); /* used by the next refill */
        }
        copy_async_commit();
    }
};

/*
 * The online softmax of one walker's rows: the running max and sum, and which
 * keys each of this thread's rows may see (keys past len_k never; with
 * MASK_CAUSAL none past the row's limit; with MASK_WINDOW none outside its
 * window).  Blocks inside [free_begin, free_end) need no mask at all: the tile's
 * first row sees the fewest keys at the end, its last row (window) the fewest at
 * the start.
 */
template <int MASK, typename cfg, bool ROW_FACTORS = false> struct online_softmax {
    using shape = walker_shape<cfg>;
    static constexpr int MT = shape::MT, NT = shape::NT;
    softmax_state<MT> st;
    row_keys<MT> keys;
    /* ROW_FACTORS (an fp8 cache): what each row's scores of codes are multiplied by first,
     * K's factor times the row's Q rescale (to_half_rows); set by the kernel. */
    float row_factor[ROW_FACTORS ? MT : 1][ACC_ROWS];
    int64_t free_begin, free_end, len_k;
    int lane;

    __device__ __forceinline__ online_softmax(const fmha_fwd_params &p, const cta_work &w,
                                              const walker_thread<cfg> &me)
        : len_k(w.len_k), lane(me.lane)
    {
        /* This thread's rows: tile row warp*WARP_M + mt*16 + acc_row(lane) + half*ACC_ROW_STRIDE. */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int half = 0; half < ACC_ROWS; half++) {
                int64_t row =
                    w.row0 + me.warp * shape::WARP_M + mt * MMA_M + acc_row(me.lane) + half * ACC_ROW_STRIDE;
                const int64_t pos = w.query_of(row < w.rows ? row : w.rows - 1) + w.diag;
                keys.last[mt][half] = pos;
                if constexpr (MASK == MASK_WINDOW) {
                    /* Unbounded sides: limits no key of the sequence reaches. */
                    const int64_t left = window_left(p), right = window_right(p);
                    keys.last[mt][half] = right < 0 ? w.len_k : pos + right;
                    keys.first[mt][half] = left < 0 ? -1 : pos - left;
                }
            }
        const int64_t first_limit = w.query_of(w.row0) + w.diag;
        free_begin = 0;
        free_end = MASK == MASK_CAUSAL ? (first_limit + 1 < w.len_k ? first_limit + 1 : w.len_k) : w.len_k;
        if constexpr (MASK == MASK_WINDOW) {
            const int64_t left = window_left(p), right = window_right(p);
            const int64_t last_row = (w.row0 + shape::BLOCK_M < w.rows ? w.row0 + shape::BLOCK_M : w.rows) - 1;
            if (right >= 0 && first_limit + right + 1 < free_end)
                free_end = first_limit + right + 1;
            if (left >= 0)
                free_begin = w.query_of(last_row) + w.diag - left;
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int half = 0; half < ACC_ROWS; half++) {
                st.row_max[mt][half] = -INFINITY;
                /* A bad length walks no block: a NaN sum makes the epilogue write NaN rows and LSE. */
                st.row_sum[mt][half] = w.bad_len ? NAN : 0.f;
            }
    }

    /* Key block n_block: S -> P = exp2(S * scale_log2 - m_new), m and l updated; `rescale` is
     * exp2(m_old - m_new), the factor the O rows so far must take. */
    __device__ __forceinline__ void update(float (&s)[MT][NT][4], int n_block, float (&rescale)[MT][ACC_ROWS],
                                           const fmha_fwd_params &p)
    {
        if constexpr (ROW_FACTORS)
            rescale_rows(s, row_factor); /* S rows of codes -> of the dequantized keys */
        softmax_block<MASK>(s, st, rescale, p, (int64_t)n_block * shape::BLOCK_N, free_begin, free_end, len_k,
                            keys, lane);
    }
};

/* O = 0 for every row of this thread. */
template <int MT, int DT> __device__ __forceinline__ void zero_rows(float (&o)[MT][DT][4])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][dt][e] = 0.f;
}

/*
 * The main loop: the walker's key blocks, one after the other, each through
 * the tile products and the online softmax.  p.scale_log2 is read where each
 * block needs it (loaded once ahead of the loop, the code took more registers).
 */
template <typename cfg, typename Math, typename Softmax, typename Ring, typename O>
__device__ __forceinline__ void walk_keys(O &o, Softmax &softmax, const Math &math, const Ring &ring,
                                          const cta_work &w, const fmha_fwd_params &p)
{
    using shape = typename Ring::shape;
    for (int j = 0; j < w.n_count; j++) {
        const int stage = j % shape::STAGES;
        ring.wait(in_flight<shape::STAGES - 1>());
        ring.widen(stage, stage); /* fp8 codes -> T */
        float s[shape::MT][shape::NT][4], rescale[shape::MT][ACC_ROWS];
        math.scores(s, ring.product_stage(stage)); /* S = Q K^T */
        softmax.update(s, w.block(j), rescale, p); /* P = exp2(S - m_new); m, l */
        if (!Ring::SKIP_UNIT_RESCALE || warp_any(some_row_moved(rescale)))
            rescale_rows(o, rescale);              /* O *= exp2(m_old - m_new) */
        math.accumulate(o, s, ring.product_stage(stage)); /* O += P V */
        ring.refill(j, stage);
    }
}

/*
 * The same loop for the asynchronous wgmma engine: issue S(j+1) = Q K(j+1)^T
 * and O += P(j) V(j) back to back, run the softmax of block j+1 while P(j) V(j)
 * is still on the tensor cores, then rescale O once it is done.  S(j+1) needs
 * block j+1 one iteration early, hence at least three stages.  An fp8 cache's K(j+1)
 * and V(j) are widened together before they are issued (one product tile each).
 */
template <typename cfg, typename Math, typename Softmax, typename Ring, typename O>
__device__ __forceinline__ void walk_keys_overlapped(O &o, Softmax &softmax, const Math &math, const Ring &ring,
                                                     const cta_work &w, const fmha_fwd_params &p)
{
    using shape = typename Ring::shape;
    constexpr int STAGES = shape::STAGES;
    static_assert(STAGES >= 3, "S(j+1) reads block j+1 while block j is in use");
    if (w.n_count == 0)
        return;
    float s[shape::MT][shape::NT][4], rescale[shape::MT][ACC_ROWS];
    uint32_t pa[shape::BLOCK_N / MMA_K][4];
    ring.wait(in_flight<STAGES - 1>());
    ring.widen(0, -1);
    math.scores(s, ring.product_stage(0));  /* S(0) = Q K(0)^T */
    softmax.update(s, w.block(0), rescale, p); /* O is still zero: no rescale */
    math.p_operands(pa, s);
    /* Every block but the last: the wgmma groups are the same each time (no group
     * under a condition), so ptxas can track what wait<1> retires. */
    for (int j = 0; j + 1 < w.n_count; j++) {
        const int stage = j % STAGES;
        ring.wait(in_flight<STAGES - 2>());
        ring.widen((stage + 1) % STAGES, stage);
        math.scores_async(s, ring.product_stage((stage + 1) % STAGES)); /* S(j+1) = Q K(j+1)^T */
        math.accumulate_async(o, pa, ring.product_stage(stage));       /* O += P(j) V(j) */
        math.template wait<1>(s);
        softmax.update(s, w.block(j + 1), rescale, p); /* while P(j) V(j) runs */
        math.template wait<0>(o);
        rescale_rows(o, rescale); /* O *= exp2(m_old - m_new) */
        math.p_operands(pa, s);
        ring.refill(j, stage);
    }
    ring.widen(-1, (w.n_count - 1) % STAGES);
    math.accumulate_async(o, pa, ring.product_stage((w.n_count - 1) % STAGES)); /* O += P(last) V(last) */
    math.template wait<0>(o);
}

/*
 * Where the walkers of one split (walkers_per_split of them, consecutive in the
 * CTA) meet: each parks, for its BLOCK_M rows, its LSE_i (log2 units) and its
 * O_i / l_i in its own region, and the merged row is the combine's
 *   lse = top + log2 sum_i 2^(LSE_i - top),  O = sum_i 2^(LSE_i - lse) O_i,  top = max_i LSE_i
 * folded in walker order (deterministic; a walker that saw no key has
 * LSE_i = -inf and weighs nothing; NaN stays NaN).
 */
template <int BLOCK_M, int COLS> struct merge_area {
    static constexpr int STRIDE = COLS + 8; /* floats per O row (COLS of them): conflict-free fragment stores */
    static constexpr int BYTES = (int)sizeof(float) * BLOCK_M * (1 + STRIDE);
    static_assert(BLOCK_M % 4 == 0 && STRIDE % 4 == 0, "O rows start 16-byte aligned (the fold reads float4s)");
    float *lse, *o;
    __device__ __forceinline__ explicit merge_area(unsigned char *base)
    {
        lse = reinterpret_cast<float *>(base);
        o = lse + BLOCK_M;
    }
};

/*
 * Epilogue: O / l and the LSE (log2 units here) of this thread's rows; rows
 * that saw no key give 0 and -inf.  Alone, a walker writes them out (the
 * output, or its split's partials); walkers sharing a split `park` them in
 * their merge areas for merge_walkers.  `sinks` (nullptr: none; never for
 * partials) join the rows' denominators as they are written (fold.h).  A
 * partial row (`partial`) that saw no key writes only its lse, -inf: the
 * combine never reads the O of such a split, so the empty pieces of a wide
 * split grid cost no O traffic.
 */
template <typename cfg, typename Addr, typename Softmax, typename O>
__device__ __forceinline__ void write_rows(const O &o, const Softmax &softmax, const Addr &at, const cta_work &w,
                                           const walker_thread<cfg> &me, bool park, unsigned char *walker_smem,
                                           const float *sinks, float v_factor, bool partial)
{
    using shape = walker_shape<cfg>;
    constexpr int MT = shape::MT, DT = shape::DT;
    const merge_area<shape::BLOCK_M, shape::V_COLS> mine(walker_smem);
    const int lane = me.lane;
    if (park)
        me.sync(); /* the walker is done with its own ring, which its merge area reuses */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < ACC_ROWS; half++) {
            const int r = me.warp * shape::WARP_M + mt * MMA_M + acc_row(lane) + half * ACC_ROW_STRIDE;
            /* l >= 1 when the row saw a key (its max contributes 1), where the
             * approximate 1/l and log2 l are within an ulp or two; the decode tiles
             * take them (they are on the path of the walker that ends a split). */
            constexpr bool FAST = cfg::walkers > 1;
            const float l = quad_sum(softmax.st.row_sum[mt][half]);
            /* v_factor: an fp8 cache's V factor (else 1), which O of codes takes */
            const float inv = l == 0.f ? 0.f : (FAST ? rcp_fast(l) : 1.f / l) * v_factor;
            const float lse = l == 0.f ? -INFINITY : softmax.st.row_max[mt][half] + (FAST ? log2_fast(l) : log2f(l));
            if (park) {
                if (acc_row_leader(lane))
                    mine.lse[r] = lse;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
#pragma unroll
                    for (int c = 0; c < ACC_COLS; c++)
                        mine.o[r * mine.STRIDE + dt * MMA_N + acc_col(lane) + c] = o[mt][dt][half * ACC_COLS + c] * inv;
                continue;
            }
            const int64_t row = w.row0 + r;
            if (row >= w.rows)
                continue;
            const int64_t i = w.query_of(row), h = w.head_of(row);
            float *slot = acc_row_leader(lane) ? at.lse_slot(i, h) : nullptr;
            if (partial && l == 0.f) {
                if (slot)
                    *slot = -INFINITY;
                continue;
            }
            float row_inv = inv, row_lse = lse * LN2;
            if (sinks)
                fold_sink(row_lse, row_inv, sinks[h]); /* scales row_inv by l / (l + e^sink) */
            const auto dst = at.o_row(i, h) + acc_col(lane);
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                store_row(dst, dt * MMA_N, &o[mt][dt][half * ACC_COLS], row_inv);
            if (slot)
                *slot = row_lse;
        }
}

/*
 * The walkers [first, first + ws) of one split fold their parked rows in
 * walker order (fold.h) and write the merged rows out.  It runs once, after
 * the slowest walker, with one warp per SM sub-partition; an item is 4
 * features (one 16-byte shared read per walker), so a tile of 4 valid rows
 * gives every warp of the CTA one, and the 1/total and log2 total are the
 * approximate ones (total >= 1: the top walker weighs 1).  The item loop is
 * not unrolled: a short decode walk runs this code once, cold, and its
 * instruction fetch (not the few dependent steps of an item's address) is
 * what it waits on.  `sinks` (nullptr: none) join the merged rows; a
 * `partial` row that no walker saw a key of writes only its lse (write_rows).
 */
template <typename cfg, bool KV8, typename Addr>
__device__ __forceinline__ void merge_walkers(const Addr &at, const cta_work &w, int ws, unsigned char *smem_raw,
                                              const walker_thread<cfg> &me, const float *sinks, bool partial)
{
    using shape = walker_shape<cfg, KV8>;
    /* COLS: the O columns of the walkers' part (they share one) */
    constexpr int BLOCK_M = shape::BLOCK_M, COLS = shape::V_COLS, THREADS = shape::THREADS;
    const int first = me.walker - me.walker % ws;
    auto area = [&](int i) { return merge_area<BLOCK_M, COLS>(smem_raw + (first + i) * shape::BYTES); };
    constexpr int VEC = 4, PER_ROW = COLS / VEC;
    static_assert(COLS % VEC == 0 && VEC % ACC_COLS == 0, "items are whole fragments' columns");
    __syncthreads();
    /* Items of this thread: idx0, idx0 + ws * THREADS, ...; rows ascend with idx (an idle
     * walker has none). */
#pragma unroll 1
    for (int idx = (me.walker - first) * THREADS + me.tid; idx < BLOCK_M * PER_ROW; idx += ws * THREADS) {
        const int r = idx / PER_ROW, col = idx % PER_ROW * VEC;
        if (w.row0 + r >= w.rows)
            break;
        const fmha_qr ih = w.place(w.row0 + r);
        typename Addr::out_t *const dst = at.o_row(ih.q, ih.r);
        float *const slot = col == 0 ? at.lse_slot(ih.q, ih.r) : nullptr;
        /* Every walker's LSE and O row are read up front (unrolled to the CTA's
         * walker count; past ws the reads repeat walker 0's and are not used),
         * so the fold waits for shared memory once, not once per walker. */
        float lse[cfg::walkers], x[cfg::walkers][VEC];
#pragma unroll
        for (int i = 0; i < cfg::walkers; i++) {
            const merge_area<BLOCK_M, COLS> src = area(i < ws ? i : 0);
            lse[i] = src.lse[r];
#pragma unroll
            for (int c = 0; c < VEC; c += 4)
                *reinterpret_cast<float4 *>(x[i] + c) = *reinterpret_cast<const float4 *>(src.o + r * src.STRIDE + col + c);
        }
        float top = -INFINITY;
#pragma unroll
        for (int i = 0; i < cfg::walkers; i++)
            top = i < ws ? nan_max(top, lse[i]) : top;
        float total = 0.f, acc[VEC];
#pragma unroll
        for (int c = 0; c < VEC; c++)
            acc[c] = 0.f;
#pragma unroll
        for (int i = 0; i < cfg::walkers; i++) {
            if (i >= ws || top == -INFINITY)
                continue;
            const float f = exp2_fast(lse[i] - top);
            total += f;
#pragma unroll
            for (int c = 0; c < VEC; c++)
                acc[c] += weighted(f, x[i][c]);
        }
        const bool seen = top != -INFINITY;
        float inv = seen ? rcp_fast(total) : 0.f;
        float lse_row = seen ? (top + log2_fast(total)) * LN2 : -INFINITY;
        if (sinks)
            fold_sink(lse_row, inv, sinks[ih.r]);
        if (sinks || !partial || seen)
#pragma unroll
            for (int c = 0; c < VEC; c += ACC_COLS)
                store_row(dst, col + c, acc + c, inv);
        if (slot)
            *slot = lse_row;
    }
}

/*
 * The producer: each walker of the CTA takes its piece (make_work), loads its
 * Q tile and passes its key blocks through its K/V ring (kv_ring) into the
 * main loop (walk_keys), then writes its rows (write_rows) or merges them
 * with the other walkers of its split (merge_walkers).  KV8: K and V are an fp8
 * cache (kv_ring widens it).  kv_policy: the L2 word of the K/V copies (kv_l2_policy).
 */
template <typename T, typename cfg, int MASK, bool SPLIT, bool PAGED, bool KV8>
__global__ void __launch_bounds__(cfg::warps * WARP_LANES, cfg::ctas_per_sm)
fwd_mma_kernel(const fmha_fwd_params p, const uint64_t kv_policy)
{
    using shape = walker_shape<cfg, KV8>;
    using MT = product_type<T, KV8>;
    using ring_t = kv_ring<MT, cfg, PAGED, KV8>;
    static_assert(merge_area<shape::BLOCK_M, shape::V_COLS>::BYTES <= shape::BYTES,
                  "the merge fits a walker's ring");

    /* Launched overlapped: nothing in memory is touched before the kernel before this one is done. */
    fmha_wait_prior_grid();

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int walker = walker_thread<cfg>::walker_of_thread(), tid = walker_thread<cfg>::tid_in_walker();
    unsigned char *walker_smem = smem_raw + walker * shape::BYTES;
    T *s_q = reinterpret_cast<T *>(walker_smem);

    const cta_work w = make_work<shape::BLOCK_M, shape::BLOCK_N, MASK, cfg::walkers, cfg::o_parts>(
        p, (int64_t)blockIdx.x * cfg::walkers + walker);
    const walker_thread<cfg> me(walker, tid);
    const tile_addresses<T, shape::HEAD_DIM, SPLIT, shape::V_COLS> at(p, w);
    if (SPLIT && w.unused_from > 0 && at.writes_lse()) {
        /* Compact grid (find_piece): no piece takes the entry's splits from unused_from on;
         * its last piece gives them lse -inf, which the combine weighs at nothing. */
        const int unused = p.num_splits - w.unused_from;
        for (int x = me.tid; x < shape::BLOCK_M * unused; x += shape::THREADS) {
            const int r = x % shape::BLOCK_M;
            if (w.row0 + r < w.rows) {
                const fmha_qr ih = w.place(w.row0 + r);
                *at.split_lse_slot(w.unused_from + x / shape::BLOCK_M, ih.q, ih.r) = -INFINITY;
            }
        }
    }
    /* A split piece with no key block (its entry is shorter than the split grid, or the
     * tile is past its rows) writes only its rows' lse, -inf: the combine reads no more
     * of it (write_rows).  It loads no Q and fills no ring, so the empty pieces of a grid
     * of every split cost little.  Walkers that merge meet the CTA's barrier. */
    if (SPLIT && w.n_count == 0 && !w.bad_len && p.walkers_per_split == 1) {
        for (int r = me.tid; at.writes_lse() && r < shape::BLOCK_M && w.row0 + r < w.rows; r += shape::THREADS) {
            const fmha_qr ih = w.place(w.row0 + r);
            *at.lse_slot(ih.q, ih.r) = -INFINITY;
        }
        return;
    }
    const ring_t ring(p, w, at.template k<typename ring_t::KT>(), at.template v<typename ring_t::KT>(),
                      walker_smem, kv_policy, me.tid);
    ring.fill([&] {
        load_tile<shape::BLOCK_M, shape::HEAD_DIM, shape::THREADS>(
            s_q, at.q, [&](int r) { return at.q_row(r); }, me.tid);
    });

    float o[shape::MT][shape::DT][4];
    zero_rows(o);
    online_softmax<MASK, cfg, KV8> softmax(p, w, me);
    if constexpr (KV8) {
        /* Scores of codes times K's factor; bf16 q: the Q tile (landed with the first
         * block) rewritten in fp16, each row's power of two undone in its scores. */
        float inv[shape::MT][ACC_ROWS];
        for (int mt = 0; mt < shape::MT; mt++)
            for (int half = 0; half < ACC_ROWS; half++)
                inv[mt][half] = 1.f;
        if constexpr (!std::is_same<MT, T>::value) {
            copy_async_wait<shape::STAGES - 1>();
            me.sync();
            to_half_rows<cfg>(s_q, inv, me.warp, me.lane);
            if (shape::WGMMA)
                fence_proxy_async();
            me.sync();
        }
        for (int mt = 0; mt < shape::MT; mt++)
            for (int half = 0; half < ACC_ROWS; half++)
                softmax.row_factor[mt][half] = ring.k_factor * inv[mt][half];
    }
    const tile_math<MT, cfg, shape::WGMMA> math(reinterpret_cast<const MT *>(s_q), ring.product_k(),
                                                ring.product_v(), me.warp, me.lane);
    if constexpr (shape::WGMMA && shape::STAGES >= 3)
        walk_keys_overlapped<cfg>(o, softmax, math, ring, w, p);
    else
        walk_keys<cfg>(o, softmax, math, ring, w, p);
    copy_async_wait<0>();
    /* The combine may be scheduled now (programmatic launch); it still waits for this grid. */
    fmha_trigger_dependents();

    const bool merge = cfg::walkers > 1 && p.walkers_per_split > 1;
    /* Sinks join the finished rows; split partials never hold them (the combine folds them). */
    const float *sinks = MASK == MASK_WINDOW && !SPLIT ? p.sinks : nullptr;
    write_rows(o, softmax, at, w, me, merge, walker_smem, sinks, ring.v_factor, SPLIT);
    if (merge)
        merge_walkers<cfg, KV8>(at, w, p.walkers_per_split, smem_raw, me, sinks, SPLIT);
}

/* Dynamic shared memory of one CTA of the kernel above. */
template <typename cfg, bool KV8 = false> constexpr int fwd_mma_smem_bytes()
{
    return cfg::walkers * walker_smem_bytes<cfg, KV8>();
}

}  // namespace fmha

#endif /* FMHA_FWD_MMA_H */
