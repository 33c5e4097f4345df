/*
 * cpu_simd.h: the CPU backend's inner kernels, written once and instantiated
 * per instruction set.
 *
 * Owns the vector primitives of each ISA (AVX-512 with and without BF16 dot
 * products, AVX2+FMA, and a portable "scalar" vector of plain floats), the fast
 * exp2, and the kernels the tile loop in cpu_fwd.c calls through an
 * fmha_cpu_kernels table:
 *   gemm             C^T += A^T * B: the score (S = Q K^T) and P V products
 *   mask             causal / window mask of a score tile
 *   softmax          one online-softmax step over a score tile
 *   softcap          c * tanh(s / c) over a score tile (logit softcapping)
 *   load_q, store_o  a tile's rows into and out of the lanes (8 x 8 transposes)
 *   widen            rows of any dtype to fp32 (K/V blocks, query rows)
 *   pack_q, pack_k   bf16 Q into the lanes and K rows, as bf16 pairs (pair level)
 *   gemm_pairs       S = Q K^T on bf16 pairs (pair level)
 *
 * Layout: a tile keeps its query rows in the vector lanes.  Q, the scores and
 * the O accumulator are stored transposed, [feature or key][tile row], so the
 * row max, row sum and rescale of the online softmax are plain vertical vector
 * operations and the two products are rank-1 updates with one broadcast
 * element of K or V per FMA group: no transpose of K or V, no horizontal sums,
 * and no padding of head_dim or of the key count (a tail block of columns gets
 * its own register-blocked instantiation).  Every lane's arithmetic is
 * the same sequence whatever the other lanes hold, which keeps a row's result
 * independent of the other rows.
 *
 * The pair level (FMHA_ISA_AVX512BF16) runs S = Q K^T of bf16 Q/K/V on AVX-512
 * BF16 dot products (vdpbf16ps; lane i: c += a.lo * b.lo + a.hi * b.hi on 32-bit
 * words holding two bf16).  It is the same product with other operands: Q is
 * kept as bf16 pairs of features, [(head_dim + 1) / 2][tile_row] (pack_q), and
 * the broadcast is one (d, d+1) word straight from a bf16 K row (pack_k copies
 * the rows, no widening), so every lane's arithmetic is still its own.  An odd
 * head_dim gets a zero partner in both (inside the scratch buffers; the
 * caller's rows are never read past their end).  Numerics, against the fp32
 * levels (which widen bf16 exactly and scale Q first):
 *   - every bf16 x bf16 product is exact in fp32, and vdpbf16ps rounds each of
 *     its two adds to nearest even, as an FMA chain does, so S is the fp32
 *     chain over d of the exact products, then multiplied once by the scale
 *     (gemm_pairs' scale argument): against the fp32 levels' chain of
 *     fl(q * scale) * k, the per-term rounding of q * scale (relative 2^-24
 *     each) becomes one rounding of the sum; none is added (rounding Q * scale
 *     to bf16 instead would cost a relative 2^-9 per term);
 *   - unlike an FMA it reads bf16 subnormal inputs (|x| < 2^-126) as 0 and
 *     flushes a subnormal sum to 0: changes below 2^-126 absolute, far under
 *     a score's own rounding.
 * P V stays the fp32 product of the other levels (V widened exactly, P not
 * rounded): rounding P to bf16 would cost a relative 2^-9 per weight, and a
 * float32 out (and the split partials) must meet the fp32 bound, so the
 * output's error stays that of the fp32 levels, inside the bf16 rounding.
 *
 * The first part (guarded) declares the table; the second part is a template
 * that cpu_fwd.c includes once per ISA with FMHA_ISA defined, which is why it
 * sits outside the guard.  Functions carry __attribute__((target(...))) so the
 * file is compiled without -mavx2 / -march flags and chosen at run time.
 */
#ifndef FMHA_CPU_SIMD_H
#define FMHA_CPU_SIMD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fmha.h"

#define FMHA_ISA_SCALAR 0
#define FMHA_ISA_AVX2 1
#define FMHA_ISA_AVX512 2
/* AVX-512 plus BF16 dot products: the pair path for bf16 Q/K/V (the fp32 kernels otherwise). */
#define FMHA_ISA_AVX512BF16 3

/* Row vectors per tile: a tile has FMHA_CPU_ROW_VECS * lanes query rows. */
#define FMHA_CPU_ROW_VECS 2
/* Lanes of the portable vector (its arrays auto-vectorise to whatever the target has). */
#define FMHA_CPU_SCALAR_LANES 8

/*
 * Cephes' minimax polynomial for 2^f - 1 = f * P(f) on f in [-1/2, 1/2]
 * (relative error about 1.7e-7), highest degree first.
 */
#define FMHA_EXP2_C5 1.535336188319500e-4f
#define FMHA_EXP2_C4 1.339887440266574e-3f
#define FMHA_EXP2_C3 9.618437357674640e-3f
#define FMHA_EXP2_C2 5.550332471162809e-2f
#define FMHA_EXP2_C1 2.402264791363012e-1f
#define FMHA_EXP2_C0 6.931472028550421e-1f
/*
 * exp2 clamps its argument to [LO, HI]: 2^-127 has a zero exponent field, so
 * every x <= -127 (and -inf) gives exactly 0, and 2^128 is +inf.
 */
#define FMHA_EXP2_LO (-127.0f)
#define FMHA_EXP2_HI 128.0f
#define FMHA_F32_EXP_BIAS 127
#define FMHA_F32_MANT_BITS 23
/*
 * Adding, then subtracting, 1.5 * 2^23 rounds a float below 2^22 in magnitude
 * to an integer (ties to even).
 */
#define FMHA_ROUND_MAGIC 12582912.0f
/* bf16 is the top half of an fp32. */
#define FMHA_BF16_SHIFT 16

/*
 * One ISA's kernels.  tile_rows = FMHA_CPU_ROW_VECS * lanes; every tile array
 * below is [something][tile_rows] floats, 32-byte aligned rows not required.
 */
