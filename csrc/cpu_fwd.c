/*
 * cpu_fwd.c: the CPU backend.
 *
 * Owns fmha_cpu_fwd (split-K flash attention forward, the same plan shape as
 * the GPU: producers over key-block ranges, then a combine), fmha_cpu_combine
 * (the one implementation of the combine math, also used by fmha_cpu_fwd for
 * its splits), the run-time choice of SIMD kernels, and the KV-cache append
 * (dense or through a block table).  Sequence geometry (packed rows, packed or
 * paged keys, per-sequence lengths) follows fmha.h's rule, read once per call
 * into a table (build_geometry); metadata out of range follows its device rule
 * as the GPU kernels do: nothing outside the tensors is touched, a bad sequence
 * appends nothing and its rows come out NaN.
 *
 * Work decomposition.  A "unit" is one query head, or, when the heads_q /
 * heads_kv query heads of a kv head are packed, one kv head whose rows are
 * (query row, head in group) pairs.  A work item is (batch, unit, chunk of
 * rows, split); its rows are cut into tiles of kern->tile_rows rows that live
 * in the vector lanes (cpu_simd.h).  The item walks its split's key blocks
 * once, converting each K/V block to fp32 once for all its tiles, and runs
 * S = Q K^T, softcap, mask, online softmax and O += P V per tile.  With bf16
 * Q, K and V on a CPU with AVX-512 BF16 (the pair level) Q and K stay bf16,
 * in pairs, and S is their dot product, scaled after; the rest is the same.
 *
 * Model features (fmha.h).  A window bounds each row's keys on both sides: the
 * splits share the blocks the sequence can see at all (from its first row's
 * window start), an item walks only the blocks its rows see, a tile skips the
 * blocks outside all of its rows' windows, and per-element masking runs on a
 * block only where some row's window starts or ends inside it.  The softcap is
 * applied to the log2-domain scores before the mask.  A sink joins the
 * denominator once: in write_row when unsplit, in combine_row after the merge
 * when split (partials never hold it).
 *
 * Determinism.  Each output row is written by exactly one item and computed
 * by the same operation sequence whatever tile, chunk, packing or thread it
 * lands in: the key-block boundaries are fixed by block_n, the split and the
 * sequence's window start, a key block that a tile skips (fully masked) would
 * have left that row's state bit-for-bit unchanged, and lanes never mix.  Splits are merged in split
 * order.  So the bits depend on (problem, num_splits, block_n, ISA) only.
 */
/* posix_memalign */
#define _POSIX_C_SOURCE 200809L

#include "fmha.h"
#include "fmha_config.h"
#include "cpu_pool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FMHA_ISA FMHA_ISA_SCALAR
#include "cpu_simd.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FMHA_CPU_X86 1
#define FMHA_ISA FMHA_ISA_AVX2
#include "cpu_simd.h"
#define FMHA_ISA FMHA_ISA_AVX512
#include "cpu_simd.h"
#define FMHA_ISA FMHA_ISA_AVX512BF16
#include "cpu_simd.h"
#else
#define FMHA_CPU_X86 0
#endif

/* ln(2): the kernels work in the log2 domain, LSE is reported in natural log. */
#define FMHA_LN2 0.693147180559945309417232121458176568
/* Work items a worker should get at least, so dynamic scheduling can balance them. */
#define FMHA_CPU_ITEMS_PER_WORKER 8
/*
 * Tiles of one item share each converted K/V block (and its trip through the
 * cache): as many as keep their Q and O tiles within FMHA_CPU_CHUNK_BYTES (half
 * of a typical 512 KiB L2; measured best against 64 KiB to 512 KiB), at most
 * FMHA_CPU_MAX_CHUNK_TILES.
 */
#define FMHA_CPU_MAX_CHUNK_TILES 16
#define FMHA_CPU_CHUNK_BYTES (256 * 1024)
/* Largest key block the workspace is sized for (the planner uses FMHA_CPU_BLOCK_N). */
#define FMHA_CPU_MAX_BLOCK_N 1024
/* Workspace arrays start on cache-line boundaries. */
#define FMHA_CPU_ALIGN 64
#define FMHA_CPU_LINE_FLOATS (FMHA_CPU_ALIGN / (int)sizeof(float))
/* Rows one combine work item merges. */
#define FMHA_CPU_COMBINE_ROWS 64
/* Features the combine accumulates at a time (any head_dim is done in pieces). */
#define FMHA_CPU_COMBINE_CHUNK 256

/* ------------------------------------------------------------------ */
/* SIMD choice                                                          */
/* ------------------------------------------------------------------ */

static _Atomic(const fmha_cpu_kernels *) g_kernels;

/*
 * FMHA_CPU_SIMD=scalar|avx2|avx512|avx512bf16 can lower the choice (tests, A/B
 * timing); never raise it.  "avx512" is the fp32 AVX-512 kernels for every dtype;
 * "avx512bf16" adds the bf16 pair path (bf16 Q/K/V only, cpu_simd.h).  Unset,
 * empty, "auto" or any other value means the best path the CPU has;
 * fmha_native/__init__.py warns about a value outside that list (keep the names in
 * step with its _SIMD_NAMES).
 */
static int isa_env_cap(void)
{
    const char *env = getenv("FMHA_CPU_SIMD");
    if (!env)
        return FMHA_ISA_AVX512BF16;
    if (strcmp(env, "scalar") == 0)
        return FMHA_ISA_SCALAR;
    if (strcmp(env, "avx2") == 0)
        return FMHA_ISA_AVX2;
    if (strcmp(env, "avx512") == 0)
        return FMHA_ISA_AVX512;
    return FMHA_ISA_AVX512BF16; /* "avx512bf16", "auto" and anything else */
}

