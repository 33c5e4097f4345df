/*
 * mma_nvidia.h: NVIDIA matrix-core and copy atoms (sm_80+), the only place
 * with inline PTX.  The producer kernel sees a small interface:
 *
 *   mma_AB(c, a, b)          c[16x8] += a[16x16] * b[16x8], fp32 accumulate
 *   load_A / load_B / load_B_trans   ldmatrix.x4 fragments from shared memory
 *   copy_async_16 / copy_async_commit / copy_async_wait<N>   cp.async pipeline
 *   hinted_copy              cp.async with an L2 eviction priority (L2_EVICT_*, HAS_L2_HINTS)
 *   quad_max / quad_sum      reduce the 4 lanes that hold one accumulator row
 *   exp2_fast                ex2.approx (the scale is folded into the scores)
 *   log2_fast / rcp_fast     lg2.approx / rcp.approx
 *
 * Fragment layout of m16n8k16 (lane = 4 * group + quad_lane):
 *   A: regs {0,1,2,3} hold rows {g, g+8, g, g+8}, cols {2q, 2q, 2q+8, 2q+8} (+1)
 *   B: regs {0,1} hold k rows {2q, 2q+8} (+1), column g
 *   C: floats {0,1} row g, cols 2q, 2q+1; floats {2,3} row g+8, same cols
 * so the C fragments of two adjacent 8-column tiles are exactly an A
 * fragment of a 16-column tile: P never leaves registers.
 */
#ifndef FMHA_MMA_NVIDIA_H
#define FMHA_MMA_NVIDIA_H

#include "hip_compat.h"

#include <stdint.h>

