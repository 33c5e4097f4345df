/*
 * combine.hip: the split-K combine.  Each of num_splits partial states holds
 * o_g (normalised by its own row sum) and lse_g; the merged row is
 *
 *   lse = max_g lse_g + log sum_g exp(lse_g - max_g lse_g)
 *   out = sum_g exp(lse_g - lse) * o_g
 *
 * folded in split order 0..num_splits-1, so results are deterministic.  A
 * split with lse_g = -inf adds nothing; a row whose splits are all -inf gives
 * out = 0 and lse = -inf.  One warp per (batch, query, head) row, lanes along
 * head_dim.  Used after the split producers and by fmha_native.combine.
 */
#include "convert.h"
#include "launch.h"

#include <math.h>

namespace fmha {
namespace {

constexpr int COMBINE_WARPS = 4;

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int off = FMHA_WARP_SIZE / 2; off > 0; off /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int off = FMHA_WARP_SIZE / 2; off > 0; off /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

template <typename TIn, typename TOut>
__global__ void __launch_bounds__(COMBINE_WARPS * FMHA_WARP_SIZE)
combine_kernel(const fmha_combine_params c)
{
    const int lane = threadIdx.x % FMHA_WARP_SIZE;
    const int64_t row = (int64_t)blockIdx.x * COMBINE_WARPS + threadIdx.x / FMHA_WARP_SIZE;
    if (row >= c.batch * c.seqlen_q * c.heads)
        return;
    const int64_t h = row % c.heads, i = row / c.heads % c.seqlen_q, b = row / c.heads / c.seqlen_q;
    const float *lse_g = c.lse_partial + b * c.lp_batch_stride + h * c.lp_head_stride +
                         i * c.lp_row_stride;
    const TIn *o_g = static_cast<const TIn *>(c.o_partial) + b * c.op_batch_stride +
                     i * c.op_row_stride + h * c.op_head_stride;

    float top = -INFINITY;
    for (int64_t g = lane; g < c.num_splits; g += FMHA_WARP_SIZE)
        top = fmaxf(top, lse_g[g * c.lp_split_stride]);
    top = warp_max(top);
    float sum = 0.f;
    if (top != -INFINITY)
        for (int64_t g = lane; g < c.num_splits; g += FMHA_WARP_SIZE)
            sum += expf(lse_g[g * c.lp_split_stride] - top);
    sum = warp_sum(sum);
    const float lse = top == -INFINITY ? -INFINITY : top + logf(sum);

    TOut *out = static_cast<TOut *>(c.out) + b * c.o_batch_stride + i * c.o_row_stride +
                h * c.o_head_stride;
    for (int64_t d = lane; d < c.head_dim; d += FMHA_WARP_SIZE) {
        float acc = 0.f;
        if (lse != -INFINITY)
            for (int64_t g = 0; g < c.num_splits; g++) {
                const float weight = expf(lse_g[g * c.lp_split_stride] - lse);
                /* weight 0 (an empty split) must not multiply whatever its o_g holds */
                if (weight != 0.f)
                    acc += weight * load_float(o_g[g * c.op_split_stride + d]);
            }
        out[d] = store_as<TOut>(acc);
    }
    if (c.lse && lane == 0)
        c.lse[b * c.lse_batch_stride + h * c.lse_head_stride + i * c.lse_row_stride] = lse;
}

template <typename TIn, typename TOut> fmha_status launch_typed(const fmha_combine_params &c)
{
    int64_t rows = c.batch * c.seqlen_q * c.heads;
    int64_t ctas = (rows + COMBINE_WARPS - 1) / COMBINE_WARPS;
    if (ctas == 0)
        return FMHA_OK;
    if (ctas > INT32_MAX) {
        record_error("combine grid too large", hipSuccess);
        return FMHA_ERR_UNSUPPORTED;
    }
    combine_kernel<TIn, TOut><<<dim3((unsigned)ctas), dim3(COMBINE_WARPS * FMHA_WARP_SIZE), 0,
                                (hipStream_t)c.stream>>>(c);
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