typedef struct fmha_cpu_kernels {
    const char *name;
    int lanes;
    int tile_rows;
    /*
     * c[j][:] = (alpha ? c[j][:] * alpha[:] : 0) + sum_t a[t][:] * b[j*b_col + t*b_depth]
     * for j < cols, t < depth (t ascending: one fused multiply-add chain per element).
     */
    void (*gemm)(const float *a, int64_t depth, const float *b, int64_t b_col, int64_t b_depth,
                 int64_t cols, float *c, const float *alpha);
    /* s[n][r] = -inf where n < first[r] or n > limit[r], for n < keys (both relative to
     * the block's first key: a window's start and the last visible key). */
    void (*mask)(float *s, int64_t keys, const float *first, const float *limit);
    /*
     * Online-softmax step over s[n][:] (n < keys, scores already in the log2
     * domain): m = max(m, max_n s), s = exp2(s - m), l = l * alpha + sum_n s,
     * alpha = exp2(m_old - m).  A row whose max is -inf shifts by 0 instead.
     */
    void (*softmax)(float *s, int64_t keys, float *m, float *l, float *alpha);
    /* s[e] = c * tanh(s[e] / c) for e < count (a multiple of lanes); NaN stays NaN. */
    void (*softcap)(float *s, int64_t count, float c);
    /* qt[d][r] = rows[r][d] * scale for r < tile_rows, d < depth (Q into lanes). */
    void (*load_q)(float *qt, const float *rows, int64_t depth, float scale);
    /*
     * rows[r][d] = ot[d][r] / l[r] for r < tile_rows, d < depth, or 0 where
     * l[r] == 0 (a row that saw no key); a NaN l keeps the row NaN.
     */
    void (*store_o)(float *rows, const float *ot, int64_t depth, const float *l);
    /* dst[i][:cols] = fp32(src[i * src_stride][:cols]) for i < rows (any dtype, float8
     * e4m3fn codes included: src_stride then counts bytes). */
    void (*widen)(float *dst, int64_t dst_stride, const void *src, int64_t rows,
                  int64_t src_stride, int64_t cols, fmha_dtype dtype);
    /*
     * The pair level only (pairs == 1; 0 / NULL elsewhere).  A word holds two bf16, the
     * lower index in its low half; "0" pads an odd count.
     */
    int pairs;
    /* The table for the problems the pair level does not take (any input not bf16). */
    const struct fmha_cpu_kernels *fp32;
    /* qp[p][r] = (rows[r][2p], rows[r][2p+1] or 0) as bf16, rows holding bf16 values. */
    void (*pack_q)(uint32_t *qp, const float *rows, int64_t depth);
    /* dst[n][p] = (src[n][2p], src[n][2p+1] or 0) for n < rows, p < (cols + 1) / 2:
     * bf16 K rows (strides in elements of src, words of dst). */
    void (*pack_k)(uint32_t *dst, int64_t dst_stride, const uint16_t *src, int64_t rows,
                   int64_t src_stride, int64_t cols);
    /*
     * gemm over words: c[j][:] = scale * sum_t dot2(a[t][:], b[j*b_col + t*b_depth]) for
     * j < cols, t < depth (strides and depth in words; t ascending, each step one
     * vdpbf16ps: the low product added, then the high one, each add rounded; one
     * multiply by scale at the end).
     */
    void (*gemm_pairs)(const uint32_t *a, int64_t depth, const uint32_t *b, int64_t b_col,
                       int64_t b_depth, int64_t cols, float *c, float scale);
} fmha_cpu_kernels;

#define FMHA_F32_INF_BITS 0x7f800000u

/* Exact scalar conversions, shared by every ISA's tails. */
static inline float fmha_bits_to_f32(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t fmha_f32_to_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/*
 * float8 e4m3fn (fmha.h) to fp32, exactly.  A normal code (exponent field e >= 1) is
 * 2^(e-7) (1 + m/8): its 7 magnitude bits, rebiased by 127 - 7 in the exponent, are the
 * top of an fp32.  A subnormal one (e = 0) is m * 2^-9, an fp32 normal, computed as
 * such (no fp32 subnormal is formed, so flush-to-zero modes cannot change it).
 */
#define FMHA_E4M3_SIGN 0x80u
#define FMHA_E4M3_NAN 0x7fu
#define FMHA_E4M3_MIN_NORMAL 0x08u
#define FMHA_E4M3_REBIAS ((uint32_t)(127 - 7) << 3)
#define FMHA_E4M3_SHIFT 20
#define FMHA_E4M3_SUBNORMAL_UNIT 0.001953125f /* 2^-9 */
static inline float fmha_e4m3_to_f32(uint8_t x)
{
    uint32_t mag = x & ~FMHA_E4M3_SIGN & 0xffu;
    float v;
    if (mag == FMHA_E4M3_NAN)
        v = NAN;
    else if (mag < FMHA_E4M3_MIN_NORMAL)
        v = (float)mag * FMHA_E4M3_SUBNORMAL_UNIT;
    else
        v = fmha_bits_to_f32((mag + FMHA_E4M3_REBIAS) << FMHA_E4M3_SHIFT);
    return (x & FMHA_E4M3_SIGN) ? -v : v;
}

static inline float fmha_bf16_to_f32(uint16_t h)
{
    return fmha_bits_to_f32((uint32_t)h << FMHA_BF16_SHIFT);
}

/* f16 field layout. */
#define FMHA_F16_SIGN 0x8000u
#define FMHA_F16_EXP_MASK 0x1fu
#define FMHA_F16_MANT_BITS 10
#define FMHA_F16_MANT_MASK 0x3ffu
#define FMHA_F16_EXP_BIAS 15
/* The value of one f16 subnormal step, 2^-24. */
#define FMHA_F16_SUBNORMAL_UNIT 5.9604644775390625e-8f

static inline float fmha_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & FMHA_F16_SIGN) << FMHA_BF16_SHIFT;
    uint32_t exp = ((uint32_t)h >> FMHA_F16_MANT_BITS) & FMHA_F16_EXP_MASK;
    uint32_t mant = h & FMHA_F16_MANT_MASK;
    if (exp == 0) {
        float mag = (float)mant * FMHA_F16_SUBNORMAL_UNIT;
        return sign ? -mag : mag;
    }
    uint32_t shift = FMHA_F32_MANT_BITS - FMHA_F16_MANT_BITS;
    if (exp == FMHA_F16_EXP_MASK)
        return fmha_bits_to_f32(sign | FMHA_F32_INF_BITS | (mant << shift));
    return fmha_bits_to_f32(sign | ((exp + FMHA_F32_EXP_BIAS - FMHA_F16_EXP_BIAS)
                                    << FMHA_F32_MANT_BITS) | (mant << shift));
}