static const fmha_cpu_kernels *select_kernels(void)
{
    const fmha_cpu_kernels *k = atomic_load_explicit(&g_kernels, memory_order_acquire);
    if (k)
        return k;
    int cap = isa_env_cap();
    k = &fmha_cpu_kernels_scalar;
#if FMHA_CPU_X86
    __builtin_cpu_init();
    int has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c");
    if (cap >= FMHA_ISA_AVX2 && has_avx2)
        k = &fmha_cpu_kernels_avx2;
    int has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f");
    if (cap >= FMHA_ISA_AVX512 && has_avx512)
        k = &fmha_cpu_kernels_avx512;
    /* libgcc reports AVX-512 features only where the OS saves the zmm state (XCR0). */
    if (cap >= FMHA_ISA_AVX512BF16 && has_avx512 && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512bf16"))
        k = &fmha_cpu_kernels_avx512bf16;
#else
    (void)cap;
#endif
    /* Every thread that races here computes the same answer. */
    atomic_store_explicit(&g_kernels, k, memory_order_release);
    return k;
}

const char *fmha_cpu_simd_name(void) { return select_kernels()->name; }

/* The pair level takes bf16 Q, K and V only; anything else runs the fp32 kernels. */
static const fmha_cpu_kernels *kernels_for(const fmha_fwd_params *p)
{
    const fmha_cpu_kernels *k = select_kernels();
    if (k->pairs && !(p->dtype == FMHA_DTYPE_BF16 && fmha_kv_dtype(p) == FMHA_DTYPE_BF16))
        k = k->fp32;
    return k;
}

const char *fmha_cpu_kernel_name(const fmha_fwd_params *p) { return kernels_for(p)->name; }

int fmha_cpu_num_threads(void) { return fmha_pool_size(); }

/* ------------------------------------------------------------------ */
/* Element conversions (scalar; the vector widen is in cpu_simd.h)      */
/* ------------------------------------------------------------------ */

#define FMHA_F32_SIGN 0x80000000u
#define FMHA_F32_ABS_MASK 0x7fffffffu
#define FMHA_F16_INF 0x7c00u
#define FMHA_F16_QUIET 0x0200u
#define FMHA_BF16_QUIET 0x0040u
/* |x| at or above this rounds to f16 infinity: 65520, halfway between 65504 and 2^16. */
#define FMHA_F16_OVERFLOW_BITS 0x477ff000u
/* |x| below this (2^-14) is an f16 subnormal. */
#define FMHA_F16_MIN_NORMAL_BITS 0x38800000u
/* Re-biasing an fp32 exponent to f16's, in fp32 bit position. */
#define FMHA_F16_REBIAS (((uint32_t)(FMHA_F32_EXP_BIAS - FMHA_F16_EXP_BIAS)) << FMHA_F32_MANT_BITS)
/* Mantissa bits an f16 drops from an fp32, and the round-half-to-even increment below them. */
#define FMHA_F16_DROP_BITS (FMHA_F32_MANT_BITS - FMHA_F16_MANT_BITS)
#define FMHA_F16_HALF_ULP_M1 0x0fffu
#define FMHA_BF16_HALF_ULP_M1 0x7fffu
/* Adding 0.5 makes the FPU round a subnormal-range f16 magnitude to a multiple of 2^-24. */
#define FMHA_F16_SUBNORMAL_MAGIC 0.5f
#define FMHA_F16_SUBNORMAL_MAGIC_BITS 0x3f000000u

static uint16_t f32_to_f16(float f)
{
    uint32_t x = fmha_f32_to_bits(f);
    uint16_t sign = (uint16_t)((x & FMHA_F32_SIGN) >> FMHA_BF16_SHIFT);
    uint32_t ax = x & FMHA_F32_ABS_MASK;
    if (ax > FMHA_F32_INF_BITS)
        return (uint16_t)(sign | FMHA_F16_INF | FMHA_F16_QUIET |
                          ((ax >> FMHA_F16_DROP_BITS) & FMHA_F16_MANT_MASK));
    if (ax >= FMHA_F16_OVERFLOW_BITS)
        return (uint16_t)(sign | FMHA_F16_INF);
    if (ax < FMHA_F16_MIN_NORMAL_BITS) {
        float mag = fmha_bits_to_f32(ax) + FMHA_F16_SUBNORMAL_MAGIC;
        return (uint16_t)(sign | (fmha_f32_to_bits(mag) - FMHA_F16_SUBNORMAL_MAGIC_BITS));
    }
    uint32_t odd = (ax >> FMHA_F16_DROP_BITS) & 1u;
    return (uint16_t)(sign | ((ax - FMHA_F16_REBIAS + FMHA_F16_HALF_ULP_M1 + odd) >>
                              FMHA_F16_DROP_BITS));
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x = fmha_f32_to_bits(f);
    if ((x & FMHA_F32_ABS_MASK) > FMHA_F32_INF_BITS)
        return (uint16_t)((x >> FMHA_BF16_SHIFT) | FMHA_BF16_QUIET);
    uint32_t odd = (x >> FMHA_BF16_SHIFT) & 1u;
    return (uint16_t)((x + FMHA_BF16_HALF_ULP_M1 + odd) >> FMHA_BF16_SHIFT);
}

static size_t dtype_size(fmha_dtype dt)
{
    if (dt == FMHA_DTYPE_E4M3)
        return 1;
    return dt == FMHA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* ---- fp8 KV cache (issue 22) ---- */

/* 448 (the largest finite e4m3fn) and 2^-6 (its smallest normal) as fp32 bits, the code
 * of +448, and the subnormal step 2^-9 as a factor. */
#define FMHA_E4M3_MAX_BITS 0x43e00000u
#define FMHA_E4M3_MIN_NORMAL_BITS 0x3c800000u
#define FMHA_E4M3_MAX_CODE 0x7eu
#define FMHA_E4M3_SUBNORMAL_STEPS 512.0f
/* Mantissa bits an e4m3 drops from an fp32, and the round-half-to-even increment below them. */
#define FMHA_E4M3_HALF_ULP_M1 0x7ffffu

/* fp32 to float8 e4m3fn: round to nearest even, |f| >= 448 (infinities too) saturated to
 * +-448, NaN to NaN (the append's quantize-on-write, fmha.h). */
static uint8_t f32_to_e4m3(float f)
{
    uint32_t x = fmha_f32_to_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & FMHA_E4M3_SIGN);
    uint32_t ax = x & FMHA_F32_ABS_MASK;
    if (ax > FMHA_F32_INF_BITS)
        return (uint8_t)(sign | FMHA_E4M3_NAN);
    if (ax >= FMHA_E4M3_MAX_BITS)
        return (uint8_t)(sign | FMHA_E4M3_MAX_CODE);
    if (ax < FMHA_E4M3_MIN_NORMAL_BITS) {
        /* Multiples of 2^-9: the scaled magnitude (exact, < 8) rounded; 8 is the smallest
         * normal's code. */
        return (uint8_t)(sign | (uint8_t)rintf(fmha_bits_to_f32(ax) * FMHA_E4M3_SUBNORMAL_STEPS));
    }
    uint32_t odd = (ax >> FMHA_E4M3_SHIFT) & 1u;
    uint32_t top = (ax + FMHA_E4M3_HALF_ULP_M1 + odd) >> FMHA_E4M3_SHIFT;
    return (uint8_t)(sign | (top - FMHA_E4M3_REBIAS));
}

/* The dequantization factor of kv head h in sequence b: scale times the array's entry
 * when there is one (fmha.h). */
static float kv_factor(float scale, const float *scales, int64_t batch_stride,
                       int64_t head_stride, int64_t b, int64_t h)
{
    return scales ? scale * scales[b * batch_stride + h * head_stride] : scale;
}

static int dtype_valid(fmha_dtype dt)
{
    return dt == FMHA_DTYPE_F16 || dt == FMHA_DTYPE_BF16 || dt == FMHA_DTYPE_F32;
}

static float load_elem(const void *base, int64_t idx, fmha_dtype dt)
{
    switch (dt) {
    case FMHA_DTYPE_F16: return fmha_f16_to_f32(((const uint16_t *)base)[idx]);
    case FMHA_DTYPE_BF16: return fmha_bf16_to_f32(((const uint16_t *)base)[idx]);
    case FMHA_DTYPE_F32: break;
    }
    return ((const float *)base)[idx];
}

static void store_elem(void *base, int64_t idx, fmha_dtype dt, float v)
{
    switch (dt) {
    case FMHA_DTYPE_F16: ((uint16_t *)base)[idx] = f32_to_f16(v); return;
    case FMHA_DTYPE_BF16: ((uint16_t *)base)[idx] = f32_to_bf16(v); return;
    case FMHA_DTYPE_F32: break;
    }
    ((float *)base)[idx] = v;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ------------------------------------------------------------------ */
/* Packed sequences                                                     */
/* ------------------------------------------------------------------ */

/*
 * Rows [*start, *end) that sequence b owns in a packed dimension of `total` rows
 * holding sequences of at most max_len rows, by fmha.h's clamp rule.  Returns 1 when
 * cu had to be clamped (the sequence is bad: its rows come out NaN).
 */
static int packed_rows(const int32_t *cu, int64_t b, int64_t total, int64_t max_len,
                       int64_t *start, int64_t *end)
{
    int64_t lo = cu[b], hi = cu[b + 1];
    int64_t s = lo < 0 ? 0 : lo > total ? total : lo;
    int64_t cap = min64(total, s + max_len);
    int64_t e = hi < s ? s : hi > cap ? cap : hi;
    *start = s;
    *end = e;
    return s != lo || e != hi;
}

/* ------------------------------------------------------------------ */
/* Combine: the one implementation of the split merge                   */
/* ------------------------------------------------------------------ */

/* Packed combine: one sequence's rows and the first work item that merges them. */
typedef struct combine_seq {
    int64_t start; /* first packed row */
    int64_t rows;  /* its rows times heads */
    int64_t item0; /* [batch] holds the item count */
} combine_seq;

typedef struct combine_job {
    const fmha_combine_params *c;
    int64_t rows;             /* dense: batch * seqlen_q * heads */
    const combine_seq *seqs;  /* packed: [batch + 1]; NULL when dense */
} combine_job;

/*
 * out = sum_g w_g o_g with w_g = exp(lse_g - M) / (sum_g' exp(lse_g' - M) + exp(sink - M)),
 * lse = M + log(that sum), M the largest of the lse_g and the sink, in split order
 * (no sinks: sink = -inf, the plain merge).  Splits with lse = -inf add nothing;
 * all -inf gives (0, sink), i.e. (0, -inf) without sinks; a NaN lse or sink makes
 * the row NaN.
 */
static void combine_row(const fmha_combine_params *c, int64_t b, int64_t i, int64_t h)
{
    const float *lp = c->lse_partial + b * c->lp_batch_stride + h * c->lp_head_stride +
                      i * c->lp_row_stride;
    int64_t out_off = b * c->o_batch_stride + i * c->o_row_stride + h * c->o_head_stride;
    int64_t op_off = b * c->op_batch_stride + i * c->op_row_stride + h * c->op_head_stride;
    double lse_max = -INFINITY;
    const double sink = c->sinks ? (double)c->sinks[h] : -INFINITY;
    int has_nan = sink != sink;
    for (int64_t g = 0; g < c->num_splits; g++) {
        double x = lp[g * c->lp_split_stride];
        if (x != x)
            has_nan = 1;
        else if (x > lse_max)
            lse_max = x;
    }
    if (sink > lse_max)
        lse_max = sink;
    float lse;
    if (has_nan || lse_max == -INFINITY) {
        float fill = has_nan ? NAN : 0.0f;
        for (int64_t d = 0; d < c->head_dim; d++)
            store_elem(c->out, out_off + d, c->out_dtype, fill);
        lse = has_nan ? NAN : -INFINITY;
    } else {
        double sum = 0.0;
        for (int64_t g = 0; g < c->num_splits; g++) {
            double x = lp[g * c->lp_split_stride];
            if (x != -INFINITY)
                sum += exp(x - lse_max);
        }
        if (sink != -INFINITY)
            sum += exp(sink - lse_max);
        float acc[FMHA_CPU_COMBINE_CHUNK];
        for (int64_t d0 = 0; d0 < c->head_dim; d0 += FMHA_CPU_COMBINE_CHUNK) {
            int64_t nd = min64(FMHA_CPU_COMBINE_CHUNK, c->head_dim - d0);
            for (int64_t d = 0; d < nd; d++)
                acc[d] = 0.0f;
            for (int64_t g = 0; g < c->num_splits; g++) {
                double x = lp[g * c->lp_split_stride];
                if (x == -INFINITY)
                    continue;
                float w = (float)(exp(x - lse_max) / sum);
                int64_t base = op_off + g * c->op_split_stride + d0;
                for (int64_t d = 0; d < nd; d++)
                    acc[d] += w * load_elem(c->o_partial, base + d, c->in_dtype);
            }
            for (int64_t d = 0; d < nd; d++)
                store_elem(c->out, out_off + d0 + d, c->out_dtype, acc[d]);
        }
        lse = (float)(lse_max + log(sum));
    }
    if (c->lse)
        c->lse[b * c->lse_batch_stride + h * c->lse_head_stride + i * c->lse_row_stride] = lse;
}

static void combine_item(void *ctx, int64_t item, int worker)
{
    (void)worker;
    const combine_job *job = (const combine_job *)ctx;
    const fmha_combine_params *c = job->c;
    if (!job->seqs) {
        int64_t end = min64((item + 1) * FMHA_CPU_COMBINE_ROWS, job->rows);
        for (int64_t row = item * FMHA_CPU_COMBINE_ROWS; row < end; row++) {
            int64_t h = row % c->heads;
            int64_t bi = row / c->heads;
            combine_row(c, bi / c->seqlen_q, bi % c->seqlen_q, h);
        }
        return;
    }
    /* The last sequence whose first item is at or before this one (empty ones share it). */
    int64_t lo = 0, hi = c->batch;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (job->seqs[mid].item0 <= item)
            lo = mid;
        else
            hi = mid;
    }
    const combine_seq *sq = &job->seqs[lo];
    int64_t r0 = (item - sq->item0) * FMHA_CPU_COMBINE_ROWS;
    int64_t end = min64(r0 + FMHA_CPU_COMBINE_ROWS, sq->rows);
    /* Packed rows carry no batch index: their batch strides are unused. */
    for (int64_t row = r0; row < end; row++)
        combine_row(c, 0, sq->start + row / c->heads, row % c->heads);
}

/*
 * The packed combine's sequence table ([batch + 1], malloc'd; NULL when out of
 * memory) and its item count.  Rows of a sequence whose cu_seqlens_q needed clamping
 * are merged as clamped: a forward that produced them wrote their partials NaN.
 */
static combine_seq *combine_seqs(const fmha_combine_params *c, int64_t *items)
{
    combine_seq *seqs = (combine_seq *)malloc((size_t)(c->batch + 1) * sizeof *seqs);
    if (!seqs)
        return NULL;
    int64_t n = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        int64_t start, end;
        packed_rows(c->cu_seqlens_q, b, c->total_q, c->seqlen_q, &start, &end);
        seqs[b].start = start;
        seqs[b].rows = (end - start) * c->heads;
        seqs[b].item0 = n;
        n += ceil_div(seqs[b].rows, FMHA_CPU_COMBINE_ROWS);
    }
    seqs[c->batch].start = seqs[c->batch].rows = 0;
    seqs[c->batch].item0 = n;
    *items = n;
    return seqs;
}

