/*
 * mma_amd.h: AMD matrix-core and copy atoms for CDNA2/CDNA3 (gfx90a, gfx94x),
 * the only place with MFMA builtins.  It gives the producer kernel
 * (fwd_mma.h) the same small interface as mma_nvidia.h, with one MFMA engine
 * (mfma_tile_math) in place of the ldmatrix + mma.sync one.
 *
 * The atom is v_mfma_f32_16x16x16{f16,bf16_1k} on a wave of 64 lanes; lane
 * l = 16 * g + i (g = l / 16, i = l % 16) holds
 *   A (16 x 16, m x k):  row i, k = 4g .. 4g+3
 *   B (16 x 16, k x n):  column i, k = 4g .. 4g+3
 *   C (16 x 16, m x n):  column i, rows 4g .. 4g+3
 * The engine computes the transposed products S^T = K Q^T and O^T = V^T P^T,
 * so that in both accumulators lane l owns ONE query row (i) and four
 * adjacent columns (4g .. 4g+3) of each 16-column tile:
 *   - the softmax row reduction is over the 4 lanes i, i+16, i+32, i+48
 *     (quad_max / quad_sum below, xor 16 and 32);
 *   - the C fragment of S^T for keys 16kn .. 16kn+15 is, element for element,
 *     the B operand (P^T) of O^T for the same keys: P never leaves registers;
 *   - O rows are stored as 4 adjacent features per lane.
 * Nothing here is tuned (K/V are copied synchronously, V^T is gathered with
 * scalar LDS reads): it is written to be checked by reading, since no AMD GPU
 * has run it.
 */
#ifndef FMHA_MMA_AMD_H
#define FMHA_MMA_AMD_H

#include "hip_compat.h"

#include <stdint.h>

#if defined(__HIP_DEVICE_COMPILE__)
#if !(defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#error "fmha_native's AMD kernels need the CDNA2/CDNA3 MFMA atoms (gfx90a, gfx940, gfx941, gfx942)"
#endif
static_assert(FMHA_WARP_SIZE == 64, "the MFMA engine is written for wave64");
#endif

/* The warpgroup engine is NVIDIA's (mma_sm90.h); AMD builds never select it. */
#define FMHA_HAS_WGMMA 0

namespace fmha {

/* The atom: 16 x 16 accumulator tiles, 16-deep k steps, on 64-lane waves. */
constexpr int MMA_M = 16;
constexpr int MMA_N = 16;
constexpr int MMA_K = 16;
constexpr int WARP_LANES = 64;
constexpr int MMA_K_PER_LANE = 4; /* k values (or C rows of S^T/O^T) one lane holds */

/*
 * The accumulator fragment as the softmax sees it (fwd_mma.h): of each
 * 16 x MMA_N tile a lane holds ACC_ROWS rows times ACC_COLS adjacent columns,
 * float e = r * ACC_COLS + c, and LANES_PER_ROW lanes share each row.
 */
constexpr int ACC_ROWS = 1;
constexpr int ACC_COLS = MMA_K_PER_LANE;
constexpr int LANES_PER_ROW = WARP_LANES / MMA_M;
constexpr int ACC_ROW_STRIDE = MMA_M; /* rows acc_row(lane) + r * ACC_ROW_STRIDE (r = 0 only) */
__device__ __forceinline__ int acc_row(int lane) { return lane % MMA_M; }
__device__ __forceinline__ int acc_col(int lane) { return lane / MMA_M * ACC_COLS; }
/* The lane that writes a row's single values (the LSE). */
__device__ __forceinline__ bool acc_row_leader(int lane) { return lane < MMA_M; }

/* Reduce over the LANES_PER_ROW lanes of one row: lanes i, i+16, i+32, i+48. */
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor(x, MMA_M));
    return fmaxf(x, __shfl_xor(x, 2 * MMA_M));
}
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor(x, MMA_M);
    return x + __shfl_xor(x, 2 * MMA_M);
}

__device__ __forceinline__ float exp2_fast(float x) { return exp2f(x); }
__device__ __forceinline__ float log2_fast(float x) { return log2f(x); }
__device__ __forceinline__ float rcp_fast(float x) { return 1.f / x; }