/* The portable exp2 of one lane; the vector ones do the same steps lane-wise. */
static inline float fmha_exp2_lane(float x)
{
    if (x != x)
        return x;
    x = x < FMHA_EXP2_LO ? FMHA_EXP2_LO : x;
    x = x > FMHA_EXP2_HI ? FMHA_EXP2_HI : x;
    float n = (x + FMHA_ROUND_MAGIC) - FMHA_ROUND_MAGIC;
    float f = x - n;
    float poly = FMHA_EXP2_C5;
    poly = poly * f + FMHA_EXP2_C4;
    poly = poly * f + FMHA_EXP2_C3;
    poly = poly * f + FMHA_EXP2_C2;
    poly = poly * f + FMHA_EXP2_C1;
    poly = poly * f + FMHA_EXP2_C0;
    poly = poly * f + 1.0f;
    uint32_t scale = (uint32_t)((int32_t)n + FMHA_F32_EXP_BIAS) << FMHA_F32_MANT_BITS;
    return poly * fmha_bits_to_f32(scale);
}

/*
 * tanh(y) = y - y^3/3 + 2y^5/15 - 17y^7/315 + ... (Taylor, alternating), used for
 * |y| <= FMHA_TANH_SERIES_MAX, where the terms below truncate at a relative 1e-8;
 * above it tanh|y| = (1 - e) / (1 + e) with e = 2^(-2|y| log2(e)) <= e^-1 has no
 * cancellation.  Coefficients of y^3 .. y^15, lowest first.
 */
#define FMHA_TANH_SERIES_MAX 0.5f
#define FMHA_TANH_T3 (-3.33333333333333333e-1f)
#define FMHA_TANH_T5 1.33333333333333333e-1f
#define FMHA_TANH_T7 (-5.39682539682539683e-2f)
#define FMHA_TANH_T9 2.18694885361552028e-2f
#define FMHA_TANH_T11 (-8.86323552990219657e-3f)
#define FMHA_TANH_T13 3.59212803657248102e-3f
#define FMHA_TANH_T15 (-1.45583438705131827e-3f)
#define FMHA_LOG2E_F 1.44269504088896341f

/* A row's output element: O / l, and 0 for a row that saw no key (l == 0). */
static inline float fmha_normalize_lane(float o, float l) { return l == 0.0f ? 0.0f : o / l; }

/* Rows per transpose block of load_q / store_o. */
#define FMHA_CPU_TRANSPOSE 8

#endif /* FMHA_CPU_SIMD_H */

/* ======================= per-ISA template ======================= */
#ifdef FMHA_ISA

#if FMHA_ISA == FMHA_ISA_AVX512 || FMHA_ISA == FMHA_ISA_AVX512BF16
#include <immintrin.h>
#if FMHA_ISA == FMHA_ISA_AVX512BF16
#define FMHA_SFX(name) name##_avx512bf16
#define FMHA_TARGET __attribute__((target("avx512bf16,avx512bw,avx512f,avx2,fma,f16c")))
#else
#define FMHA_SFX(name) name##_avx512
#define FMHA_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))
#endif
#define FMHA_LANES 16
/* 32 vector registers: 2 x 12 accumulators plus operands. */
#define FMHA_GEMM_COLS 12
typedef __m512 fmha_vec_avx512;
#define FMHA_VEC fmha_vec_avx512
#define FMHA_V_LOAD(p) _mm512_loadu_ps(p)
#define FMHA_V_STORE(p, x) _mm512_storeu_ps((p), (x))
#define FMHA_V_SET1(x) _mm512_set1_ps(x)
#define FMHA_V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define FMHA_V_MUL(a, b) _mm512_mul_ps((a), (b))
#define FMHA_V_ADD(a, b) _mm512_add_ps((a), (b))
#define FMHA_V_SUB(a, b) _mm512_sub_ps((a), (b))
#define FMHA_V_DIV(a, b) _mm512_div_ps((a), (b))
/* max/min return the second operand when either is NaN (as the SSE family does). */
#define FMHA_V_MAX(a, b) _mm512_max_ps((a), (b))
#define FMHA_V_MIN(a, b) _mm512_min_ps((a), (b))
#define FMHA_V_SELECT_GT(x, y, a, b) \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask((x), (y), _CMP_GT_OQ), (a), (b))
#define FMHA_V_SELECT_EQ(x, y, a, b) \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask((x), (y), _CMP_EQ_OQ), (a), (b))

FMHA_TARGET static inline FMHA_VEC FMHA_SFX(fmha_v_exp2_bits)(FMHA_VEC n)
{
    __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(FMHA_F32_EXP_BIAS));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, FMHA_F32_MANT_BITS));
}
#define FMHA_V_ROUND(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

FMHA_TARGET static inline void FMHA_SFX(fmha_widen_row)(float *dst, const uint16_t *src,
                                                        int64_t cols, fmha_dtype dtype)
{
    int64_t d = 0;
    for (; d + FMHA_LANES <= cols; d += FMHA_LANES) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + d));
        __m512 f = dtype == FMHA_DTYPE_F16
                       ? _mm512_cvtph_ps(h)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h),
                                                               FMHA_BF16_SHIFT));
        _mm512_storeu_ps(dst + d, f);
    }
    for (; d < cols; d++)
        dst[d] = dtype == FMHA_DTYPE_F16 ? fmha_f16_to_f32(src[d]) : fmha_bf16_to_f32(src[d]);
}