/* Runs the merge; seqs is combine_seqs' table when c is packed, else NULL. */
static void combine_run(const fmha_combine_params *c, const combine_seq *seqs)
{
    combine_job job = {c, c->batch * c->seqlen_q * c->heads, seqs};
    int64_t items = seqs ? seqs[c->batch].item0 : ceil_div(job.rows, FMHA_CPU_COMBINE_ROWS);
    if (items == 0)
        return;
    fmha_pool_run(items, fmha_pool_workers(c->num_threads, items), combine_item, &job);
}

fmha_status fmha_cpu_combine(const fmha_combine_params *c)
{
    if (!c || c->num_splits < 0 || c->batch < 0 || c->seqlen_q < 0 || c->heads < 0 ||
        c->head_dim < 0 || !dtype_valid(c->in_dtype) || !dtype_valid(c->out_dtype))
        return FMHA_ERR_INVALID;
    if (c->cu_seqlens_q && c->total_q < 0)
        return FMHA_ERR_INVALID;
    int64_t rows = c->cu_seqlens_q ? c->total_q * c->heads : c->batch * c->seqlen_q * c->heads;
    if (rows == 0 || c->batch == 0)
        return FMHA_OK;
    if (c->head_dim > 0 && !c->out)
        return FMHA_ERR_INVALID;
    if (c->num_splits > 0 && (!c->lse_partial || (c->head_dim > 0 && !c->o_partial)))
        return FMHA_ERR_INVALID;
    if (!c->cu_seqlens_q) {
        combine_run(c, NULL);
        return FMHA_OK;
    }
    int64_t items;
    combine_seq *seqs = combine_seqs(c, &items);
    if (!seqs)
        return FMHA_ERR_NOMEM;
    combine_run(c, seqs);
    free(seqs);
    return FMHA_OK;
}

