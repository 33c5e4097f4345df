/*
 * combine.hip: the split-K combine.  Each of num_splits partial states holds
 * o_g (normalised by its own row sum) and lse_g; the merged row is
 *
 *   lse = max_g lse_g + log sum_g exp(lse_g - max_g lse_g)
 *   out = sum_g exp(lse_g - lse) * o_g
 *
 * folded in a fixed order (below), so results are deterministic.  A split
 * with lse_g = -inf adds nothing; a row whose splits are all -inf gives
 * out = 0 and lse = -inf; a NaN partial gives NaN.  Sinks (c.sinks, one logit
 * per head) join the merged row's denominator once, after the merge (fold.h):
 * a row whose splits are all empty then gives out = 0 and lse = its sink.
 * Used after the split producers (also of packed sequences: cu_seqlens_q) and
 * by fmha_native.combine.
 */
#include "convert.h"
#include "fold.h"
#include "launch.h"

#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace fmha {
namespace {

constexpr int COMBINE_THREADS = 256;
constexpr int COMBINE_SPLITS_PER_GROUP = 4; /* splits one thread folds, when the CTA has room */
constexpr int COMBINE_UNROLL = 8;           /* partial loads in flight per thread */

/*
 * How a CTA's threads cover rows: `lanes` threads, `vec` features each, span
 * the features of one row; `groups` such teams fold disjoint subsets of the
 * splits of the same row (many splits: decode); the CTA holds `rows` rows
 * (few splits: prefill).  Every thread has at most a few splits to fold, so
 * the combine is one or two rounds of loads whatever the shape.
 */
struct combine_shape {
    int vec, lanes, groups, rows;
    combine_shape(int64_t head_dim, int64_t num_splits, int vec_) : vec(vec_)
    {
        const int64_t l = (head_dim + vec - 1) / vec;
        lanes = (int)(l < COMBINE_THREADS ? l : COMBINE_THREADS);
        const int64_t want = (num_splits + COMBINE_SPLITS_PER_GROUP - 1) / COMBINE_SPLITS_PER_GROUP;
        const int64_t room = COMBINE_THREADS / lanes;
        groups = (int)(want < 1 ? 1 : want < room ? want : room);
        rows = COMBINE_THREADS / (lanes * groups);
    }
    size_t smem_bytes() const { return sizeof(float) * (size_t)rows * groups * (lanes * vec + 2); }
};

/* VEC features of a partial row as fp32 (one 16-byte load for aligned fp32). */
template <int VEC, typename T> __device__ __forceinline__ void load_features(const T *src, float (&x)[VEC])
{
    if constexpr (VEC == 4 && std::is_same<T, float>::value) {
        const float4 v = load_l2(reinterpret_cast<const float4 *>(src));
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            x[e] = load_float(load_l2(src + e));
    }
}

/*
 * Each group folds its splits g = group, group + groups, ... in increasing
 * order into a running (max m, sum s, acc) exactly like the producer's online
 * softmax, with lse_g in place of a score and o_g in place of V; the groups'
 * states are then merged in group order.  The order is fixed, so results are
 * deterministic.
 *
 * Launched overlapped after a producer, the kernel is placed while the producer
 * drains, and its code is cold then (the producer's K/V reads have pushed it out of L2).
 * With first_pass 0 it first runs the same instructions dry, on whatever the
 * partials hold, writing only to shared memory, so the instruction lines are
 * fetched before the partials are ready; then it waits for the producer and
 * runs them for real.  Partials are read through L2 in both passes, so the dry
 * pass leaves no stale L1 line behind.
 */
template <typename TIn, typename TOut, int VEC>
__global__ void __launch_bounds__(COMBINE_THREADS, 1) combine_kernel(const fmha_combine_params c, const combine_shape shape, int first_pass)
{
    extern __shared__ float smem[]; /* [rows][groups] m, s; [rows][groups][lanes * VEC] acc */
    static_assert(sizeof(TOut) <= sizeof(float), "the dry pass's VEC outputs fit a thread's VEC floats of s_acc");
    float *s_max = smem;
    float *s_sum = s_max + shape.rows * shape.groups;
    float *s_acc = s_sum + shape.rows * shape.groups;
    const int team = shape.lanes * shape.groups;
    const int r = threadIdx.x / team, group = threadIdx.x % team / shape.lanes;
    const int lane = threadIdx.x % shape.lanes;
    const int64_t row = (int64_t)blockIdx.x * shape.rows + r;
    bool active = r < shape.rows && row < c.batch * c.seqlen_q * c.heads;
    const fmha_qr hq = fmha_divide(row, c.heads), ib = fmha_divide(hq.q, c.seqlen_q);
    /* Query i of sequence b, head h: at batch b, row i of the tensors, or with packed
     * sequences at row cu_seqlens_q[b] + i (clamped as the producer clamps it); rows past
     * the sequence's length do nothing but meet the barriers. */
    const int64_t h = hq.r;
    int64_t i = ib.r, b = ib.q;
    if (c.cu_seqlens_q && active) {
        const packed_span s = packed_span_of(c.cu_seqlens_q, b, c.total_q, c.seqlen_q);
        active = i < s.len;
        b = 0;
        i += s.start;
    }
    const float *lse_row = c.lse_partial + b * c.lp_batch_stride + h * c.lp_head_stride + i * c.lp_row_stride;
    const TIn *o_row = static_cast<const TIn *>(c.o_partial) + b * c.op_batch_stride + i * c.op_row_stride +
                       h * c.op_head_stride;
    const int state = r * shape.groups + group;

#pragma unroll 1
    for (int pass = first_pass; pass < 2; pass++) {
        const bool dry = pass == 0;
        if (!dry)
            fmha_wait_prior_grid(); /* launched overlapped: the producer's partials are complete from here */
        for (int64_t d0 = 0; d0 < c.head_dim; d0 += (int64_t)shape.lanes * VEC) {
            const int64_t d = d0 + (int64_t)lane * VEC;
            const bool has = active && d < c.head_dim;
            float m = -INFINITY, sum = 0.f, acc[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[e] = 0.f;
            for (int64_t g0 = group; active && g0 < c.num_splits; g0 += (int64_t)shape.groups * COMBINE_UNROLL) {
                float l[COMBINE_UNROLL], x[COMBINE_UNROLL][VEC];
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; u++) {
                    const int64_t g = g0 + (int64_t)u * shape.groups;
                    l[u] = g < c.num_splits ? load_l2(lse_row + g * c.lp_split_stride) : -INFINITY;
                    /* an empty split (-inf) weighs nothing: its O is not read (the
                     * producer does not write it, fwd_mma.h write_rows) */
                    if (has && l[u] != -INFINITY) {
                        load_features<VEC>(o_row + g * c.op_split_stride + d, x[u]);
                    } else {
#pragma unroll
                        for (int e = 0; e < VEC; e++)
                            x[u][e] = 0.f;
                    }
                }
                float m_new = m;
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; u++)
                    m_new = nan_max(m_new, l[u]);
                if (m_new == -INFINITY)
                    continue; /* only empty splits so far */
                const float rescale = expf(m - m_new);
                sum *= rescale;
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[e] *= rescale;
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; u++) {
                    const float w = expf(l[u] - m_new);
                    sum += w;
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        acc[e] += weighted(w, x[u][e]);
                }
                m = m_new;
            }
            if (active && lane == 0) {
                s_max[state] = m;
                s_sum[state] = sum;
            }
            if (has)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    s_acc[(int64_t)state * shape.lanes * VEC + lane * VEC + e] = acc[e];
            __syncthreads();

            if (has && group == 0) {
                const float *g_max = s_max + r * shape.groups, *g_sum = s_sum + r * shape.groups;
                float top = -INFINITY;
                for (int j = 0; j < shape.groups; j++)
                    top = nan_max(top, g_max[j]);
                float total = 0.f, out_v[VEC];
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    out_v[e] = 0.f;
                if (top != -INFINITY)
                    for (int j = 0; j < shape.groups; j++) {
                        const float f = expf(g_max[j] - top);
                        total += weighted(f, g_sum[j]);
                        const float *a = s_acc + (int64_t)(r * shape.groups + j) * shape.lanes * VEC + lane * VEC;
#pragma unroll
                        for (int e = 0; e < VEC; e++)
                            out_v[e] += weighted(f, a[e]);
                    }
                /* All splits empty: out = 0 and lse = -inf (or the sink). */
                float inv = top == -INFINITY ? 0.f : 1.f / total;
                float lse = top == -INFINITY ? -INFINITY : top + logf(total);
                if (c.sinks)
                    fold_sink(lse, inv, c.sinks[h]);
                /* The dry pass writes to a sink, this thread's own slot of s_acc, which no
                 * other thread reads (select, not branch: one copy of the code). */
                TOut *out = dry ? reinterpret_cast<TOut *>(s_acc + (int64_t)state * shape.lanes * VEC + lane * VEC)
                                : static_cast<TOut *>(c.out) + b * c.o_batch_stride + i * c.o_row_stride +
                                      h * c.o_head_stride + d;
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    if (d + e < c.head_dim)
                        out[e] = store_as<TOut>(out_v[e] * inv);
                if (c.lse && d == 0 && !dry)
                    c.lse[b * c.lse_batch_stride + h * c.lse_head_stride + i * c.lse_row_stride] = lse;
            }
            __syncthreads();
        }
    }
}