#elif FMHA_ISA == FMHA_ISA_AVX2
#include <immintrin.h>
#define FMHA_SFX(name) name##_avx2
#define FMHA_TARGET __attribute__((target("avx2,fma,f16c")))
#define FMHA_LANES 8
/* 16 vector registers: 2 x 4 accumulators, two A vectors and a broadcast, no spills. */
#define FMHA_GEMM_COLS 4
typedef __m256 fmha_vec_avx2;
#define FMHA_VEC fmha_vec_avx2
#define FMHA_V_LOAD(p) _mm256_loadu_ps(p)
#define FMHA_V_STORE(p, x) _mm256_storeu_ps((p), (x))
#define FMHA_V_SET1(x) _mm256_set1_ps(x)
#define FMHA_V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define FMHA_V_MUL(a, b) _mm256_mul_ps((a), (b))
#define FMHA_V_ADD(a, b) _mm256_add_ps((a), (b))
#define FMHA_V_SUB(a, b) _mm256_sub_ps((a), (b))
#define FMHA_V_DIV(a, b) _mm256_div_ps((a), (b))
#define FMHA_V_MAX(a, b) _mm256_max_ps((a), (b))
#define FMHA_V_MIN(a, b) _mm256_min_ps((a), (b))
#define FMHA_V_SELECT_GT(x, y, a, b) _mm256_blendv_ps((a), (b), _mm256_cmp_ps((x), (y), _CMP_GT_OQ))
#define FMHA_V_SELECT_EQ(x, y, a, b) _mm256_blendv_ps((a), (b), _mm256_cmp_ps((x), (y), _CMP_EQ_OQ))

FMHA_TARGET static inline FMHA_VEC FMHA_SFX(fmha_v_exp2_bits)(FMHA_VEC n)
{
    __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(FMHA_F32_EXP_BIAS));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, FMHA_F32_MANT_BITS));
}
#define FMHA_V_ROUND(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

FMHA_TARGET static inline void FMHA_SFX(fmha_widen_row)(float *dst, const uint16_t *src,
                                                        int64_t cols, fmha_dtype dtype)
{
    int64_t d = 0;
    for (; d + FMHA_LANES <= cols; d += FMHA_LANES) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + d));
        __m256 f = dtype == FMHA_DTYPE_F16
                       ? _mm256_cvtph_ps(h)
                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h),
                                                               FMHA_BF16_SHIFT));
        _mm256_storeu_ps(dst + d, f);
    }
    for (; d < cols; d++)
        dst[d] = dtype == FMHA_DTYPE_F16 ? fmha_f16_to_f32(src[d]) : fmha_bf16_to_f32(src[d]);
}

#elif FMHA_ISA == FMHA_ISA_SCALAR
#define FMHA_SFX(name) name##_scalar
#define FMHA_TARGET
#define FMHA_LANES FMHA_CPU_SCALAR_LANES
#define FMHA_GEMM_COLS 4
typedef struct fmha_vec_scalar {
    float x[FMHA_LANES];
} fmha_vec_scalar;
#define FMHA_VEC fmha_vec_scalar

static inline FMHA_VEC fmha_vs_load(const float *p)
{
    FMHA_VEC v;
    memcpy(v.x, p, sizeof v.x);
    return v;
}
static inline void fmha_vs_store(float *p, FMHA_VEC v) { memcpy(p, v.x, sizeof v.x); }
static inline FMHA_VEC fmha_vs_set1(float s)
{
    FMHA_VEC v;
    for (int i = 0; i < FMHA_LANES; i++)
        v.x[i] = s;
    return v;
}
/* Not fused: without a hardware FMA, fmaf would be a slow library call. */
static inline FMHA_VEC fmha_vs_fma(FMHA_VEC a, FMHA_VEC b, FMHA_VEC c)
{
    for (int i = 0; i < FMHA_LANES; i++)
        c.x[i] += a.x[i] * b.x[i];
    return c;
}
static inline FMHA_VEC fmha_vs_mul(FMHA_VEC a, FMHA_VEC b)
{
    for (int i = 0; i < FMHA_LANES; i++)
        a.x[i] *= b.x[i];
    return a;
}
static inline FMHA_VEC fmha_vs_add(FMHA_VEC a, FMHA_VEC b)
{
    for (int i = 0; i < FMHA_LANES; i++)
        a.x[i] += b.x[i];
    return a;
}
static inline FMHA_VEC fmha_vs_sub(FMHA_VEC a, FMHA_VEC b)
{
    for (int i = 0; i < FMHA_LANES; i++)
        a.x[i] -= b.x[i];
    return a;
}
static inline FMHA_VEC fmha_vs_div(FMHA_VEC a, FMHA_VEC b)
{
    for (int i = 0; i < FMHA_LANES; i++)
        a.x[i] /= b.x[i];
    return a;
}
/* Same NaN rule as the SSE family: the second operand wins when either is NaN. */
static inline FMHA_VEC fmha_vs_max(FMHA_VEC a, FMHA_VEC b)
{
    for (int i = 0; i < FMHA_LANES; i++)
        a.x[i] = a.x[i] > b.x[i] ? a.x[i] : b.x[i];
    return a;
}
static inline FMHA_VEC fmha_vs_select_gt(FMHA_VEC x, FMHA_VEC y, FMHA_VEC a, FMHA_VEC b)
{
    for (int i = 0; i < FMHA_LANES; i++)
        a.x[i] = x.x[i] > y.x[i] ? b.x[i] : a.x[i];
    return a;
}
static inline FMHA_VEC fmha_vs_select_eq(FMHA_VEC x, FMHA_VEC y, FMHA_VEC a, FMHA_VEC b)
{
    for (int i = 0; i < FMHA_LANES; i++)
        a.x[i] = x.x[i] == y.x[i] ? b.x[i] : a.x[i];
    return a;
}
#define FMHA_V_LOAD(p) fmha_vs_load(p)
#define FMHA_V_STORE(p, x) fmha_vs_store((p), (x))
#define FMHA_V_SET1(x) fmha_vs_set1(x)
#define FMHA_V_FMA(a, b, c) fmha_vs_fma((a), (b), (c))
#define FMHA_V_MUL(a, b) fmha_vs_mul((a), (b))
#define FMHA_V_ADD(a, b) fmha_vs_add((a), (b))
#define FMHA_V_SUB(a, b) fmha_vs_sub((a), (b))
#define FMHA_V_DIV(a, b) fmha_vs_div((a), (b))
#define FMHA_V_MAX(a, b) fmha_vs_max((a), (b))
#define FMHA_V_SELECT_GT(x, y, a, b) fmha_vs_select_gt((x), (y), (a), (b))
#define FMHA_V_SELECT_EQ(x, y, a, b) fmha_vs_select_eq((x), (y), (a), (b))