/*
 * K/V/Q copies into LDS: synchronous 16-byte loads and stores.  The kernel's
 * ring protocol (commit, wait, barrier) stays correct because every copy has
 * completed when it returns; the barrier before the tile math orders them.
 */
__device__ __forceinline__ void copy_async_16(void *dst, const void *src, bool valid)
{
    *static_cast<uint4 *>(dst) = valid ? *static_cast<const uint4 *>(src) : make_uint4(0, 0, 0, 0);
}
/* No L2-hinted copies (mma_nvidia.h's hinted_copy): fwd_mma.h copies with plain_copy. */
constexpr bool HAS_L2_HINTS = false;
constexpr uint64_t L2_EVICT_NORMAL = 0, L2_EVICT_FIRST = 0;
__host__ __device__ constexpr uint64_t kv_l2_policy(int) { return 0; }
struct hinted_copy; /* never picked without HAS_L2_HINTS */
__device__ __forceinline__ void copy_async_commit() {}
template <int N> __device__ __forceinline__ void copy_async_wait() {}
/* Only the wgmma engine needs a proxy fence. */
__device__ __forceinline__ void fence_proxy_async() {}

/* Barrier of one wave: its lanes' LDS writes are visible to all its lanes. */
__device__ __forceinline__ void warp_sync()
{
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}

/* x, which every lane of the wave holds alike, as a value the compiler knows is uniform. */
__device__ __forceinline__ int warp_uniform(int x) { return __builtin_amdgcn_readfirstlane(x); }

/* Whether any lane of the wavefront has x. */
__device__ __forceinline__ bool warp_any(bool x) { return __any(x); }

/* The sum and the largest of x over the wavefront's lanes, in every lane. */
__device__ __forceinline__ int64_t warp_sum(int64_t x)
{
    for (int d = WARP_LANES / 2; d > 0; d /= 2)
        x += __shfl_xor(x, d);
    return x;
}
__device__ __forceinline__ int64_t warp_max(int64_t x)
{
    for (int d = WARP_LANES / 2; d > 0; d /= 2) {
        const int64_t y = __shfl_xor(x, d);
        x = y > x ? y : x;
    }
    return x;
}
/* The sum of x over lanes 0 to this one (an inclusive prefix sum). */
__device__ __forceinline__ int warp_prefix_sum(int x)
{
    const int lane = (int)(threadIdx.x % WARP_LANES);
    for (int d = 1; d < WARP_LANES; d *= 2) {
        const int y = __shfl_up(x, d);
        x += lane >= d ? y : 0;
    }
    return x;
}
/* x of lane `from`, in every lane. */
__device__ __forceinline__ int warp_read(int x, int from) { return __shfl(x, from); }
/* The lowest lane whose x holds (-1: none). */
__device__ __forceinline__ int warp_first(bool x) { return __ffsll((unsigned long long)__ballot(x)) - 1; }

/* With synchronous copies a deeper K/V ring overlaps nothing and costs LDS (64 KB). */
constexpr int ring_stages(int) { return 1; }

typedef short fmha_mfma_bf16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 fmha_mfma_f16x4 __attribute__((ext_vector_type(4)));
typedef float fmha_mfma_f32x4 __attribute__((ext_vector_type(4)));
/* An A or B operand: 4 k-adjacent 16-bit values, k ascending from the low half of [0]. */
typedef uint32_t fmha_mfma_operand __attribute__((ext_vector_type(2)));

/* Per element type: the 16-bit pattern of a value, the rounding of fp32, the atom. */
template <typename T> struct mma_type;
template <> struct mma_type<fmha_half> {
    __device__ static uint32_t bits(float x)
    {
        return __builtin_bit_cast(uint16_t, static_cast<_Float16>(x)); /* round to nearest even */
    }
    __device__ static fmha_half from_float(float x) { return __float2half_rn(x); }
    __device__ static fmha_mfma_f32x4 mma(fmha_mfma_operand a, fmha_mfma_operand b, fmha_mfma_f32x4 c)
    {
        return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(fmha_mfma_f16x4, a),
                                                     __builtin_bit_cast(fmha_mfma_f16x4, b), c, 0, 0, 0);
    }
};
template <> struct mma_type<fmha_bf16> {
    /* fp32 -> bf16 round to nearest even; NaN stays a (quiet) NaN. */
    __device__ static uint32_t bits(float x)
    {
        constexpr uint32_t ABS = 0x7fffffffu, INF = 0x7f800000u, QUIET = 0x0040u, HALF_ULP = 0x7fffu;
        const uint32_t u = __float_as_uint(x);
        if ((u & ABS) > INF)
            return (u >> 16) | QUIET;
        return (u + HALF_ULP + ((u >> 16) & 1u)) >> 16;
    }
    __device__ static fmha_bf16 from_float(float x) { return fmha_float2bf16(x); }
    __device__ static fmha_mfma_f32x4 mma(fmha_mfma_operand a, fmha_mfma_operand b, fmha_mfma_f32x4 c)
    {
        return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(fmha_mfma_bf16x4, a),
                                                         __builtin_bit_cast(fmha_mfma_bf16x4, b), c, 0, 0, 0);
    }
};