/* Whether the partials can be read as 16-byte float4s. */
template <typename TIn> bool vector_partials(const fmha_combine_params &c)
{
    return std::is_same<TIn, float>::value && (uintptr_t)c.o_partial % 16 == 0 && c.head_dim % 4 == 0 &&
           c.op_split_stride % 4 == 0 && c.op_batch_stride % 4 == 0 && c.op_row_stride % 4 == 0 &&
           c.op_head_stride % 4 == 0;
}

template <typename TIn, typename TOut> fmha_status launch_typed(const fmha_combine_params &c, bool overlapped)
{
    const int64_t rows = c.batch * c.seqlen_q * c.heads;
    const bool vec = vector_partials<TIn>(c);
    const combine_shape shape(c.head_dim, c.shape_splits > 0 ? c.shape_splits : c.num_splits, vec ? 4 : 1);
    const int64_t ctas = (rows + shape.rows - 1) / shape.rows;
    if (ctas == 0)
        return FMHA_OK;
    if (ctas > INT32_MAX) {
        record_error("combine grid too large", hipSuccess);
        return FMHA_ERR_UNSUPPORTED;
    }
    /* The dry pass is free only while the producer drains: when the whole grid is
     * placed beside it (one CTA per SM at most).  A larger grid runs it in waves. */
    const int sms = multiprocessors(c.device);
    const bool warm = overlapped && sms > 0 && ctas <= sms;
    auto kernel = vec ? combine_kernel<TIn, TOut, 4> : combine_kernel<TIn, TOut, 1>;
    const hipError_t err = fmha_launch(kernel, dim3((unsigned)ctas), dim3(COMBINE_THREADS), shape.smem_bytes(),
                                       (hipStream_t)c.stream, overlapped, c, shape, warm ? 0 : 1);
    return err == hipSuccess ? FMHA_OK : record_error("combine_kernel", err);
}

template <typename TIn> fmha_status launch_out(const fmha_combine_params &c, bool overlapped)
{
    switch (c.out_dtype) {
    case FMHA_DTYPE_F16: return launch_typed<TIn, fmha_half>(c, overlapped);
    case FMHA_DTYPE_BF16: return launch_typed<TIn, fmha_bf16>(c, overlapped);
    case FMHA_DTYPE_F32: return launch_typed<TIn, float>(c, overlapped);
    }
    return FMHA_ERR_INVALID;
}

}  // namespace

fmha_status launch_combine(const fmha_combine_params &c, bool after_producer)
{
    const bool overlapped = after_producer && overlap_launches(c.device);
    switch (c.in_dtype) {
    case FMHA_DTYPE_F16: return launch_out<fmha_half>(c, overlapped);
    case FMHA_DTYPE_BF16: return launch_out<fmha_bf16>(c, overlapped);
    case FMHA_DTYPE_F32: return launch_out<float>(c, overlapped);
    }
    return FMHA_ERR_INVALID;
}

}  // namespace fmha