static inline void fmha_widen_row_scalar(float *dst, const uint16_t *src, int64_t cols,
                                         fmha_dtype dtype)
{
    for (int64_t d = 0; d < cols; d++)
        dst[d] = dtype == FMHA_DTYPE_F16 ? fmha_f16_to_f32(src[d]) : fmha_bf16_to_f32(src[d]);
}

#else
#error "cpu_simd.h: unknown FMHA_ISA"
#endif

#define FMHA_TILE_ROWS (FMHA_CPU_ROW_VECS * FMHA_LANES)
#define FMHA_ALWAYS_INLINE __attribute__((always_inline)) inline

/* 2^x lane-wise, as fmha_exp2_lane: NaN stays NaN, x <= -127 gives exactly 0. */
#if FMHA_ISA == FMHA_ISA_SCALAR
static inline FMHA_VEC fmha_v_exp2_scalar(FMHA_VEC x)
{
    for (int i = 0; i < FMHA_LANES; i++)
        x.x[i] = fmha_exp2_lane(x.x[i]);
    return x;
}
#else
FMHA_TARGET static FMHA_ALWAYS_INLINE FMHA_VEC FMHA_SFX(fmha_v_exp2)(FMHA_VEC x)
{
    /* Clamp with x as the second operand so a NaN passes through. */
    x = FMHA_V_MAX(FMHA_V_SET1(FMHA_EXP2_LO), x);
    x = FMHA_V_MIN(FMHA_V_SET1(FMHA_EXP2_HI), x);
    FMHA_VEC n = FMHA_V_ROUND(x);
    FMHA_VEC f = FMHA_V_SUB(x, n);
    FMHA_VEC poly = FMHA_V_SET1(FMHA_EXP2_C5);
    poly = FMHA_V_FMA(poly, f, FMHA_V_SET1(FMHA_EXP2_C4));
    poly = FMHA_V_FMA(poly, f, FMHA_V_SET1(FMHA_EXP2_C3));
    poly = FMHA_V_FMA(poly, f, FMHA_V_SET1(FMHA_EXP2_C2));
    poly = FMHA_V_FMA(poly, f, FMHA_V_SET1(FMHA_EXP2_C1));
    poly = FMHA_V_FMA(poly, f, FMHA_V_SET1(FMHA_EXP2_C0));
    poly = FMHA_V_FMA(poly, f, FMHA_V_SET1(1.0f));
    return FMHA_V_MUL(poly, FMHA_SFX(fmha_v_exp2_bits)(n));
}
#endif

#if FMHA_ISA == FMHA_ISA_AVX512BF16
/* One word of bf16 data (read as bytes) in every lane. */
FMHA_TARGET static FMHA_ALWAYS_INLINE __m512bh FMHA_SFX(fmha_v_bcast_word)(const float *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return (__m512bh)_mm512_set1_epi32((int)w);
}
#endif

/*
 * The register-blocked product: `cols` (a compile-time constant after
 * inlining, <= FMHA_GEMM_COLS) output columns by FMHA_CPU_ROW_VECS row
 * vectors, held in registers over the whole depth loop.  `pairs` (a constant
 * too, 1 only at the pair level) makes the elements words of two bf16, each
 * step a vdpbf16ps, and the result times scale (gemm_pairs); a and b then hold
 * bf16 data, moved as bits only.
 */
FMHA_TARGET static FMHA_ALWAYS_INLINE void FMHA_SFX(fmha_gemm_micro)(
    const float *a, int64_t depth, const float *b, int64_t b_col, int64_t b_depth, float *c,
    const float *alpha, const int cols, const int pairs, float scale)
{
    FMHA_VEC acc[FMHA_GEMM_COLS][FMHA_CPU_ROW_VECS];
    if (alpha) {
#pragma GCC unroll 16
        for (int j = 0; j < cols; j++)
#pragma GCC unroll 4
            for (int r = 0; r < FMHA_CPU_ROW_VECS; r++)
                acc[j][r] = FMHA_V_MUL(FMHA_V_LOAD(c + j * FMHA_TILE_ROWS + r * FMHA_LANES),
                                       FMHA_V_LOAD(alpha + r * FMHA_LANES));
    } else {
#pragma GCC unroll 16
        for (int j = 0; j < cols; j++)
#pragma GCC unroll 4
            for (int r = 0; r < FMHA_CPU_ROW_VECS; r++)
                acc[j][r] = FMHA_V_SET1(0.0f);
    }
    const float *bp[FMHA_GEMM_COLS];
#pragma GCC unroll 16
    for (int j = 0; j < cols; j++)
        bp[j] = b + j * b_col;
    for (int64_t t = 0; t < depth; t++) {
        FMHA_VEC av[FMHA_CPU_ROW_VECS];
#pragma GCC unroll 4
        for (int r = 0; r < FMHA_CPU_ROW_VECS; r++)
            av[r] = FMHA_V_LOAD(a + t * FMHA_TILE_ROWS + r * FMHA_LANES);
#pragma GCC unroll 16
        for (int j = 0; j < cols; j++) {
#if FMHA_ISA == FMHA_ISA_AVX512BF16
            if (pairs) {
                __m512bh bw = FMHA_SFX(fmha_v_bcast_word)(bp[j] + t * b_depth);
#pragma GCC unroll 4
                for (int r = 0; r < FMHA_CPU_ROW_VECS; r++)
                    acc[j][r] = _mm512_dpbf16_ps(acc[j][r], (__m512bh)av[r], bw);
                continue;
            }
#endif
            FMHA_VEC bv = FMHA_V_SET1(bp[j][t * b_depth]);
#pragma GCC unroll 4
            for (int r = 0; r < FMHA_CPU_ROW_VECS; r++)
                acc[j][r] = FMHA_V_FMA(av[r], bv, acc[j][r]);
        }
    }
    if (pairs) {
        FMHA_VEC sv = FMHA_V_SET1(scale);
#pragma GCC unroll 16
        for (int j = 0; j < cols; j++)
#pragma GCC unroll 4
            for (int r = 0; r < FMHA_CPU_ROW_VECS; r++)
                acc[j][r] = FMHA_V_MUL(acc[j][r], sv);
    }
#pragma GCC unroll 16
    for (int j = 0; j < cols; j++)
#pragma GCC unroll 4
        for (int r = 0; r < FMHA_CPU_ROW_VECS; r++)
            FMHA_V_STORE(c + j * FMHA_TILE_ROWS + r * FMHA_LANES, acc[j][r]);
}

