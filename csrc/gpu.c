/*
 * gpu.c: the GPU backend as the host code sees it.
 *
 * Owns the per-device property cache (read once from the runtime, then served
 * from memory), the split-K scratch (stream-ordered allocations, so a call
 * never synchronises the device and works under graph capture) and the
 * public fmha_gpu_* entry points, and reads FMHA_GPU_PREFILL_KERNEL for the
 * planner.  The runtime calls and kernels themselves
 * are in the .hip files under kernels/, reached through gpu_runtime.h.  In a CPU-only build
 * this file provides the same entry points reporting no device.
 */
#include "fmha.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/*
 * FMHA_GPU_PREFILL_KERNEL=mma|sm90|auto: which prefill kernel GPU plans may
 * take (fmha_prefill_choice), so the old kernel stays selectable for
 * comparisons in one process.  Any other value means auto;
 * fmha_native/__init__.py warns about it (keep the names in step with its
 * _PREFILL_KERNEL_NAMES).  Read once; every thread that races here reads the
 * same variable and stores the same answer.
 */
fmha_prefill_choice fmha_gpu_prefill_choice(void)
{
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("FMHA_GPU_PREFILL_KERNEL");
        v = FMHA_PREFILL_AUTO;
        if (env && strcmp(env, "mma") == 0)
            v = FMHA_PREFILL_MMA;
        else if (env && strcmp(env, "sm90") == 0)
            v = FMHA_PREFILL_SM90;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return (fmha_prefill_choice)v;
}

#if defined(FMHA_WITH_CUDA) || defined(FMHA_WITH_HIP)

#include "gpu_runtime.h"

#include <pthread.h>

/* Device property cache: filled on first use, never changes afterwards. */
static pthread_once_t g_count_once = PTHREAD_ONCE_INIT;
static int g_device_count;
static pthread_mutex_t g_info_lock = PTHREAD_MUTEX_INITIALIZER;
static fmha_device_info *g_info;   /* [g_device_count] */
static unsigned char *g_info_done; /* [g_device_count] */

static void count_devices(void)
{
    g_device_count = fmha_rt_device_count();
    if (g_device_count > 0) {
        g_info = calloc((size_t)g_device_count, sizeof *g_info);
        g_info_done = calloc((size_t)g_device_count, 1);
        if (!g_info || !g_info_done) {
            free(g_info);
            free(g_info_done);
            g_info = NULL;
            g_info_done = NULL;
            g_device_count = 0;
        }
    }
}

int fmha_gpu_compiled(void) { return 1; }

const char *fmha_gpu_platform(void) { return fmha_rt_platform(); }

int fmha_gpu_device_count(void)
{
    pthread_once(&g_count_once, count_devices);
    return g_device_count;
}

fmha_status fmha_gpu_device_info(int ordinal, const fmha_device_info **info)
{
    if (ordinal < 0 || ordinal >= fmha_gpu_device_count())
        return FMHA_ERR_NO_DEVICE;
    fmha_status st = FMHA_OK;
    pthread_mutex_lock(&g_info_lock);
    if (!g_info_done[ordinal]) {
        st = fmha_rt_query_device(ordinal, &g_info[ordinal]);
        g_info_done[ordinal] = st == FMHA_OK;
    }
    pthread_mutex_unlock(&g_info_lock);
    *info = st == FMHA_OK ? &g_info[ordinal] : NULL;
    return st;
}

const char *fmha_gpu_error_string(void) { return fmha_rt_error_string(); }

/* Stream-ordered scratch of one call, freed together at the end. */
#define FMHA_MAX_SCRATCH 8
typedef struct call_scratch {
    int n;
    void *ptr[FMHA_MAX_SCRATCH];
} call_scratch;

static fmha_status scratch_alloc(const fmha_fwd_params *p, call_scratch *s, size_t bytes, void **ptr)
{
    if (s->n == FMHA_MAX_SCRATCH)
        return FMHA_ERR_INVALID;
    fmha_status st = fmha_rt_malloc(p->device, p->stream, bytes ? bytes : 1, ptr);
    if (st == FMHA_OK)
        s->ptr[s->n++] = *ptr;
    return st;
}

static fmha_status scratch_free(const fmha_fwd_params *p, call_scratch *s)
{
    fmha_status first = FMHA_OK;
    for (int i = 0; i < s->n; i++) {
        fmha_status st = fmha_rt_free(p->device, p->stream, s->ptr[i]);
        first = first != FMHA_OK ? first : st;
    }
    s->n = 0;
    return first;
}

