/*
 * combine.hip: the split-K combine.  Each of num_splits partial states holds
 * o_g (normalised by its own row sum) and lse_g; the merged row is
 *
 *   lse = max_g lse_g + log sum_g exp(lse_g - max_g lse_g)
 *   out = sum_g exp(lse_g - lse) * o_g
 *
 * folded in split order 0..num_splits-1, so results are deterministic.  A
 * split with lse_g = -inf adds nothing; a row whose splits are all -inf gives
 * out = 0 and lse = -inf.  Used after the split producers and by
 * fmha_native.combine.
 */
#include "convert.h"
#include "launch.h"

#include <math.h>

namespace fmha {
namespace {

constexpr int COMBINE_WARPS = 4;
constexpr int COMBINE_THREADS = COMBINE_WARPS * FMHA_WARP_SIZE;
constexpr int COMBINE_UNROLL = 4; /* independent partial loads in flight per thread */

/* max that keeps NaN (fmaxf drops it): a NaN partial must poison its row. */
__device__ __forceinline__ float nan_max(float a, float b) { return a != a ? a : b != b ? b : fmaxf(a, b); }

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int off = FMHA_WARP_SIZE / 2; off > 0; off /= 2)
        x = nan_max(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int off = FMHA_WARP_SIZE / 2; off > 0; off /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* An empty split (weight 0) must not multiply whatever its partial holds. */
__device__ __forceinline__ float weighted(float weight, float x) { return weight == 0.f ? 0.f : weight * x; }

/*
 * A CTA merges `rows_per_cta` rows (<= COMBINE_WARPS).  Phase 1: warp r turns
 * row r's split LSEs into its LSE and the split weights, kept in shared
 * memory.  Phase 2: all threads sweep (row, feature) pairs, each folding the
 * splits in order 0..num_splits-1 with COMBINE_UNROLL loads in flight.
 */
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(COMBINE_THREADS)
combine_kernel(const fmha_combine_params c, int rows_per_cta)
{
    extern __shared__ float s_weight[]; /* [rows_per_cta][num_splits], then [rows_per_cta] lse */
    float *s_lse = s_weight + rows_per_cta * c.num_splits;
    const int64_t total_rows = c.batch * c.seqlen_q * c.heads;
    const int64_t row0 = (int64_t)blockIdx.x * rows_per_cta;
    const int lane = threadIdx.x % FMHA_WARP_SIZE, warp = threadIdx.x / FMHA_WARP_SIZE;

    auto row_coords = [&](int64_t row, int64_t &b, int64_t &i, int64_t &h) {
        h = row % c.heads;
        i = row / c.heads % c.seqlen_q;
        b = row / c.heads / c.seqlen_q;
    };

    if (warp < rows_per_cta && row0 + warp < total_rows) {
        int64_t b, i, h;
        row_coords(row0 + warp, b, i, h);
        const float *lse_g = c.lse_partial + b * c.lp_batch_stride + h * c.lp_head_stride +
                             i * c.lp_row_stride;
        float top = -INFINITY;
        for (int64_t g = lane; g < c.num_splits; g += FMHA_WARP_SIZE)
            top = nan_max(top, lse_g[g * c.lp_split_stride]);
        top = warp_max(top);
        float sum = 0.f;
        if (top != -INFINITY)
            for (int64_t g = lane; g < c.num_splits; g += FMHA_WARP_SIZE)
                sum += expf(lse_g[g * c.lp_split_stride] - top);
        sum = warp_sum(sum);
        const float lse = top == -INFINITY ? -INFINITY : top + logf(sum);
        for (int64_t g = lane; g < c.num_splits; g += FMHA_WARP_SIZE)
            s_weight[warp * c.num_splits + g] =
                lse == -INFINITY ? 0.f : expf(lse_g[g * c.lp_split_stride] - lse);
        if (lane == 0) {
            s_lse[warp] = lse;
            if (c.lse)
                c.lse[b * c.lse_batch_stride + h * c.lse_head_stride + i * c.lse_row_stride] = lse;
        }
    }
    __syncthreads();

    const int64_t rows_here = total_rows - row0 < rows_per_cta ? total_rows - row0 : rows_per_cta;
    for (int64_t idx = threadIdx.x; idx < rows_here * c.head_dim; idx += COMBINE_THREADS) {
        const int r = (int)(idx / c.head_dim);
        const int64_t d = idx % c.head_dim;
        int64_t b, i, h;
        row_coords(row0 + r, b, i, h);
        const TIn *o_g = static_cast<const TIn *>(c.o_partial) + b * c.op_batch_stride +
                         i * c.op_row_stride + h * c.op_head_stride + d;
        const float *weight = s_weight + r * c.num_splits;
        float acc = 0.f;
        if (s_lse[r] != -INFINITY) {
            int64_t g = 0;
            for (; g + COMBINE_UNROLL <= c.num_splits; g += COMBINE_UNROLL) {
                float x[COMBINE_UNROLL];
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; u++)
                    x[u] = load_float(o_g[(g + u) * c.op_split_stride]);
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; u++)
                    acc += weighted(weight[g + u], x[u]);
            }
            for (; g < c.num_splits; g++)
                acc += weighted(weight[g], load_float(o_g[g * c.op_split_stride]));
        }
        TOut *out = static_cast<TOut *>(c.out) + b * c.o_batch_stride + i * c.o_row_stride +
                    h * c.o_head_stride;
        out[d] = store_as<TOut>(acc);
    }
}

template <typename TIn, typename TOut> fmha_status launch_typed(const fmha_combine_params &c)
{
    const int64_t rows = c.batch * c.seqlen_q * c.heads;
    /* Enough rows per CTA to give every thread a feature, at most one row per warp. */
    int rows_per_cta = (int)(COMBINE_THREADS / (c.head_dim > 0 ? c.head_dim : 1));
    rows_per_cta = rows_per_cta < 1 ? 1 : rows_per_cta > COMBINE_WARPS ? COMBINE_WARPS : rows_per_cta;
    const int64_t ctas = (rows + rows_per_cta - 1) / rows_per_cta;
    if (ctas == 0)
        return FMHA_OK;
    if (ctas > INT32_MAX) {
        record_error("combine grid too large", hipSuccess);
        return FMHA_ERR_UNSUPPORTED;
    }
    const size_t smem = sizeof(float) * (size_t)rows_per_cta * (size_t)(c.num_splits + 1);
    combine_kernel<TIn, TOut><<<dim3((unsigned)ctas), dim3(COMBINE_THREADS), smem,
                                (hipStream_t)c.stream>>>(c, rows_per_cta);
    return check_launch("combine_kernel");
}

template <typename TIn> fmha_status launch_out(const fmha_combine_params &c)
{
    switch (c.out_dtype) {
    case FMHA_DTYPE_F16: return launch_typed<TIn, fmha_half>(c);
    case FMHA_DTYPE_BF16: return launch_typed<TIn, fmha_bf16>(c);
    case FMHA_DTYPE_F32: return launch_typed<TIn, float>(c);
    }
    return FMHA_ERR_INVALID;
}

}  // namespace

fmha_status launch_combine(const fmha_combine_params &c)
{
    switch (c.in_dtype) {
    case FMHA_DTYPE_F16: return launch_out<fmha_half>(c);
    case FMHA_DTYPE_BF16: return launch_out<fmha_bf16>(c);
    case FMHA_DTYPE_F32: return launch_out<float>(c);
    }
    return FMHA_ERR_INVALID;
}

}  // namespace fmha