/* gemm (pairs 0) and gemm_pairs (pairs 1): whole register blocks, then the tail. */
FMHA_TARGET static FMHA_ALWAYS_INLINE void FMHA_SFX(fmha_gemm_cols)(
    const float *a, int64_t depth, const float *b, int64_t b_col, int64_t b_depth, int64_t cols,
    float *c, const float *alpha, const int pairs, float scale)
{
    int64_t j = 0;
    for (; j + FMHA_GEMM_COLS <= cols; j += FMHA_GEMM_COLS)
        FMHA_SFX(fmha_gemm_micro)(a, depth, b + j * b_col, b_col, b_depth,
                                  c + j * FMHA_TILE_ROWS, alpha, FMHA_GEMM_COLS, pairs, scale);
    float *ct = c + j * FMHA_TILE_ROWS;
    const float *bt = b + j * b_col;
    /* The tail: one instantiation per width, so it is register-blocked too. */
    switch (cols - j) {
#define FMHA_GEMM_TAIL(w)                                                             \
    case w:                                                                           \
        if (w < FMHA_GEMM_COLS)                                                       \
            FMHA_SFX(fmha_gemm_micro)(a, depth, bt, b_col, b_depth, ct, alpha,        \
                                      w < FMHA_GEMM_COLS ? w : 1, pairs, scale);      \
        break;
        FMHA_GEMM_TAIL(1)
        FMHA_GEMM_TAIL(2)
        FMHA_GEMM_TAIL(3)
        FMHA_GEMM_TAIL(4)
        FMHA_GEMM_TAIL(5)
        FMHA_GEMM_TAIL(6)
        FMHA_GEMM_TAIL(7)
        FMHA_GEMM_TAIL(8)
        FMHA_GEMM_TAIL(9)
        FMHA_GEMM_TAIL(10)
        FMHA_GEMM_TAIL(11)
#undef FMHA_GEMM_TAIL
    default:
        break;
    }
}

FMHA_TARGET static void FMHA_SFX(fmha_gemm)(const float *a, int64_t depth, const float *b,
                                            int64_t b_col, int64_t b_depth, int64_t cols,
                                            float *c, const float *alpha)
{
    FMHA_SFX(fmha_gemm_cols)(a, depth, b, b_col, b_depth, cols, c, alpha, 0, 1.0f);
}

#if FMHA_ISA == FMHA_ISA_AVX512BF16
/* The words travel as float bits: only vector loads (which may alias) and memcpy read them. */
FMHA_TARGET static void FMHA_SFX(fmha_gemm_pairs)(const uint32_t *a, int64_t depth,
                                                  const uint32_t *b, int64_t b_col,
                                                  int64_t b_depth, int64_t cols, float *c,
                                                  float scale)
{
    FMHA_SFX(fmha_gemm_cols)((const float *)(const void *)a, depth,
                             (const float *)(const void *)b, b_col, b_depth, cols, c, NULL, 1,
                             scale);
}
#endif

FMHA_TARGET static void FMHA_SFX(fmha_mask)(float *s, int64_t keys, const float *first,
                                            const float *limit)
{
    FMHA_VEC neg_inf = FMHA_V_SET1(-INFINITY);
    FMHA_VEC lim[FMHA_CPU_ROW_VECS], low[FMHA_CPU_ROW_VECS];
    for (int r = 0; r < FMHA_CPU_ROW_VECS; r++) {
        lim[r] = FMHA_V_LOAD(limit + r * FMHA_LANES);
        low[r] = FMHA_V_LOAD(first + r * FMHA_LANES);
    }
    for (int64_t n = 0; n < keys; n++) {
        FMHA_VEC key = FMHA_V_SET1((float)n);
        for (int r = 0; r < FMHA_CPU_ROW_VECS; r++) {
            float *sp = s + n * FMHA_TILE_ROWS + r * FMHA_LANES;
            FMHA_VEC x = FMHA_V_SELECT_GT(key, lim[r], FMHA_V_LOAD(sp), neg_inf);
            FMHA_V_STORE(sp, FMHA_V_SELECT_GT(low[r], key, x, neg_inf));
        }
    }
}