/* One [batch, rows, heads, head_dim] operand of the forward, by reference into the params. */
typedef struct operand {
    void **data; /* const-ness of q/k/v is dropped here: staging swaps the pointer */
    int64_t *batch_stride, *row_stride, *head_stride;
    int64_t rows, heads;
    int64_t align;   /* elements each row start must be a multiple of */
    int copy_back;   /* the kernels write it: copy the staged result back */
    int fp8;         /* 1-byte e4m3fn codes (an fp8 KV cache): aligned to align * 2 bytes */
} operand;

/*
 * Kernels read rows in 16-byte chunks and write out in element pairs
 * (fmha.h: FMHA_GPU_ALIGN_*, the rule the planner reports too).  An
 * operand whose rows are not aligned so is copied into compact scratch (and,
 * when the kernels write it, copied back afterwards) - the contract admits any
 * strides, the fast path needs aligned ones.
 */
static fmha_status stage(const fmha_fwd_params *p, call_scratch *s, operand *o, fmha_rows_view *orig)
{
    const int64_t elem = FMHA_GPU_ELEM_BYTES;
    /* An fp8 cache's rows are read in place: the planner's gate refuses unaligned ones. */
    const int64_t align = o->fp8 ? o->align * elem : o->align;
    orig->data = *o->data;
    orig->batch_stride = *o->batch_stride;
    orig->row_stride = *o->row_stride;
    orig->head_stride = *o->head_stride;
    if (!*o->data || fmha_rows_aligned(*o->data, *o->batch_stride, *o->row_stride, *o->head_stride,
                                       p->head_dim, align, o->fp8 ? 1 : elem)) {
        orig->data = NULL; /* nothing staged */
        return FMHA_OK;
    }
    if (o->fp8)
        return FMHA_ERR_INVALID;
    /* Packed and paged rows are read in place: the host glue refuses unaligned
     * device tensors for them (call.c) and copies host arrays compact. */
    if (p->cu_seqlens_q || p->cu_seqlens_k || p->block_table)
        return FMHA_ERR_INVALID;
    /* Compact rows padded to the alignment, so every row start is aligned. */
    const int64_t dim = (p->head_dim + o->align - 1) / o->align * o->align;
    fmha_rows_view copy = {NULL, o->rows * o->heads * dim, o->heads * dim, dim};
    fmha_status st = scratch_alloc(p, s, (size_t)(p->batch * copy.batch_stride * elem), &copy.data);
    if (st == FMHA_OK)
        st = fmha_rt_copy_rows(p->device, p->stream, p->batch, o->rows, o->heads, p->head_dim,
                               *orig, copy);
    if (st != FMHA_OK)
        return st;
    *o->data = copy.data;
    *o->batch_stride = copy.batch_stride;
    *o->row_stride = copy.row_stride;
    *o->head_stride = copy.head_stride;
    return FMHA_OK;
}