/* Two 16-bit patterns as one operand register, lo first. */
__device__ __forceinline__ uint32_t pack16(uint32_t lo, uint32_t hi) { return lo | hi << 16; }

/* Store the ACC_COLS values of one accumulator row, scaled by inv, at dst[col] on. */
__device__ __forceinline__ void store_row(float *dst, int col, const float *v, float inv)
{
#pragma unroll
    for (int c = 0; c < ACC_COLS; c++)
        dst[col + c] = v[c] * inv;
}
template <typename T> __device__ __forceinline__ void store_row(T *dst, int col, const float *v, float inv)
{
#pragma unroll
    for (int c = 0; c < ACC_COLS; c++)
        dst[col + c] = mma_type<T>::from_float(v[c] * inv);
}

/*
 * The two tile products of the main loop for the rows this wave owns, on
 * MFMA: S = Q K^T as S^T = K Q^T, and O += P V as O^T += V^T P^T.  QTile and
 * KVTile are the kernel's smem_tile layouts (element offset of (row, chunk)).
 */
template <typename T, typename cfg, typename QTile, typename KVTile> struct mfma_tile_math {
    static constexpr int HEAD_DIM = cfg::head_dim, BLOCK_N = cfg::block_n;
    static constexpr int WARP_M = cfg::block_m / cfg::walker_warps, MT = WARP_M / MMA_M;
    static_assert(cfg::o_parts == 1, "AMD tiles keep O whole (fmha_config.h lists no wider head_dim there)");
    static constexpr int NT = BLOCK_N / MMA_N, DT = HEAD_DIM / MMA_N;
    static constexpr int ELEMS_PER_CHUNK = 8; /* 16-byte chunks of the smem tiles */
    static constexpr int PANEL_CHUNKS = KVTile::PANEL_CHUNKS;
    /* 16-column steps in one 64-column panel: the lane-dependent part of an
     * address repeats with this period (see step_at). */
    static constexpr int STEPS = DT < 4 ? DT : 4;
    static_assert(MMA_N == MMA_K, "P^T of one S^T tile is the B operand of one k step");
    static_assert(ELEMS_PER_CHUNK % MMA_K_PER_LANE == 0, "an operand never straddles a 16-byte chunk");
    static_assert(QTile::PANEL_CHUNKS == PANEL_CHUNKS &&
                      (DT < STEPS || MMA_N * STEPS == ELEMS_PER_CHUNK * PANEL_CHUNKS),
                  "STEPS 16-column steps make one panel");

    const uint16_t *q, *k, *v; /* the tiles as 16-bit patterns; K and V at stage 0 */
    /*
     * Element offsets of this lane's operand reads for the first 16 rows and
     * the first panel; other rows/panels add a compile-time constant (step_at).
     *   q_at[s], k_at[s]:  row i (+ this wave's rows for Q), columns 16s + 4g .. +3
     *   v_at[c][s]:        row 4g + c, column 16s + i
     */
    int q_at[STEPS], k_at[STEPS], v_at[MMA_K_PER_LANE][STEPS];

    /*
     * Offsets are linear in 16-row and 64-column (panel) steps for both smem_tile
     * layouts (the swizzle XORs a chunk with row % 8 inside its panel, which such
     * steps keep), so for c < 16:
     *   at(r + 16 t, c + 16 s) = at(r, c + 16 (s % STEPS)) + step_at(t, s).
     * The lane part is computed once; the constant folds into the LDS offset.
     */
    template <typename Tile> __device__ static int step_at(int row_tiles, int col_tiles)
    {
        return Tile::offset(row_tiles * MMA_M, col_tiles / STEPS * PANEL_CHUNKS);
    }
    template <typename Tile> __device__ static int at(int row, int col)
    {
        return Tile::offset(row, col / ELEMS_PER_CHUNK) + col % ELEMS_PER_CHUNK;
    }

    __device__ mfma_tile_math(const T *s_q, const T *s_k, const T *s_v, int warp, int lane)
        : q(reinterpret_cast<const uint16_t *>(s_q)), k(reinterpret_cast<const uint16_t *>(s_k)),
          v(reinterpret_cast<const uint16_t *>(s_v))
    {
        const int i = lane % MMA_M, g = lane / MMA_M; /* lane = 16 g + i */
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            q_at[s] = at<QTile>(warp * WARP_M + i, s * MMA_K + g * MMA_K_PER_LANE);
            k_at[s] = at<KVTile>(i, s * MMA_K + g * MMA_K_PER_LANE);
#pragma unroll
            for (int c = 0; c < MMA_K_PER_LANE; c++)
                v_at[c][s] = at<KVTile>(g * MMA_K_PER_LANE + c, s * MMA_N + i);
        }
    }

    /* 4 k-adjacent values along a stored row: one 8-byte LDS read (8-byte aligned). */
    __device__ static fmha_mfma_operand load_k4(const uint16_t *p)
    {
        return *reinterpret_cast<const fmha_mfma_operand *>(p);
    }

    __device__ void scores(float (&s)[MT][NT][4], int stage) const
    {
        const uint16_t *k_stage = k + stage * KVTile::ELEMS;
        fmha_mfma_f32x4 acc[MT][NT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                acc[mt][nt] = fmha_mfma_f32x4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kd = 0; kd < HEAD_DIM / MMA_K; kd++) {
            fmha_mfma_operand b[MT]; /* B = Q^T: column query i, features 16 kd + 4g .. +3 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                b[mt] = load_k4(q + q_at[kd % STEPS] + step_at<QTile>(mt, kd));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                /* A = K: row key 16 nt + i, features 16 kd + 4g .. +3 */
                const fmha_mfma_operand a = load_k4(k_stage + k_at[kd % STEPS] + step_at<KVTile>(nt, kd));
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    acc[mt][nt] = mma_type<T>::mma(a, b[mt], acc[mt][nt]);
            }
        }
        /* acc[mt][nt][c] = S^T[key 4g + c][query i] = S[query i][key 16 nt + 4g + c] */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    s[mt][nt][c] = acc[mt][nt][c];
    }

    __device__ void accumulate(float (&o)[MT][DT][4], const float (&s)[MT][NT][4], int stage) const
    {
        const uint16_t *v_stage = v + stage * KVTile::ELEMS;
#pragma unroll
        for (int kn = 0; kn < BLOCK_N / MMA_K; kn++) {
            fmha_mfma_operand pt[MT]; /* B = P^T: column query i, keys 16 kn + 4g .. +3 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                pt[mt] = fmha_mfma_operand{
                    pack16(mma_type<T>::bits(s[mt][kn][0]), mma_type<T>::bits(s[mt][kn][1])),
                    pack16(mma_type<T>::bits(s[mt][kn][2]), mma_type<T>::bits(s[mt][kn][3]))};
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                /* A = V^T: row feature 16 dt + i, keys 16 kn + 4g .. +3 (a column of V) */
                const int step = step_at<KVTile>(kn, dt), sd = dt % STEPS;
                const fmha_mfma_operand vt = {
                    pack16(v_stage[v_at[0][sd] + step], v_stage[v_at[1][sd] + step]),
                    pack16(v_stage[v_at[2][sd] + step], v_stage[v_at[3][sd] + step])};
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    fmha_mfma_f32x4 acc = {o[mt][dt][0], o[mt][dt][1], o[mt][dt][2], o[mt][dt][3]};
                    acc = mma_type<T>::mma(vt, pt[mt], acc);
                    /* acc[c] = O^T[feature 16 dt + 4g + c][query i] */
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        o[mt][dt][c] = acc[c];
                }
            }
        }
    }
};

}  // namespace fmha

#endif /* FMHA_MMA_AMD_H */