/* ------------------------------------------------------------------ */
/* Forward                                                              */
/* ------------------------------------------------------------------ */

/*
 * One sequence's geometry (fmha.h, "packed (varlen) sequences and a paged KV
 * cache"), read once from the metadata before any work starts.  A bad sequence
 * (clamped cu_seqlens, or a cache length that does not fit) appends nothing and
 * writes NaN over its rows; an out-of-range page ends key_end, and the rows that
 * would see a key at or past it come out NaN while the others see only keys
 * before it, so that page is never read.
 */
typedef struct seq_geom {
    int64_t q0;       /* first packed query row (cu_seqlens_q), else 0 */
    int64_t len_q;    /* query rows */
    int64_t k0;       /* first row of k/v (cu_seqlens_k), else 0 */
    int64_t len_k;    /* keys attended, appended ones included */
    int64_t key_end;  /* keys before the first out-of-range page; len_k when none */
    int64_t new_len;  /* rows appended */
    int64_t acc_row;  /* row 0 of this sequence in a split of o_accum */
    int64_t lacc_off; /* (head 0, row 0) of this sequence in a split of lse_accum */
    int bad;
} seq_geom;

typedef struct fwd_job {
    const fmha_fwd_params *p;
    const fmha_cpu_kernels *kern;
    const seq_geom *seqs; /* [batch] */
    int64_t group;       /* query heads per kv head */
    int64_t pack;        /* query heads per packed row group: group when packed, else 1 */
    int64_t units;       /* heads_kv when packed, else heads_q */
    int64_t chunk_tiles; /* tiles per work item */
    int64_t chunks;      /* work items per (batch, unit, split): of the longest sequence */
    int64_t splits;
    int64_t kv_ld;       /* floats between rows of the fp32 K/V blocks */
    int64_t k_ld;        /* between rows of the K block: kv_ld, or words of bf16 pairs */
    int64_t win_right;   /* keys a row sees past its position (-1 = all; 0 when causal) */
    float softcap_log2;  /* softcap in the log2 domain of the scores (0 = off) */
    float *o_accum;      /* split partials, NULL when num_splits == 1 */
    float *lse_accum;
    int64_t acc_rows;         /* query rows of one split of o_accum */
    int64_t lacc_head_stride; /* between heads in lse_accum */
    unsigned char *ws;   /* per-worker workspace, ws_bytes each */
    size_t ws_bytes;
} fwd_job;

/* One worker's scratch, carved from its slice of fwd_job.ws. */
typedef struct fwd_scratch {
    float *qt;       /* [chunk_tiles][head_dim][tile_rows] Q * scale_log2, transposed (pair
                        level: a tile's first (head_dim + 1) / 2 rows hold Q's pairs, unscaled) */
    float *ot;       /* [chunk_tiles][head_dim][tile_rows] O accumulator, transposed */
    float *m, *l;    /* [chunk_tiles][tile_rows] running max (log2 domain) and sum */
    float *alpha;    /* [tile_rows] rescale of the current step */
    float *limit;    /* [tile_rows] last visible key relative to the current key block */
    float *first;    /* [tile_rows] first visible key relative to the current key block */
    float *st;       /* [block_n][tile_rows] scores, then probabilities */
    float *kbuf;     /* [block_n][kv_ld] K block in fp32 (pair level: [block_n][k_ld] words) */
    float *vbuf;     /* [block_n][kv_ld] V block in fp32 */
    float *rows;     /* [tile_rows][head_dim] a tile's rows in fp32, on their way in or out */
    int64_t *lim;    /* [chunk_tiles][tile_rows] last key each row sees */
    int64_t *lim_lo; /* [chunk_tiles] smallest / largest lim of the tile's rows */
    int64_t *lim_hi;
    int64_t *low;    /* [chunk_tiles][tile_rows] first key each row sees (a window's left) */
    int64_t *low_lo; /* [chunk_tiles] smallest / largest low of the tile's rows */
    int64_t *low_hi;
} fwd_scratch;

static size_t align_up(size_t n)
{
    return (n + FMHA_CPU_ALIGN - 1) / FMHA_CPU_ALIGN * FMHA_CPU_ALIGN;
}

/* Lays out (base != NULL) or measures (base == NULL) one worker's scratch; returns its size. */
static size_t scratch_layout(const fwd_job *job, unsigned char *base, fwd_scratch *s)
{
    size_t tr = (size_t)job->kern->tile_rows;
    size_t ct = (size_t)job->chunk_tiles;
    size_t hd = (size_t)job->p->head_dim;
    size_t bn = (size_t)job->p->block_n;
    size_t off = 0;
#define FMHA_CARVE(field, type, count)                                     \
    do {                                                                   \
        if (base)                                                          \
            s->field = (type *)(void *)(base + off);                       \
        off += align_up((count) * sizeof(type));                           \
    } while (0)
    FMHA_CARVE(qt, float, ct * hd * tr);
    FMHA_CARVE(ot, float, ct * hd * tr);
    FMHA_CARVE(m, float, ct * tr);
    FMHA_CARVE(l, float, ct * tr);
    FMHA_CARVE(alpha, float, tr);
    FMHA_CARVE(limit, float, tr);
    FMHA_CARVE(first, float, tr);
    FMHA_CARVE(st, float, bn * tr);
    FMHA_CARVE(kbuf, float, bn * (size_t)job->kv_ld);
    FMHA_CARVE(vbuf, float, bn * (size_t)job->kv_ld);
    FMHA_CARVE(rows, float, tr * hd);
    FMHA_CARVE(lim, int64_t, ct * tr);
    FMHA_CARVE(lim_lo, int64_t, ct);
    FMHA_CARVE(lim_hi, int64_t, ct);
    FMHA_CARVE(low, int64_t, ct * tr);
    FMHA_CARVE(low_lo, int64_t, ct);
    FMHA_CARVE(low_hi, int64_t, ct);
#undef FMHA_CARVE
    return off;
}

static int page_valid(const fmha_fwd_params *p, int64_t page)
{
    return page >= 0 && page < p->num_pages;
}

/* Fills seqs[0..batch) from the params (fmha.h's geometry and clamp rules). */
static void build_geometry(const fmha_fwd_params *p, seq_geom *seqs)
{
    for (int64_t b = 0; b < p->batch; b++) {
        seq_geom *g = &seqs[b];
        memset(g, 0, sizeof *g);
        int bad = 0;
        int64_t q1 = p->seqlen_q;
        if (p->cu_seqlens_q)
            bad |= packed_rows(p->cu_seqlens_q, b, p->total_q, p->seqlen_q, &g->q0, &q1);
        g->len_q = q1 - g->q0;
        g->new_len = !p->k_new ? 0 : p->cu_seqlens_q ? g->len_q : p->seqlen_new;
        int64_t len_k = p->seqlen_k;
        if (p->seqlens_k) {
            int64_t cached = p->seqlens_k[b];
            if (cached < 0 || cached > p->seqlen_k - g->new_len) {
                bad = 1;
                len_k = 0;
            } else {
                len_k = cached + g->new_len;
            }
        } else if (p->cu_seqlens_k) {
            int64_t k1;
            bad |= packed_rows(p->cu_seqlens_k, b, p->total_k, p->seqlen_k, &g->k0, &k1);
            len_k = k1 - g->k0;
        }
        g->len_k = len_k;
        g->key_end = len_k;
        if (p->block_table && !bad) {
            const int32_t *bt = p->block_table + b * p->block_table_stride;
            int64_t pages = ceil_div(len_k, p->page_size);
            for (int64_t j = 0; j < pages; j++) {
                if (!page_valid(p, bt[j])) {
                    g->key_end = j * p->page_size;
                    break;
                }
            }
        }
        g->bad = bad;
        g->acc_row = p->cu_seqlens_q ? g->q0 : b * p->seqlen_q;
        g->lacc_off = p->cu_seqlens_q ? g->q0 : b * p->heads_q * p->seqlen_q;
    }
}

