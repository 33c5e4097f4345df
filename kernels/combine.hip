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

constexpr int COMBINE_THREADS = 256;
constexpr int COMBINE_UNROLL = 4; /* independent partial loads in flight per thread */

/* max that keeps NaN (fmaxf drops it): a NaN partial must poison its row. */
__device__ __forceinline__ float nan_max(float a, float b) { return a != a ? a : b != b ? b : fmaxf(a, b); }

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int off = FMHA_WARP_SIZE / 2; off > 0; off /= 2)
        x = nan_max(x, fmha_shfl_xor(x, off));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int off = FMHA_WARP_SIZE / 2; off > 0; off /= 2)
        x += fmha_shfl_xor(x, off);
    return x;
}

/* An empty split (weight 0) must not multiply whatever its partial holds. */
__device__ __forceinline__ float weighted(float weight, float x) { return weight == 0.f ? 0.f : weight * x; }

/*
 * How a CTA's threads cover rows: `lanes` threads (head_dim rounded up to a
 * warp, at most the CTA) sweep the features of one row; `groups` such teams
 * fold disjoint subsets of the splits of the same row; the CTA holds
 * `rows` such rows (at most one per warp, which computes that row's weights).
 */
struct combine_shape {
    int lanes, groups, rows;
    __host__ __device__ combine_shape(int64_t head_dim, int64_t num_splits)
    {
        int64_t l = (head_dim + FMHA_WARP_SIZE - 1) / FMHA_WARP_SIZE * FMHA_WARP_SIZE;
        lanes = (int)(l < COMBINE_THREADS ? l : COMBINE_THREADS);
        int64_t g = COMBINE_THREADS / lanes;
        groups = (int)(g < num_splits ? g : (num_splits > 0 ? num_splits : 1));
        int64_t r = COMBINE_THREADS / (lanes * groups);
        const int max_rows = COMBINE_THREADS / FMHA_WARP_SIZE;
        rows = (int)(r < max_rows ? r : max_rows);
    }
};

/*
 * Phase 1: warp r turns row r's split LSEs into its LSE and the split weights
 * (shared memory).  Phase 2: group j of a row folds splits j, j + groups, ...
 * in increasing order (COMBINE_UNROLL loads in flight); group sums are then
 * added in group order.  The order is fixed, so results are deterministic.
 */
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(COMBINE_THREADS) combine_kernel(const fmha_combine_params c)
{
    const combine_shape shape(c.head_dim, c.num_splits);
    extern __shared__ float smem[]; /* [rows][num_splits] weights, [rows] lse, [COMBINE_THREADS] sums */
    float *s_weight = smem;
    float *s_lse = smem + shape.rows * c.num_splits;
    float *s_part = s_lse + shape.rows;
    const int64_t total_rows = c.batch * c.seqlen_q * c.heads;
    const int64_t row0 = (int64_t)blockIdx.x * shape.rows;
    const int lane = threadIdx.x % FMHA_WARP_SIZE, warp = threadIdx.x / FMHA_WARP_SIZE;

    auto coords = [&](int64_t row, int64_t &b, int64_t &i, int64_t &h) {
        h = row % c.heads;
        i = row / c.heads % c.seqlen_q;
        b = row / c.heads / c.seqlen_q;
    };

    if (warp < shape.rows && row0 + warp < total_rows) {
        int64_t b, i, h;
        coords(row0 + warp, b, i, h);
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

    const int team = shape.lanes * shape.groups;
    const int r = threadIdx.x / team, group = threadIdx.x % team / shape.lanes;
    const int glane = threadIdx.x % shape.lanes;
    const bool active = r < shape.rows && row0 + r < total_rows;
    int64_t b = 0, i = 0, h = 0;
    if (active)
        coords(row0 + r, b, i, h);
    const TIn *o_row = static_cast<const TIn *>(c.o_partial) + b * c.op_batch_stride +
                       i * c.op_row_stride + h * c.op_head_stride;
    TOut *out = static_cast<TOut *>(c.out) + b * c.o_batch_stride + i * c.o_row_stride +
                h * c.o_head_stride;
    const float *weight = s_weight + (active ? r : 0) * c.num_splits;
    const bool empty = !active || s_lse[r] == -INFINITY;
    for (int64_t d0 = 0; d0 < c.head_dim; d0 += shape.lanes) {
        const int64_t d = d0 + glane;
        float acc = 0.f;
        if (d < c.head_dim && !empty) {
            const int64_t step = shape.groups;
            int64_t g = group;
            for (; g + (COMBINE_UNROLL - 1) * step < c.num_splits; g += COMBINE_UNROLL * step) {
                float x[COMBINE_UNROLL];
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; u++)
                    x[u] = load_float(o_row[(g + u * step) * c.op_split_stride + d]);
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; u++)
                    acc += weighted(weight[g + u * step], x[u]);
            }
            for (; g < c.num_splits; g += step)
                acc += weighted(weight[g], load_float(o_row[g * c.op_split_stride + d]));
        }
        s_part[threadIdx.x] = acc;
        __syncthreads();
        if (active && group == 0 && d < c.head_dim) {
            float total = 0.f;
            for (int j = 0; j < shape.groups; j++)
                total += s_part[r * team + j * shape.lanes + glane];
            out[d] = store_as<TOut>(total);
        }
        __syncthreads();
    }
}

template <typename TIn, typename TOut> fmha_status launch_typed(const fmha_combine_params &c)
{
    const int64_t rows = c.batch * c.seqlen_q * c.heads;
    const combine_shape shape(c.head_dim, c.num_splits);
    const int64_t ctas = (rows + shape.rows - 1) / shape.rows;
    if (ctas == 0)
        return FMHA_OK;
    if (ctas > INT32_MAX) {
        record_error("combine grid too large", hipSuccess);
        return FMHA_ERR_UNSUPPORTED;
    }
    const size_t smem = sizeof(float) * ((size_t)shape.rows * (size_t)(c.num_splits + 1) + COMBINE_THREADS);
    combine_kernel<TIn, TOut><<<dim3((unsigned)ctas), dim3(COMBINE_THREADS), smem,
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