static fmha_status run_staged(fmha_fwd_params *p, call_scratch *s)
{
    const int64_t chunk = FMHA_GPU_ALIGN_IN, pair = FMHA_GPU_ALIGN_OUT; /* fmha.h */
    const int append = p->k_new != NULL, fp8 = fmha_kv_dtype(p) == FMHA_DTYPE_E4M3;
    operand ops[] = {
        {(void **)&p->q, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride, p->seqlen_q, p->heads_q, chunk, 0, 0},
        {(void **)&p->k, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride, p->seqlen_k, p->heads_kv, chunk, append, fp8},
        {(void **)&p->v, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride, p->seqlen_k, p->heads_kv, chunk, append, fp8},
        {(void **)&p->k_new, &p->knew_batch_stride, &p->knew_row_stride, &p->knew_head_stride, p->seqlen_new, p->heads_kv, chunk, 0, 0},
        {(void **)&p->v_new, &p->vnew_batch_stride, &p->vnew_row_stride, &p->vnew_head_stride, p->seqlen_new, p->heads_kv, chunk, 0, 0},
        /* An out of another dtype than the inputs' is written by the combine alone, element
         * by element: any layout (the planner's alignment rule, plan.c qkvo_aligned). */
        {&p->out, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride, p->seqlen_q, p->heads_q,
         p->out_dtype != p->dtype ? 1 : pair, 1, 0},
    };
    enum { N_OPS = sizeof ops / sizeof ops[0] };
    fmha_rows_view orig[N_OPS];
    fmha_status st = FMHA_OK;
    for (int i = 0; i < N_OPS && st == FMHA_OK; i++)
        st = stage(p, s, &ops[i], &orig[i]);
    if (st != FMHA_OK)
        return st;

    if (p->partials) {
        /* Split partials: [num_splits, batch, seqlen_q, heads_q, head_dim] and
         * [num_splits, batch, heads_q, seqlen_q], fp32; packed queries: batch 1
         * and seqlen_q = total_q (fmha.h). */
        size_t query_rows = p->cu_seqlens_q ? (size_t)p->total_q
                                            : (size_t)p->batch * (size_t)p->seqlen_q;
        size_t rows = (size_t)p->num_splits * query_rows * (size_t)p->heads_q;
        size_t o_bytes = rows * (size_t)p->head_dim * sizeof(float);
        void *partials = NULL;
        st = scratch_alloc(p, s, o_bytes + rows * sizeof(float), &partials);
        if (st != FMHA_OK)
            return st;
        p->o_accum = (float *)partials;
        p->lse_accum = (float *)((char *)partials + o_bytes);
    }
    st = fmha_rt_launch_fwd(p);

    for (int i = 0; i < N_OPS && st == FMHA_OK; i++) {
        if (!orig[i].data || !ops[i].copy_back)
            continue;
        fmha_rows_view staged = {*ops[i].data, *ops[i].batch_stride, *ops[i].row_stride,
                                 *ops[i].head_stride};
        st = fmha_rt_copy_rows(p->device, p->stream, p->batch, ops[i].rows, ops[i].heads,
                               p->head_dim, staged, orig[i]);
    }
    return st;
}

fmha_status fmha_gpu_fwd(fmha_fwd_params *p)
{
    fmha_fwd_params work = *p; /* staging rewrites pointers and strides: not the caller's */
    call_scratch s = {0, {NULL}};
    work.o_accum = NULL;
    work.lse_accum = NULL;
    fmha_status st = run_staged(&work, &s);
    fmha_status st_free = scratch_free(&work, &s);
    return st != FMHA_OK ? st : st_free;
}

fmha_status fmha_gpu_combine(const fmha_combine_params *c) { return fmha_rt_launch_combine(c); }

fmha_status fmha_gpu_malloc(int device, void *stream, size_t bytes, void **ptr)
{
    return fmha_rt_malloc(device, stream, bytes, ptr);
}

fmha_status fmha_gpu_free(int device, void *stream, void *ptr)
{
    return fmha_rt_free(device, stream, ptr);
}

fmha_status fmha_gpu_memcpy(int device, void *stream, void *dst, const void *src, size_t bytes,
                            fmha_copy_kind kind)
{
    return fmha_rt_memcpy(device, stream, dst, src, bytes, kind);
}

fmha_status fmha_gpu_stream_sync(int device, void *stream)
{
    return fmha_rt_stream_sync(device, stream);
}

#else /* CPU-only build: a GPU backend that is absent, not broken */

int fmha_gpu_compiled(void) { return 0; }
const char *fmha_gpu_platform(void) { return "none"; }
int fmha_gpu_device_count(void) { return 0; }
const char *fmha_gpu_error_string(void) { return "fmha_native was built without a GPU backend"; }

fmha_status fmha_gpu_device_info(int ordinal, const fmha_device_info **info)
{
    (void)ordinal;
    *info = NULL;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_fwd(fmha_fwd_params *p)
{
    (void)p;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_combine(const fmha_combine_params *c)
{
    (void)c;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_malloc(int device, void *stream, size_t bytes, void **ptr)
{
    (void)device, (void)stream, (void)bytes;
    *ptr = NULL;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_free(int device, void *stream, void *ptr)
{
    (void)device, (void)stream, (void)ptr;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_memcpy(int device, void *stream, void *dst, const void *src, size_t bytes,
                            fmha_copy_kind kind)
{
    (void)device, (void)stream, (void)dst, (void)src, (void)bytes, (void)kind;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_stream_sync(int device, void *stream)
{
    (void)device, (void)stream;
    return FMHA_ERR_NO_DEVICE;
}

#endif