/* Element offset of query-indexed row i of sequence b (q, out, lse, k_new, v_new). */
static int64_t qrow_off(const fmha_fwd_params *p, const seq_geom *g, int64_t b, int64_t i,
                        int64_t batch_stride, int64_t row_stride)
{
    return p->cu_seqlens_q ? (g->q0 + i) * row_stride : b * batch_stride + i * row_stride;
}

/* The query head of row `row` of a unit: packed units interleave their query heads
 * row by row (the row's query index is row / job->pack). */
static int64_t row_head(const fwd_job *job, int64_t unit, int64_t row)
{
    return job->pack > 1 ? unit * job->pack + row % job->pack : unit;
}

/* Final state of one row (its normalised fp32 values): out/lse, or the split's fp32 partial. */
static void write_row(const fwd_job *job, float *vals, float m, float l, int64_t b,
                      int64_t i, int64_t h, int64_t split)
{
    const fmha_fwd_params *p = job->p;
    const seq_geom *g = &job->seqs[b];
    size_t row_bytes = (size_t)p->head_dim * sizeof(float);
    /* A row that saw no key is (0, -inf), never 0/0. */
    float lse = l == 0.0f ? -INFINITY : (float)((double)m * FMHA_LN2 + log((double)l));
    if (p->sinks && !job->o_accum) {
        /* Unsplit: fold the sink in here (split partials never hold it: the combine
         * folds it after the merge).  vals is normalised by sum_j e^{s_j}; the sink
         * scales it by that sum over the sum with e^{sink} added. */
        double lse0 = lse, sink = p->sinks[h], total;
        float scale;
        if (lse0 != lse0 || sink != sink) {
            total = NAN;
            scale = NAN;
        } else if (lse0 == -INFINITY) {
            total = sink;
            scale = 0.0f;
        } else {
            double mx = lse0 > sink ? lse0 : sink;
            total = mx + log(exp(lse0 - mx) + exp(sink - mx));
            scale = (float)exp(lse0 - total);
        }
        for (int64_t d = 0; d < p->head_dim; d++)
            vals[d] *= scale;
        lse = (float)total;
    }
    if (job->o_accum) {
        int64_t row = split * job->acc_rows + g->acc_row + i;
        memcpy(job->o_accum + (row * p->heads_q + h) * p->head_dim, vals, row_bytes);
        job->lse_accum[split * p->heads_q * job->acc_rows + g->lacc_off +
                       h * job->lacc_head_stride + i] = lse;
        return;
    }
    int64_t off = qrow_off(p, g, b, i, p->o_batch_stride, p->o_row_stride) + h * p->o_head_stride;
    switch (p->out_dtype) {
    case FMHA_DTYPE_F32:
        memcpy((float *)p->out + off, vals, row_bytes);
        break;
    case FMHA_DTYPE_F16:
        for (int64_t d = 0; d < p->head_dim; d++)
            ((uint16_t *)p->out)[off + d] = f32_to_f16(vals[d]);
        break;
    case FMHA_DTYPE_BF16:
        for (int64_t d = 0; d < p->head_dim; d++)
            ((uint16_t *)p->out)[off + d] = f32_to_bf16(vals[d]);
        break;
    }
    if (p->lse)
        p->lse[qrow_off(p, g, b, i, p->lse_batch_stride, p->lse_row_stride) +
               h * p->lse_head_stride] = lse;
}

/* Rows [row, row + rows) of the K block from src (rows k_row_stride apart): widened to
 * fp32, or at the pair level copied as bf16 pairs of features. */
static void load_k_rows(const fwd_job *job, fwd_scratch *s, int64_t row, const void *src,
                        int64_t rows, fmha_dtype kv)
{
    const fmha_fwd_params *p = job->p;
    if (job->kern->pairs)
        job->kern->pack_k((uint32_t *)(void *)s->kbuf + row * job->k_ld, job->k_ld,
                          (const uint16_t *)src, rows, p->k_row_stride, p->head_dim);
    else
        job->kern->widen(s->kbuf + row * job->k_ld, job->k_ld, src, rows, p->k_row_stride,
                         p->head_dim, kv);
}

/*
 * Keys [n0, n0 + nb) of sequence b, kv head kvh, into the fp32 blocks (K as bf16 pairs
 * at the pair level: load_k_rows).  Every dtype is copied, f32 included: cache rows are
 * heads_kv * head_dim apart, and a block read in place at a power-of-two stride keeps
 * hitting the same few L1 sets (so does head_dim itself: the copy's rows are job->kv_ld,
 * or job->k_ld, apart).  A paged cache is copied one run of
 * rows within a page at a time; the caller keeps the keys before the sequence's
 * key_end, so every page read here is in range.
 */
static void load_kv(const fwd_job *job, fwd_scratch *s, int64_t b, const seq_geom *g,
                    int64_t kvh, int64_t n0, int64_t nb)
{
    const fmha_fwd_params *p = job->p;
    const fmha_dtype kv = fmha_kv_dtype(p);
    size_t es = dtype_size(kv);
    const unsigned char *kp = (const unsigned char *)p->k;
    const unsigned char *vp = (const unsigned char *)p->v;
    int64_t kh = kvh * p->k_head_stride, vh = kvh * p->v_head_stride;
    if (!p->block_table) {
        int64_t row = g->k0 + n0;
        int64_t k_off = (p->cu_seqlens_k ? 0 : b * p->k_batch_stride) + row * p->k_row_stride + kh;
        int64_t v_off = (p->cu_seqlens_k ? 0 : b * p->v_batch_stride) + row * p->v_row_stride + vh;
        load_k_rows(job, s, 0, kp + (size_t)k_off * es, nb, kv);
        job->kern->widen(s->vbuf, job->kv_ld, vp + (size_t)v_off * es, nb, p->v_row_stride,
                         p->head_dim, kv);
        return;
    }
    const int32_t *bt = p->block_table + b * p->block_table_stride;
    for (int64_t j = n0; j < n0 + nb;) {
        int64_t page = bt[j / p->page_size];
        int64_t slot = j % p->page_size;
        int64_t run = min64(p->page_size - slot, n0 + nb - j);
        int64_t k_off = page * p->k_batch_stride + slot * p->k_row_stride + kh;
        int64_t v_off = page * p->v_batch_stride + slot * p->v_row_stride + vh;
        load_k_rows(job, s, j - n0, kp + (size_t)k_off * es, run, kv);
        job->kern->widen(s->vbuf + (j - n0) * job->kv_ld, job->kv_ld, vp + (size_t)v_off * es,
                         run, p->v_row_stride, p->head_dim, kv);
        j += run;
    }
}