FMHA_TARGET static void FMHA_SFX(fmha_softmax)(float *s, int64_t keys, float *m, float *l,
                                               float *alpha)
{
    FMHA_VEC neg_inf = FMHA_V_SET1(-INFINITY);
    FMHA_VEC zero = FMHA_V_SET1(0.0f);
    for (int r = 0; r < FMHA_CPU_ROW_VECS; r++) {
        float *col = s + r * FMHA_LANES;
        FMHA_VEC m_old = FMHA_V_LOAD(m + r * FMHA_LANES);
        /* s as the first operand: a NaN score leaves the max alone (the NaN still reaches P). */
        FMHA_VEC m_new = m_old;
        for (int64_t n = 0; n < keys; n++)
            m_new = FMHA_V_MAX(FMHA_V_LOAD(col + n * FMHA_TILE_ROWS), m_new);
        /* No key seen yet: shift by 0 so -inf - -inf never happens. */
        FMHA_VEC shift = FMHA_V_SELECT_EQ(m_new, neg_inf, m_new, zero);
#if FMHA_ISA == FMHA_ISA_SCALAR
#define FMHA_V_EXP2(x) fmha_v_exp2_scalar(x)
#else
#define FMHA_V_EXP2(x) FMHA_SFX(fmha_v_exp2)(x)
#endif
        FMHA_VEC a = FMHA_V_EXP2(FMHA_V_SUB(m_old, shift));
        FMHA_VEC sum = zero;
        for (int64_t n = 0; n < keys; n++) {
            FMHA_VEC p = FMHA_V_EXP2(FMHA_V_SUB(FMHA_V_LOAD(col + n * FMHA_TILE_ROWS), shift));
            FMHA_V_STORE(col + n * FMHA_TILE_ROWS, p);
            sum = FMHA_V_ADD(sum, p);
        }
#undef FMHA_V_EXP2
        FMHA_V_STORE(m + r * FMHA_LANES, m_new);
        FMHA_VEC l_new = FMHA_V_ADD(FMHA_V_MUL(FMHA_V_LOAD(l + r * FMHA_LANES), a), sum);
        FMHA_V_STORE(l + r * FMHA_LANES, l_new);
        FMHA_V_STORE(alpha + r * FMHA_LANES, a);
    }
}

FMHA_TARGET static void FMHA_SFX(fmha_softcap)(float *s, int64_t count, float c)
{
#if FMHA_ISA == FMHA_ISA_SCALAR
#define FMHA_V_EXP2(x) fmha_v_exp2_scalar(x)
#else
#define FMHA_V_EXP2(x) FMHA_SFX(fmha_v_exp2)(x)
#endif
    const FMHA_VEC zero = FMHA_V_SET1(0.0f), one = FMHA_V_SET1(1.0f);
    const FMHA_VEC inv = FMHA_V_SET1(1.0f / c), cv = FMHA_V_SET1(c);
    const FMHA_VEC series_max = FMHA_V_SET1(FMHA_TANH_SERIES_MAX);
    const FMHA_VEC to_exp2 = FMHA_V_SET1(-2.0f * FMHA_LOG2E_F);
    for (int64_t e = 0; e < count; e += FMHA_LANES) {
        FMHA_VEC y = FMHA_V_MUL(FMHA_V_LOAD(s + e), inv);
        /* |y| with y second, so a NaN passes through */
        FMHA_VEC a = FMHA_V_MAX(FMHA_V_SUB(zero, y), y);
        FMHA_VEC y2 = FMHA_V_MUL(y, y);
        FMHA_VEC poly = FMHA_V_SET1(FMHA_TANH_T15);
        poly = FMHA_V_FMA(poly, y2, FMHA_V_SET1(FMHA_TANH_T13));
        poly = FMHA_V_FMA(poly, y2, FMHA_V_SET1(FMHA_TANH_T11));
        poly = FMHA_V_FMA(poly, y2, FMHA_V_SET1(FMHA_TANH_T9));
        poly = FMHA_V_FMA(poly, y2, FMHA_V_SET1(FMHA_TANH_T7));
        poly = FMHA_V_FMA(poly, y2, FMHA_V_SET1(FMHA_TANH_T5));
        poly = FMHA_V_FMA(poly, y2, FMHA_V_SET1(FMHA_TANH_T3));
        FMHA_VEC small = FMHA_V_FMA(FMHA_V_MUL(poly, y2), y, y);
        FMHA_VEC ex = FMHA_V_EXP2(FMHA_V_MUL(a, to_exp2));
        FMHA_VEC big = FMHA_V_DIV(FMHA_V_SUB(one, ex), FMHA_V_ADD(one, ex));
        big = FMHA_V_SELECT_GT(zero, y, big, FMHA_V_SUB(zero, big));
        FMHA_V_STORE(s + e, FMHA_V_MUL(cv, FMHA_V_SELECT_GT(a, series_max, small, big)));
    }
#undef FMHA_V_EXP2
}

#if FMHA_ISA != FMHA_ISA_SCALAR
/* In-register 8 x 8 transpose (AVX2 shuffles; the AVX-512 build has AVX2 as well). */
FMHA_TARGET static FMHA_ALWAYS_INLINE void FMHA_SFX(fmha_transpose8)(__m256 *r)
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    /* 0x20: low 128-bit halves of both sources, 0x31: high halves. */
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}
#endif

FMHA_TARGET static void FMHA_SFX(fmha_load_q)(float *qt, const float *rows, int64_t depth,
                                              float scale)
{
    int64_t d0 = 0;
#if FMHA_ISA != FMHA_ISA_SCALAR
    __m256 sv = _mm256_set1_ps(scale);
    for (; d0 + FMHA_CPU_TRANSPOSE <= depth; d0 += FMHA_CPU_TRANSPOSE) {
        for (int rb = 0; rb < FMHA_TILE_ROWS; rb += FMHA_CPU_TRANSPOSE) {
            __m256 v[FMHA_CPU_TRANSPOSE];
            for (int i = 0; i < FMHA_CPU_TRANSPOSE; i++)
                v[i] = _mm256_loadu_ps(rows + (rb + i) * depth + d0);
            FMHA_SFX(fmha_transpose8)(v);
            for (int i = 0; i < FMHA_CPU_TRANSPOSE; i++)
                _mm256_storeu_ps(qt + (d0 + i) * FMHA_TILE_ROWS + rb, _mm256_mul_ps(v[i], sv));
        }
    }
#endif
    for (; d0 < depth; d0++)
        for (int r = 0; r < FMHA_TILE_ROWS; r++)
            qt[d0 * FMHA_TILE_ROWS + r] = rows[r * depth + d0] * scale;
}

