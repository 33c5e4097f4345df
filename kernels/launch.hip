/*
 * launch.hip: the GPU entry points the host code calls (gpu_runtime.h).
 * fmha_rt_launch_fwd appends new keys/values to the cache when asked (dense
 * or paged, per sequence or packed), picks the producer compiled for
 * p->head_dim (the planner has already checked that one exists) and, for
 * plans with partials (p->partials: split plans, or an out dtype other than the
 * inputs'), folds the partials into out with the combine kernel.  Everything is
 * enqueued on p->stream; nothing synchronises.
 */
#include "convert.h"
#include "fwd_sm90.h"
#include "gpu_runtime.h"
#include "launch.h"

namespace fmha {
namespace {

constexpr int APPEND_THREADS = 256;

/* Rows of k_new/v_new the append grid covers per sequence: with packed sequences
 * (cu_seqlens_q) the longest one's, each sequence appending its len_q(b) rows. */
__host__ __device__ inline int64_t append_rows(const fmha_fwd_params &p)
{
    return p.cu_seqlens_q ? p.seqlen_q : p.seqlen_new;
}

/*
 * KV append: row t of sequence b's new keys/values goes to key position
 * seqlens_k[b] + t of its cache (fmha.h): row pos of batch b, or with a block
 * table row pos % page_size of page block_table[b, pos / page_size].  The new
 * rows are k_new/v_new's batch b, or with packed sequences their rows from
 * cu_seqlens_q[b] on (len_q(b) of them).  One thread copies one 16-byte chunk
 * of one row of k or v (the planner's alignment gate guarantees 16-byte rows).
 * Device metadata is not checked on the host: a sequence whose bounds fmha.h's
 * clamp rules reject, or whose rows would not fit in [0, capacity), writes
 * nothing (the producer makes its rows NaN), and nothing is written through a
 * page entry outside [0, num_pages).  KV8: the cache holds e4m3fn codes and the new
 * rows (in T) are quantized on write, x / factor rounded as convert.h's
 * float_to_e4m3 (the CPU backend's rule), a 16-byte chunk of T into 8 codes.
 */
template <typename T, bool KV8>
__global__ void __launch_bounds__(APPEND_THREADS) append_kv_kernel(const fmha_fwd_params p)
{
    constexpr int ELEMS = 16 / sizeof(T);
    const int64_t chunks = p.head_dim / ELEMS, rows = append_rows(p);
    int64_t idx = (int64_t)blockIdx.x * APPEND_THREADS + threadIdx.x;
    const int64_t total = p.batch * rows * p.heads_kv * chunks;
    if (idx >= 2 * total || !p.seqlens_k) /* the host glue sets seqlens_k with every append */
        return;
    const bool is_v = idx >= total;
    idx -= is_v ? total : 0;
    const int64_t c = idx % chunks, hk = idx / chunks % p.heads_kv;
    const int64_t t = idx / chunks / p.heads_kv % rows, b = idx / chunks / p.heads_kv / rows;
    int64_t new_len = p.seqlen_new, src_batch = b, src_row = t;
    if (p.cu_seqlens_q) {
        const packed_span s = packed_span_of(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
        if (s.bad)
            return;
        new_len = s.len;
        src_batch = 0;
        src_row = s.start + t;
    }
    if (t >= new_len)
        return;
    const int64_t cached = p.seqlens_k[b];
    if (cached < 0 || cached + new_len > p.seqlen_k)
        return;
    int64_t dst_batch = b, dst_row = cached + t;
    if (p.block_table) {
        const int64_t page = p.block_table[b * p.block_table_stride + dst_row / p.page_size];
        if (page < 0 || page >= p.num_pages)
            return;
        dst_batch = page; /* the batch stride is the page stride */
        dst_row %= p.page_size;
    }
    const T *src = static_cast<const T *>(is_v ? p.v_new : p.k_new) +
                   src_batch * (is_v ? p.vnew_batch_stride : p.knew_batch_stride) +
                   src_row * (is_v ? p.vnew_row_stride : p.knew_row_stride) +
                   hk * (is_v ? p.vnew_head_stride : p.knew_head_stride) + c * ELEMS;
    /* The cache is declared const in the params (it is read-only for attention);
     * the append is the one writer, and the host glue checked it is writable. */
    using KT = std::conditional_t<KV8, uint8_t, T>;
    KT *dst = const_cast<KT *>(static_cast<const KT *>(is_v ? p.v : p.k)) +
              dst_batch * (is_v ? p.v_batch_stride : p.k_batch_stride) +
              dst_row * (is_v ? p.v_row_stride : p.k_row_stride) +
              hk * (is_v ? p.v_head_stride : p.k_head_stride) + c * ELEMS;
    if constexpr (KV8) {
        const float factor = is_v ? kv_factor(p.v_scale, p.v_scales, p.v_scales_batch_stride,
                                              p.v_scales_head_stride, b, hk)
                                  : kv_factor(p.k_scale, p.k_scales, p.k_scales_batch_stride,
                                              p.k_scales_head_stride, b, hk);
        T x[ELEMS];
        *reinterpret_cast<uint4 *>(x) = *reinterpret_cast<const uint4 *>(src);
        uint32_t codes[ELEMS / 4];
        for (int i = 0; i < ELEMS / 4; i++)
            codes[i] = narrow_to_e4m3x2(load_float(x[4 * i]) / factor, load_float(x[4 * i + 1]) / factor) |
                       narrow_to_e4m3x2(load_float(x[4 * i + 2]) / factor, load_float(x[4 * i + 3]) / factor) << 16;
        *reinterpret_cast<uint2 *>(dst) = make_uint2(codes[0], codes[1]);
    } else {
        *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    }
}

template <typename T> void launch_append_kv(const fmha_fwd_params &p, int64_t ctas)
{
    if (p.kv_dtype == FMHA_DTYPE_E4M3)
        append_kv_kernel<T, true><<<dim3((unsigned)ctas), APPEND_THREADS, 0, (hipStream_t)p.stream>>>(p);
    else
        append_kv_kernel<T, false><<<dim3((unsigned)ctas), APPEND_THREADS, 0, (hipStream_t)p.stream>>>(p);
}

fmha_status launch_append(const fmha_fwd_params &p)
{
    const int64_t total = 2 * p.batch * append_rows(p) * p.heads_kv * (p.head_dim * 2 / 16);
    if (total == 0)
        return FMHA_OK;
    const int64_t ctas = (total + APPEND_THREADS - 1) / APPEND_THREADS;
    if (p.dtype == FMHA_DTYPE_F16)
        launch_append_kv<fmha_half>(p, ctas);
    else
        launch_append_kv<fmha_bf16>(p, ctas);
    return check_launch("append_kv_kernel");
}

constexpr int COPY_THREADS = 256;

/* Element-wise copy between strided [batch, rows, heads, head_dim] layouts. */
__global__ void __launch_bounds__(COPY_THREADS)
copy_rows_kernel(int64_t rows, int64_t heads, int64_t head_dim, int64_t total,
                 fmha_rows_view src, fmha_rows_view dst)
{
    for (int64_t idx = (int64_t)blockIdx.x * COPY_THREADS + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * COPY_THREADS) {
        const int64_t d = idx % head_dim, h = idx / head_dim % heads;
        const int64_t r = idx / head_dim / heads % rows, b = idx / head_dim / heads / rows;
        static_cast<uint16_t *>(dst.data)[b * dst.batch_stride + r * dst.row_stride + h * dst.head_stride + d] =
            static_cast<const uint16_t *>(src.data)[b * src.batch_stride + r * src.row_stride +
                                                    h * src.head_stride + d];
    }
}

fmha_status launch_mma(const fmha_fwd_params &p)
{
    switch (p.head_dim) {
#define FMHA_CASE(hd, bm, bn, w, st, ctas, str) \
    case hd: return launch_fwd_mma_d##hd(p);
        FMHA_GPU_MMA_CONFIGS(FMHA_CASE)
#undef FMHA_CASE
    }
    return FMHA_ERR_UNSUPPORTED;
}

#if !FMHA_DEVICE_IS_AMD
/*
 * The sm90 kernel's plan (one split, no KV cache) run by the tensor-core
 * prefill tiles instead: the same problem with the tiles of their table row,
 * query heads unpacked.
 */
fmha_status launch_mma_instead(const fmha_fwd_params &p)
{
    fmha_fwd_params mma = p;
    mma.kernel = FMHA_KERNEL_GPU_MMA;
    mma.pack_gqa = 0;
    mma.walkers_per_split = 1;
    switch (p.head_dim) {
#define FMHA_CASE(hd, bm, bn, w, st, ctas, wk) \
    case hd:                                   \
        mma.block_m = bm;                      \
        mma.block_n = bn;                      \
        return launch_fwd_mma_d##hd(mma);
        FMHA_GPU_MMA_CONFIGS(FMHA_CASE)
#undef FMHA_CASE
    }
    return FMHA_ERR_UNSUPPORTED;
}
#endif

/*
 * The producer the plan chose.  The sm90 kernel's launcher answers
 * FMHA_ERR_UNSUPPORTED, launching nothing, for what the planner could not
 * see (e.g. a driver without the tensor-map encoder); its plans write out
 * directly, so the tensor-core tiles then run the same problem.
 */
fmha_status launch_producer(const fmha_fwd_params &p)
{
#if !FMHA_DEVICE_IS_AMD
    if (p.kernel == FMHA_KERNEL_GPU_SM90) {
        hipError_t err = hipSuccess;
        const fmha_status st = fmha_sm90_prefill_launch(p, &err, p.schedule);
        if (st == FMHA_ERR_UNSUPPORTED && !p.partials)
            return launch_mma_instead(p);
        return st == FMHA_ERR_RUNTIME ? record_error("fwd_sm90_kernel", err) : st;
    }
#endif
    return launch_mma(p);
}

/* The split scratch seen as combine input (layouts in fmha.h; with packed sequences
 * one batch entry of total_q rows, sequence b's from row cu_seqlens_q[b]). */
fmha_combine_params scratch_combine(const fmha_fwd_params &p)
{
    const int64_t scratch_batch = p.cu_seqlens_q ? 1 : p.batch;
    const int64_t scratch_rows = p.cu_seqlens_q ? p.total_q : p.seqlen_q;
    fmha_combine_params c = {};
    c.num_splits = p.num_splits;
    if (p.device_pieces > 0 && p.batch > 0) {
        const int64_t filled = (p.device_pieces + p.batch - 1) / p.batch + 1;
        c.shape_splits = filled < p.num_splits ? filled : p.num_splits;
    }
    c.batch = p.batch;
    c.seqlen_q = p.seqlen_q;
    c.cu_seqlens_q = p.cu_seqlens_q;
    c.total_q = p.total_q;
    c.heads = p.heads_q;
    c.head_dim = p.head_dim;
    c.in_dtype = FMHA_DTYPE_F32;
    c.out_dtype = p.out_dtype;
    c.o_partial = p.o_accum;
    c.op_head_stride = p.head_dim;
    c.op_row_stride = p.heads_q * p.head_dim;
    c.op_batch_stride = scratch_rows * c.op_row_stride;
    c.op_split_stride = scratch_batch * c.op_batch_stride;
    c.lse_partial = p.lse_accum;
    c.lp_row_stride = 1;
    c.lp_head_stride = scratch_rows;
    c.lp_batch_stride = p.heads_q * scratch_rows;
    c.lp_split_stride = scratch_batch * c.lp_batch_stride;
    c.out = p.out;
    c.o_batch_stride = p.o_batch_stride;
    c.o_row_stride = p.o_row_stride;
    c.o_head_stride = p.o_head_stride;
    c.lse = p.lse;
    c.lse_batch_stride = p.lse_batch_stride;
    c.lse_head_stride = p.lse_head_stride;
    c.lse_row_stride = p.lse_row_stride;
    c.sinks = p.sinks; /* the partials hold no sink: the combine folds it after the merge */
    c.stream = p.stream;
    c.device = p.device;
    return c;
}

}  // namespace
}  // namespace fmha

extern "C" fmha_status fmha_rt_launch_fwd(const fmha_fwd_params *p)
{
    fmha_status st = fmha::use_device(p->device);
    if (st == FMHA_OK)
        st = fmha::check_code_object(p->device);
    if (st == FMHA_OK && p->k_new)
        st = fmha::launch_append(*p);
    if (st == FMHA_OK)
        st = fmha::launch_producer(*p);
    if (st == FMHA_OK && p->partials)
        st = fmha::launch_combine(fmha::scratch_combine(*p), true);
    return st;
}

extern "C" fmha_status fmha_rt_copy_rows(int device, void *stream, int64_t batch, int64_t rows,
                                         int64_t heads, int64_t head_dim, fmha_rows_view src,
                                         fmha_rows_view dst)
{
    constexpr int64_t MAX_CTAS = 1 << 16;
    fmha_status st = fmha::use_device(device);
    if (st == FMHA_OK)
        st = fmha::check_code_object(device);
    const int64_t total = batch * rows * heads * head_dim;
    if (st != FMHA_OK || total == 0)
        return st;
    int64_t ctas = (total + fmha::COPY_THREADS - 1) / fmha::COPY_THREADS;
    ctas = ctas < MAX_CTAS ? ctas : MAX_CTAS;
    fmha::copy_rows_kernel<<<dim3((unsigned)ctas), fmha::COPY_THREADS, 0, (hipStream_t)stream>>>(
        rows, heads, head_dim, total, src, dst);
    return fmha::check_launch("copy_rows_kernel");
}

extern "C" fmha_status fmha_rt_launch_combine(const fmha_combine_params *c)
{
    fmha_status st = fmha::use_device(c->device);
    if (st == FMHA_OK)
        st = fmha::check_code_object(c->device);
    return st == FMHA_OK ? fmha::launch_combine(*c, false) : st;
}