static void fwd_item(void *ctx, int64_t item, int worker)
{
    const fwd_job *job = (const fwd_job *)ctx;
    const fmha_fwd_params *p = job->p;
    const fmha_cpu_kernels *kern = job->kern;
    const int64_t tr = kern->tile_rows;
    const int64_t hd = p->head_dim;
    const int64_t bn = p->block_n;
    fwd_scratch s;
    scratch_layout(job, job->ws + (size_t)worker * job->ws_bytes, &s);

    /* Items run from the last chunk (most keys under a causal mask) to the first. */
    int64_t split = item % job->splits;
    item /= job->splits;
    int64_t unit = item % job->units;
    item /= job->units;
    int64_t b = item % p->batch;
    int64_t chunk = job->chunks - 1 - item / p->batch;
    const seq_geom *g = &job->seqs[b];

    /* Chunks are counted for the longest sequence: a shorter one has none this far. */
    int64_t unit_rows = g->len_q * job->pack;
    int64_t r0 = chunk * job->chunk_tiles * tr;
    if (r0 >= unit_rows)
        return;
    int64_t rows = min64(job->chunk_tiles * tr, unit_rows - r0);
    if (g->bad) {
        for (int64_t d = 0; d < hd; d++)
            s.rows[d] = NAN;
        for (int64_t row = r0; row < r0 + rows; row++)
            write_row(job, s.rows, NAN, NAN, b, row / job->pack, row_head(job, unit, row), split);
        return;
    }
    int64_t len = g->len_k;
    int64_t shift = len - g->len_q; /* query i sits at key position i + shift (fmha.h) */
    int64_t left = p->window_left;
    /*
     * The splits share the key blocks the sequence's rows can see at all: from the first
     * row's window start (a left bound hides the blocks before it from every row) to the
     * end.  The range depends on the sequence only, so a row's result does not depend on
     * the other rows (DESIGN.md, forced num_splits).
     */
    int64_t blk_lo = left < 0 ? 0 : max64(0, shift - left) / bn;
    int64_t nblk = ceil_div(len, bn);
    blk_lo = min64(blk_lo, nblk);
    int64_t per = ceil_div(nblk - blk_lo, job->splits);
    int64_t kb0 = blk_lo + min64(split * per, nblk - blk_lo);
    int64_t kb1 = min64(kb0 + per, nblk);
    int64_t kvh = job->pack > 1 ? unit : unit / job->group;

    int64_t tiles = ceil_div(rows, tr);
    int64_t chunk_hi = INT64_MIN, chunk_low = INT64_MAX;
    size_t es = dtype_size(p->dtype);
    /*
     * An fp8 KV cache is read as its codes' values; the item's one kv head and sequence
     * have one factor each, so K's folds into the scores' scale and V's into the output
     * (fmha.h).  Against dequantizing every element first, this changes each score by one
     * fp32 rounding of the combined scale (relative 2^-24) and each output by one
     * rounding of the product (relative 2^-24).
     */
    const int kv_fp8 = fmha_kv_dtype(p) == FMHA_DTYPE_E4M3;
    float q_scale = p->scale_log2, o_scale = 1.0f;
    if (kv_fp8) {
        q_scale *= kv_factor(p->k_scale, p->k_scales, p->k_scales_batch_stride,
                             p->k_scales_head_stride, b, kvh);
        o_scale = kv_factor(p->v_scale, p->v_scales, p->v_scales_batch_stride,
                            p->v_scales_head_stride, b, kvh);
    }

    for (int64_t t = 0; t < tiles; t++) {
        int64_t lo = INT64_MAX, hi = INT64_MIN, low_lo = INT64_MAX, low_hi = INT64_MIN;
        for (int64_t r = 0; r < tr; r++) {
            int64_t row = r0 + t * tr + r;
            if (row >= r0 + rows) {
                memset(s.rows + r * hd, 0, (size_t)hd * sizeof(float));
                s.lim[t * tr + r] = -1;
                s.low[t * tr + r] = 0;
                continue;
            }
            int64_t i = row / job->pack;
            int64_t h = row_head(job, unit, row);
            int64_t off = qrow_off(p, g, b, i, p->q_batch_stride, p->q_row_stride) +
                          h * p->q_head_stride;
            kern->widen(s.rows + r * hd, 0, (const unsigned char *)p->q + (size_t)off * es, 1, 0,
                        hd, p->dtype);
            /* Keys [low, lim] are visible (fmha.h); none when low > lim. */
            int64_t pos = i + shift;
            int64_t lim = job->win_right < 0 ? len - 1 : min64(len - 1, pos + job->win_right);
            int64_t low = left < 0 ? 0 : max64(0, pos - left);
            s.lim[t * tr + r] = lim;
            s.low[t * tr + r] = low;
            lo = min64(lo, lim);
            hi = max64(hi, lim);
            low_lo = min64(low_lo, low);
            low_hi = max64(low_hi, low);
        }
        if (kern->pairs)
            kern->pack_q((uint32_t *)(void *)(s.qt + t * hd * tr), s.rows, hd);
        else
            kern->load_q(s.qt + t * hd * tr, s.rows, hd, q_scale);
        s.lim_lo[t] = lo;
        s.lim_hi[t] = hi;
        s.low_lo[t] = low_lo;
        s.low_hi[t] = low_hi;
        chunk_hi = max64(chunk_hi, hi);
        chunk_low = min64(chunk_low, low_lo);
        for (int64_t r = 0; r < tr; r++) {
            s.m[t * tr + r] = -INFINITY;
            s.l[t * tr + r] = 0.0f;
        }
        memset(s.ot + t * hd * tr, 0, (size_t)(hd * tr) * sizeof(float));
    }

    /* Keys from key_end on are never read (an out-of-range page); blocks past every
     * row's last visible key, or before every row's first (a window), are skipped (no
     * state change), so the work grows with the window, not with the keys. */
    int64_t key_end = g->key_end;
    int64_t kb_end = min64(kb1, ceil_div(key_end, bn));
    kb_end = chunk_hi < 0 ? kb0 : min64(kb_end, chunk_hi / bn + 1);
    int64_t kb_start = max64(kb0, chunk_low / bn);

    for (int64_t kb = kb_start; kb < kb_end; kb++) {
        int64_t n0 = kb * bn;
        int64_t nb = min64(bn, key_end - n0);
        load_kv(job, &s, b, g, kvh, n0, nb);
        for (int64_t t = 0; t < tiles; t++) {
            if (s.lim_hi[t] < n0 || s.low_lo[t] > n0 + nb - 1)
                continue;
            float *m = s.m + t * tr, *l = s.l + t * tr;
            float *ot = s.ot + t * hd * tr;
            /* The pair level scales the scores (its Q stays bf16); the others scaled Q. */
            if (kern->pairs)
                kern->gemm_pairs((const uint32_t *)(const void *)(s.qt + t * hd * tr),
                                 (hd + 1) / 2, (const uint32_t *)(const void *)s.kbuf, job->k_ld,
                                 1, nb, s.st, q_scale);
            else
                kern->gemm(s.qt + t * hd * tr, hd, s.kbuf, job->kv_ld, 1, nb, s.st, NULL);
            if (job->softcap_log2 > 0.0f) {
                /* c tanh(s / c) on the natural-log score is c' tanh(s' / c') on its log2
                 * form s' = s log2(e), with c' = c log2(e); masking comes after, so a
                 * masked score stays -inf. */
                kern->softcap(s.st, nb * tr, job->softcap_log2);
            }
            /* Per-element masking only on a boundary block of some row. */
            if (s.lim_lo[t] < n0 + nb - 1 || s.low_hi[t] > n0) {
                for (int64_t r = 0; r < tr; r++) {
                    int64_t rel = s.lim[t * tr + r] - n0;
                    int64_t rel_low = s.low[t * tr + r] - n0;
                    s.limit[r] = (float)(rel < -1 ? -1 : rel > bn ? bn : rel);
                    s.first[r] = (float)(rel_low < 0 ? 0 : rel_low > bn ? bn : rel_low);
                }
                kern->mask(s.st, nb, s.first, s.limit);
            }
            kern->softmax(s.st, nb, m, l, s.alpha);
            kern->gemm(s.st, nb, s.vbuf, 1, job->kv_ld, hd, ot, s.alpha);
        }
    }

    for (int64_t t = 0; t < tiles; t++) {
        kern->store_o(s.rows, s.ot + t * hd * tr, hd, s.l + t * tr);
        for (int64_t r = 0; r < tr && t * tr + r < rows; r++) {
            int64_t row = r0 + t * tr + r;
            int64_t i = row / job->pack;
            int64_t h = row_head(job, unit, row);
            float *vals = s.rows + r * hd;
            float m = s.m[t * tr + r], l = s.l[t * tr + r];
            if (kv_fp8)
                for (int64_t d = 0; d < hd; d++)
                    vals[d] *= o_scale;
            /* Every split marks such a row, so the merge keeps it NaN. */
            if (s.lim[t * tr + r] >= key_end && s.low[t * tr + r] <= s.lim[t * tr + r]) {
                for (int64_t d = 0; d < hd; d++)
                    vals[d] = NAN;
                m = l = NAN;
            }
            write_row(job, vals, m, l, b, i, h, split);
        }
    }
}