FMHA_TARGET static void FMHA_SFX(fmha_store_o)(float *rows, const float *ot, int64_t depth,
                                               const float *l)
{
    int64_t d0 = 0;
#if FMHA_ISA != FMHA_ISA_SCALAR
    __m256 zero = _mm256_setzero_ps();
    for (; d0 + FMHA_CPU_TRANSPOSE <= depth; d0 += FMHA_CPU_TRANSPOSE) {
        for (int rb = 0; rb < FMHA_TILE_ROWS; rb += FMHA_CPU_TRANSPOSE) {
            __m256 lv = _mm256_loadu_ps(l + rb);
            __m256 empty = _mm256_cmp_ps(lv, zero, _CMP_EQ_OQ);
            /* Divide by 1 where l == 0 (no 0/0), then write the 0 there: fmha_normalize_lane. */
            __m256 den = _mm256_blendv_ps(lv, _mm256_set1_ps(1.0f), empty);
            __m256 v[FMHA_CPU_TRANSPOSE];
            for (int i = 0; i < FMHA_CPU_TRANSPOSE; i++) {
                __m256 q = _mm256_div_ps(_mm256_loadu_ps(ot + (d0 + i) * FMHA_TILE_ROWS + rb), den);
                v[i] = _mm256_blendv_ps(q, zero, empty);
            }
            FMHA_SFX(fmha_transpose8)(v);
            for (int i = 0; i < FMHA_CPU_TRANSPOSE; i++)
                _mm256_storeu_ps(rows + (rb + i) * depth + d0, v[i]);
        }
    }
#endif
    for (; d0 < depth; d0++)
        for (int r = 0; r < FMHA_TILE_ROWS; r++)
            rows[r * depth + d0] = fmha_normalize_lane(ot[d0 * FMHA_TILE_ROWS + r], l[r]);
}

FMHA_TARGET static void FMHA_SFX(fmha_widen)(float *dst, int64_t dst_stride, const void *src,
                                             int64_t rows, int64_t src_stride, int64_t cols,
                                             fmha_dtype dtype)
{
    if (dtype == FMHA_DTYPE_F32) {
        const float *f = (const float *)src;
        for (int64_t i = 0; i < rows; i++)
            memcpy(dst + i * dst_stride, f + i * src_stride, (size_t)cols * sizeof(float));
        return;
    }
    if (dtype == FMHA_DTYPE_E4M3) {
        /* An fp8 KV cache: each code decoded exactly (its scale is applied by the caller). */
        const uint8_t *b = (const uint8_t *)src;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t d = 0; d < cols; d++)
                dst[i * dst_stride + d] = fmha_e4m3_to_f32(b[i * src_stride + d]);
        return;
    }
    const uint16_t *h = (const uint16_t *)src;
    for (int64_t i = 0; i < rows; i++)
        FMHA_SFX(fmha_widen_row)(dst + i * dst_stride, h + i * src_stride, cols, dtype);
}

#if FMHA_ISA == FMHA_ISA_AVX512BF16
/* Words are little-endian pairs: the low half is the element at the lower index. */
#define FMHA_BF16_HIGH_MASK 0xffff0000u

FMHA_TARGET static void FMHA_SFX(fmha_pack_q)(uint32_t *qp, const float *rows, int64_t depth)
{
    for (int64_t p = 0; 2 * p < depth; p++)
        for (int r = 0; r < FMHA_TILE_ROWS; r++) {
            const float *row = rows + r * depth;
            uint32_t lo = fmha_f32_to_bits(row[2 * p]) >> FMHA_BF16_SHIFT;
            uint32_t hi = 2 * p + 1 < depth
                              ? fmha_f32_to_bits(row[2 * p + 1]) & FMHA_BF16_HIGH_MASK
                              : 0u;
            qp[p * FMHA_TILE_ROWS + r] = lo | hi;
        }
}

FMHA_TARGET static void FMHA_SFX(fmha_pack_k)(uint32_t *dst, int64_t dst_stride,
                                              const uint16_t *src, int64_t rows,
                                              int64_t src_stride, int64_t cols)
{
    int64_t even = cols & ~(int64_t)1;
    for (int64_t i = 0; i < rows; i++) {
        memcpy(dst + i * dst_stride, src + i * src_stride, (size_t)even * sizeof(uint16_t));
        if (cols != even)
            dst[i * dst_stride + even / 2] = src[i * src_stride + even];
    }
}

#undef FMHA_BF16_HIGH_MASK
#endif

static const fmha_cpu_kernels FMHA_SFX(fmha_cpu_kernels) = {
#if FMHA_ISA == FMHA_ISA_AVX512BF16
    .name = "avx512bf16",
#elif FMHA_ISA == FMHA_ISA_AVX512
    .name = "avx512",
#elif FMHA_ISA == FMHA_ISA_AVX2
    .name = "avx2",
#else
    .name = "scalar",
#endif
    .lanes = FMHA_LANES,
    .tile_rows = FMHA_TILE_ROWS,
    .gemm = FMHA_SFX(fmha_gemm),
    .mask = FMHA_SFX(fmha_mask),
    .softmax = FMHA_SFX(fmha_softmax),
    .softcap = FMHA_SFX(fmha_softcap),
    .load_q = FMHA_SFX(fmha_load_q),
    .store_o = FMHA_SFX(fmha_store_o),
    .widen = FMHA_SFX(fmha_widen),
#if FMHA_ISA == FMHA_ISA_AVX512BF16
    .pairs = 1,
    .fp32 = &fmha_cpu_kernels_avx512,
    .pack_q = FMHA_SFX(fmha_pack_q),
    .pack_k = FMHA_SFX(fmha_pack_k),
    .gemm_pairs = FMHA_SFX(fmha_gemm_pairs),
#endif
};

#undef FMHA_SFX
#undef FMHA_TARGET
#undef FMHA_LANES
#undef FMHA_GEMM_COLS
#undef FMHA_TILE_ROWS
#undef FMHA_ALWAYS_INLINE
#undef FMHA_V_LOAD
#undef FMHA_V_STORE
#undef FMHA_V_SET1
#undef FMHA_V_FMA
#undef FMHA_V_MUL
#undef FMHA_V_ADD
#undef FMHA_V_SUB
#undef FMHA_V_DIV
#undef FMHA_V_MAX
#undef FMHA_V_MIN
#undef FMHA_V_ROUND
#undef FMHA_V_SELECT_GT
#undef FMHA_V_SELECT_EQ
#undef FMHA_VEC
#undef FMHA_ISA
#endif /* FMHA_ISA */