namespace fmha {

/* Rows of the m16n8k16 atom, and the lanes that share one accumulator row. */
constexpr int MMA_M = 16;
constexpr int MMA_N = 8;
constexpr int MMA_K = 16;
constexpr int LANES_PER_ROW = 4;
constexpr int WARP_LANES = 32;

/*
 * The accumulator fragment as the softmax sees it (fwd_mma.h; mma_amd.h has
 * the same names): of each 16 x MMA_N C tile a lane holds ACC_ROWS rows times
 * ACC_COLS adjacent columns, float e = r * ACC_COLS + c.
 */
constexpr int ACC_ROWS = 2;
constexpr int ACC_COLS = 2;
constexpr int ACC_ROW_STRIDE = 8; /* rows acc_row(lane) + r * ACC_ROW_STRIDE */
__device__ __forceinline__ int acc_row(int lane) { return lane / LANES_PER_ROW; }
__device__ __forceinline__ int acc_col(int lane) { return (lane % LANES_PER_ROW) * ACC_COLS; }
/* The lane that writes a row's single values (the LSE). */
__device__ __forceinline__ bool acc_row_leader(int lane) { return lane % LANES_PER_ROW == 0; }

/* Barrier of one warp: its lanes' shared-memory writes are visible to all its lanes. */
__device__ __forceinline__ void warp_sync() { __syncwarp(); }

/* x, which every lane of the warp holds alike, as a value the compiler knows is uniform. */
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

/* Whether any lane of the warp has x. */
__device__ __forceinline__ bool warp_any(bool x) { return __any_sync(0xffffffffu, x); }

/* The sum and the largest of x over the warp's lanes, in every lane. */
__device__ __forceinline__ int64_t warp_sum(int64_t x)
{
    for (int d = WARP_LANES / 2; d > 0; d /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, d);
    return x;
}
__device__ __forceinline__ int64_t warp_max(int64_t x)
{
    for (int d = WARP_LANES / 2; d > 0; d /= 2) {
        const int64_t y = __shfl_xor_sync(0xffffffffu, x, d);
        x = y > x ? y : x;
    }
    return x;
}
/* The sum of x over lanes 0 to this one (an inclusive prefix sum). */
__device__ __forceinline__ int warp_prefix_sum(int x)
{
    const int lane = (int)(threadIdx.x % WARP_LANES);
    for (int d = 1; d < WARP_LANES; d *= 2) {
        const int y = __shfl_up_sync(0xffffffffu, x, d);
        x += lane >= d ? y : 0;
    }
    return x;
}
/* x of lane `from`, in every lane. */
__device__ __forceinline__ int warp_read(int x, int from) { return __shfl_sync(0xffffffffu, x, from); }
/* The lowest lane whose x holds (-1: none). */
__device__ __forceinline__ int warp_first(bool x) { return __ffs(__ballot_sync(0xffffffffu, x)) - 1; }

/* K/V shared-memory ring depth: the configured stages (cp.async overlaps them). */
constexpr int ring_stages(int stages) { return stages; }

template <typename T> struct mma_type;
template <> struct mma_type<fmha_half> {
    __device__ static uint32_t pack(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    __device__ static fmha_half from_float(float x) { return __float2half_rn(x); }
};
template <> struct mma_type<fmha_bf16> {
    __device__ static uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    __device__ static fmha_bf16 from_float(float x) { return __float2bfloat16_rn(x); }
};

/* Store the ACC_COLS values of one accumulator row, scaled by inv, at dst[col] on. */
__device__ __forceinline__ void store_row(float *dst, int col, const float *v, float inv)
{
    *reinterpret_cast<float2 *>(dst + col) = make_float2(v[0] * inv, v[1] * inv);
}
template <typename T> __device__ __forceinline__ void store_row(T *dst, int col, const float *v, float inv)
{
    *reinterpret_cast<uint32_t *>(dst + col) = mma_type<T>::pack(v[0] * inv, v[1] * inv);
}

template <typename T>
__device__ __forceinline__ void mma_AB(float c[4], const uint32_t a[4], const uint32_t b[2]);

template <>
__device__ __forceinline__ void mma_AB<fmha_half>(float c[4], const uint32_t a[4],
                                                  const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_AB<fmha_bf16>(float c[4], const uint32_t a[4],
                                                  const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* Four 8x8 matrices; lane l supplies the shared address of a row of matrix l / 8. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t row_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t row_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}

/*
 * Which (row, 8-column chunk) of a 16x16 operand tile lane l addresses in an
 * ldmatrix.x4, for each of the three uses:
 *   A (row-major rows x k):   matrices (r0-7,k0-7) (r8-15,k0-7) (r0-7,k8-15) (r8-15,k8-15)
 *   B from [n][k] storage:    matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15)
 *                             = b[0..1] of n-tile 0, then b[0..1] of n-tile 1
 *   B from [k][n] storage, transposed on load:
 *                             matrices (k0-7,n0-7) (k8-15,n0-7) (k0-7,n8-15) (k8-15,n8-15)
 */
struct ldsm_lane {
    int row;   /* row of the stored tile */
    int chunk; /* 8-element chunk along the stored row: 0 or 1 */
};
__device__ __forceinline__ ldsm_lane ldsm_A(int lane) { return {(lane & 15), lane >> 4}; }
__device__ __forceinline__ ldsm_lane ldsm_B(int lane)
{
    return {(lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1};
}
__device__ __forceinline__ ldsm_lane ldsm_B_trans(int lane) { return {(lane & 15), lane >> 4}; }

/* 16-byte global -> shared copy; when !valid the destination is zero-filled. */
__device__ __forceinline__ void copy_async_16(void *dst, const void *src, bool valid)
{
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(src_bytes));
}
/*
 * L2 eviction priority of a copy: the cache-policy words that
 * createpolicy.fractional.L2::evict_normal / ::evict_first .b64 with fraction 1.0
 * produce, as constants (fixed words: no createpolicy in the kernel, and the kernel picks
 * one at run time).  Lines read with L2_EVICT_FIRST are the first to go, so a run of
 * them leaves what else the L2 holds in place.
 */
constexpr bool HAS_L2_HINTS = true;
constexpr uint64_t L2_EVICT_NORMAL = 0x1000000000000000ull;
constexpr uint64_t L2_EVICT_FIRST = 0x12F0000000000000ull;
/* The word for a plan's kv_read_once, worked out on the host and passed to the kernel
 * as an argument of its own: ptxas then reads it from the constant bank into the
 * uniform register each copy names, instead of moving it there from a register before
 * every group of copies. */
__host__ __device__ constexpr uint64_t kv_l2_policy(int read_once)
{
    return read_once ? L2_EVICT_FIRST : L2_EVICT_NORMAL;
}

/*
 * 16-byte copies into one shared-memory tile with an L2 policy:
 * put(byte offset in the tile, src, valid), zero-filled when !valid.  The tile's base
 * goes through a shuffle once, so ptxas cannot prove it warp-uniform: when it folds a
 * uniform base into the copy's address, ptxas 13.0 also leaves the policy's uniform
 * register unwritten (illegal instruction at run time; device_run.sh's sass stage checks).
 */
struct hinted_copy {
    uint32_t base;
    uint64_t policy;
    __device__ hinted_copy(const void *tile, uint64_t l2_policy)
        : base(__shfl_sync(0xffffffffu, smem_addr(tile), (int)threadIdx.x % WARP_LANES)), policy(l2_policy)
    {
    }
    __device__ void operator()(int byte_offset, const void *src, bool valid) const
    {
        int src_bytes = valid ? 16 : 0;
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(
                         base + (uint32_t)byte_offset),
                     "l"(src), "r"(src_bytes), "l"(policy));
    }
};
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void copy_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float exp2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float log2_fast(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rcp_fast(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace fmha

#endif /* FMHA_MMA_NVIDIA_H */