static fmha_status validate(const fmha_fwd_params *p)
{
    if (!p)
        return FMHA_ERR_INVALID;
    if (p->batch < 0 || p->seqlen_q < 0 || p->seqlen_k < 0 || p->heads_q < 0 ||
        p->heads_kv < 1 || p->heads_q % p->heads_kv != 0 || p->seqlen_new < 0)
        return FMHA_ERR_INVALID;
    /* out: the inputs' dtype, or fp32 (fmha.h) */
    if (!dtype_valid(p->dtype) || (p->out_dtype != p->dtype && p->out_dtype != FMHA_DTYPE_F32))
        return FMHA_ERR_INVALID;
    if (p->kv_dtype == FMHA_DTYPE_E4M3 && (p->k_scales_batch_stride < 0 ||
                                           p->k_scales_head_stride < 0 ||
                                           p->v_scales_batch_stride < 0 ||
                                           p->v_scales_head_stride < 0))
        return FMHA_ERR_INVALID;
    if (p->head_dim < 1 || p->head_dim > FMHA_CPU_MAX_HEAD_DIM)
        return FMHA_ERR_UNSUPPORTED;
    if (p->window_left < -1 || p->window_right < -1 || !(p->softcap >= 0.0f) ||
        !isfinite(p->softcap))
        return FMHA_ERR_INVALID;
    if (p->num_splits < 1 || p->num_splits > FMHA_MAX_SPLITS || p->block_n < 1 ||
        p->block_n > FMHA_CPU_MAX_BLOCK_N)
        return FMHA_ERR_INVALID;
    if ((p->cu_seqlens_q && p->total_q < 0) || (p->cu_seqlens_k && p->total_k < 0))
        return FMHA_ERR_INVALID;
    /* Packed keys are their own key lengths: no cache to look up or append to. */
    if (p->cu_seqlens_k && (p->seqlens_k || p->block_table || p->k_new))
        return FMHA_ERR_INVALID;
    if (p->block_table && (p->page_size < 16 || p->page_size % 16 != 0 || p->num_pages < 0 ||
                           p->block_table_stride < 0))
        return FMHA_ERR_INVALID;
    int64_t rows = (p->cu_seqlens_q ? p->total_q : p->batch * p->seqlen_q) * p->heads_q;
    if (rows > 0 && (!p->q || !p->out))
        return FMHA_ERR_INVALID;
    if (p->k_new && (!p->v_new || !p->seqlens_k))
        return FMHA_ERR_INVALID;
    int needs_kv = p->cu_seqlens_k ? p->total_k > 0
                   : p->block_table ? p->num_pages > 0
                   : p->seqlen_k > 0 && p->batch > 0;
    if (needs_kv && (!p->k || !p->v))
        return FMHA_ERR_INVALID;
    return FMHA_OK;
}

/* KV append: k_new/v_new row t of sequence b goes to key position seqlens_k[b] + t
 * (through the block table when paged), for the sequences that are not bad; a row
 * whose page is out of range is not written. */
static void append_kv(const fmha_fwd_params *p, const seq_geom *seqs)
{
    const int kv_fp8 = fmha_kv_dtype(p) == FMHA_DTYPE_E4M3;
    size_t es = dtype_size(p->dtype);
    size_t row_bytes = (size_t)p->head_dim * es;
    unsigned char *k = (unsigned char *)(uintptr_t)p->k;
    unsigned char *v = (unsigned char *)(uintptr_t)p->v;
    const unsigned char *kn = (const unsigned char *)p->k_new;
    const unsigned char *vn = (const unsigned char *)p->v_new;
    for (int64_t b = 0; b < p->batch; b++) {
        const seq_geom *g = &seqs[b];
        if (g->bad)
            continue;
        for (int64_t t = 0; t < g->new_len; t++) {
            int64_t pos = p->seqlens_k[b] + t;
            int64_t kd, vd;
            if (p->block_table) {
                int64_t page = p->block_table[b * p->block_table_stride + pos / p->page_size];
                if (!page_valid(p, page))
                    continue;
                kd = page * p->k_batch_stride + (pos % p->page_size) * p->k_row_stride;
                vd = page * p->v_batch_stride + (pos % p->page_size) * p->v_row_stride;
            } else {
                kd = b * p->k_batch_stride + pos * p->k_row_stride;
                vd = b * p->v_batch_stride + pos * p->v_row_stride;
            }
            int64_t ks = qrow_off(p, g, b, t, p->knew_batch_stride, p->knew_row_stride);
            int64_t vs = qrow_off(p, g, b, t, p->vnew_batch_stride, p->vnew_row_stride);
            for (int64_t h = 0; kv_fp8 && h < p->heads_kv; h++) {
                /* Quantize on write (fmha.h): x / factor, rounded to e4m3fn. */
                float kf = kv_factor(p->k_scale, p->k_scales, p->k_scales_batch_stride,
                                     p->k_scales_head_stride, b, h);
                float vf = kv_factor(p->v_scale, p->v_scales, p->v_scales_batch_stride,
                                     p->v_scales_head_stride, b, h);
                int64_t ko = kd + h * p->k_head_stride, vo = vd + h * p->v_head_stride;
                int64_t kso = ks + h * p->knew_head_stride, vso = vs + h * p->vnew_head_stride;
                for (int64_t d = 0; d < p->head_dim; d++) {
                    k[ko + d] = f32_to_e4m3(load_elem(kn, kso + d, p->dtype) / kf);
                    v[vo + d] = f32_to_e4m3(load_elem(vn, vso + d, p->dtype) / vf);
                }
            }
            for (int64_t h = 0; !kv_fp8 && h < p->heads_kv; h++) {
                memcpy(k + (size_t)(kd + h * p->k_head_stride) * es,
                       kn + (size_t)(ks + h * p->knew_head_stride) * es, row_bytes);
                memcpy(v + (size_t)(vd + h * p->v_head_stride) * es,
                       vn + (size_t)(vs + h * p->vnew_head_stride) * es, row_bytes);
            }
        }
    }
}

/* a * b * ... into *out, or 0 when the product overflows size_t. */
static int checked_mul(size_t *out, const int64_t *factors, int n)
{
    size_t acc = 1;
    for (int i = 0; i < n; i++) {
        size_t f = (size_t)factors[i];
        if (f != 0 && acc > SIZE_MAX / f)
            return 0;
        acc *= f;
    }
    *out = acc;
    return 1;
}

/* Everything fmha_cpu_fwd allocates, freed in one place. */
typedef struct fwd_alloc {
    seq_geom *seqs;
    float *o_accum, *lse_accum;
    combine_seq *cseqs;
    void *ws;
} fwd_alloc;

static fmha_status fwd_free(fwd_alloc *a, fmha_status st)
{
    free(a->seqs);
    free(a->o_accum);
    free(a->lse_accum);
    free(a->cseqs);
    free(a->ws);
    return st;
}

fmha_status fmha_cpu_fwd(fmha_fwd_params *p)
{
    fmha_status st = validate(p);
    if (st != FMHA_OK)
        return st;
    if (p->batch == 0)
        return FMHA_OK;
    fwd_alloc own;
    memset(&own, 0, sizeof own);
    own.seqs = (seq_geom *)malloc((size_t)p->batch * sizeof *own.seqs);
    if (!own.seqs)
        return FMHA_ERR_NOMEM;
    build_geometry(p, own.seqs);
    if (p->k_new && p->heads_kv > 0)
        append_kv(p, own.seqs);

    fwd_job job;
    memset(&job, 0, sizeof job);
    job.p = p;
    job.seqs = own.seqs;
    job.kern = kernels_for(p);
    job.group = p->heads_q / p->heads_kv;
    /* Rows are independent, so packing a kv head's query heads into one tile is free to choose. */
    job.pack = job.group > 1 ? job.group : 1;
    job.units = job.pack > 1 ? p->heads_kv : p->heads_q;
    job.splits = p->num_splits;
    /* Rows of whole cache lines plus one, so a column walk spreads over the L1 sets. */
    job.kv_ld = ceil_div(p->head_dim, FMHA_CPU_LINE_FLOATS) * FMHA_CPU_LINE_FLOATS +
                FMHA_CPU_LINE_FLOATS;
    job.k_ld = !job.kern->pairs ? job.kv_ld
                                : ceil_div((p->head_dim + 1) / 2, FMHA_CPU_LINE_FLOATS) *
                                          FMHA_CPU_LINE_FLOATS + FMHA_CPU_LINE_FLOATS;
    job.win_right = fmha_window_right(p);
    job.softcap_log2 = (float)((double)p->softcap * 1.4426950408889634);

    int64_t tr = job.kern->tile_rows;
    int64_t unit_tiles = 0, sum_tiles = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t t = ceil_div(own.seqs[b].len_q * job.pack, tr);
        unit_tiles = max64(unit_tiles, t);
        sum_tiles += t;
    }
    int64_t all_tiles = job.units * sum_tiles * job.splits;
    if (all_tiles == 0)
        return fwd_free(&own, FMHA_OK);
    int workers = fmha_pool_workers(p->num_threads, all_tiles);
    job.chunk_tiles = all_tiles / ((int64_t)workers * FMHA_CPU_ITEMS_PER_WORKER);
    int64_t tile_bytes = 2 * p->head_dim * tr * (int64_t)sizeof(float); /* its Q and O */
    int64_t max_tiles = min64(FMHA_CPU_MAX_CHUNK_TILES, FMHA_CPU_CHUNK_BYTES / tile_bytes);
    job.chunk_tiles = max64(1, min64(job.chunk_tiles, min64(max_tiles, unit_tiles)));
    job.chunks = ceil_div(unit_tiles, job.chunk_tiles);
    int64_t items = p->batch * job.units * job.chunks * job.splits;
    workers = fmha_pool_workers(p->num_threads, items);

    /* Split partials: [splits, batch, seqlen_q, ...], or [splits, 1, total_q, ...] packed. */
    job.acc_rows = p->cu_seqlens_q ? p->total_q : p->batch * p->seqlen_q;
    job.lacc_head_stride = p->cu_seqlens_q ? p->total_q : p->seqlen_q;
    fmha_combine_params c;
    memset(&c, 0, sizeof c);
    if (job.splits > 1) {
        size_t o_count, lse_count;
        int64_t of[4] = {job.splits, job.acc_rows, p->heads_q, p->head_dim};
        int64_t lf[3] = {job.splits, job.acc_rows, p->heads_q};
        if (!checked_mul(&o_count, of, 4) || !checked_mul(&lse_count, lf, 3) ||
            o_count > SIZE_MAX / sizeof(float))
            return fwd_free(&own, FMHA_ERR_NOMEM);
        job.o_accum = p->o_accum;
        job.lse_accum = p->lse_accum;
        if (!job.o_accum)
            job.o_accum = own.o_accum = (float *)malloc(o_count * sizeof(float));
        if (!job.lse_accum)
            job.lse_accum = own.lse_accum = (float *)malloc(lse_count * sizeof(float));
        if (!job.o_accum || !job.lse_accum)
            return fwd_free(&own, FMHA_ERR_NOMEM);

        c.num_splits = job.splits;
        c.batch = p->batch;
        c.seqlen_q = p->seqlen_q;
        c.heads = p->heads_q;
        c.head_dim = p->head_dim;
        c.in_dtype = FMHA_DTYPE_F32;
        c.out_dtype = p->out_dtype;
        c.o_partial = job.o_accum;
        c.op_head_stride = p->head_dim;
        c.op_row_stride = p->heads_q * c.op_head_stride;
        c.op_batch_stride = p->seqlen_q * c.op_row_stride;
        c.op_split_stride = job.acc_rows * c.op_row_stride;
        c.lse_partial = job.lse_accum;
        c.lp_row_stride = 1;
        c.lp_head_stride = job.lacc_head_stride;
        c.lp_batch_stride = p->heads_q * p->seqlen_q;
        c.lp_split_stride = p->heads_q * job.acc_rows;
        c.out = p->out;
        c.o_batch_stride = p->o_batch_stride;
        c.o_row_stride = p->o_row_stride;
        c.o_head_stride = p->o_head_stride;
        c.lse = p->lse;
        c.lse_batch_stride = p->lse_batch_stride;
        c.lse_head_stride = p->lse_head_stride;
        c.lse_row_stride = p->lse_row_stride;
        c.cu_seqlens_q = p->cu_seqlens_q;
        c.total_q = p->total_q;
        c.sinks = p->sinks; /* the partials hold no sink: it is folded in after the merge */
        c.num_threads = p->num_threads;
        /* Sized before the producers run, so running out of memory leaves no half result. */
        int64_t citems;
        if (c.cu_seqlens_q && !(own.cseqs = combine_seqs(&c, &citems)))
            return fwd_free(&own, FMHA_ERR_NOMEM);
    }

    job.ws_bytes = scratch_layout(&job, NULL, NULL);
    if (posix_memalign(&own.ws, FMHA_CPU_ALIGN, job.ws_bytes * (size_t)workers) != 0) {
        own.ws = NULL;
        return fwd_free(&own, FMHA_ERR_NOMEM);
    }
    job.ws = (unsigned char *)own.ws;
    fmha_pool_run(items, workers, fwd_item, &job);
    if (job.splits > 1)
        combine_run(&c, own.cseqs);
    return fwd_free(&own, FMHA_OK);
}
