/*
 * call.c: the lifecycle of one forward, explain or combine call.
 *
 * Owns the order in which a call goes down the layers and releases what it
 * took on the way: parse (args.c), open the tensors (tensor.c), validate
 * (validate.c), fill fmha_fwd_params, choose the backend and plan once
 * (plan.c), place memory (host copies, GPU staging, outputs allocated where
 * the inputs live), run the backend with the GIL released, write results
 * back and wrap the outputs.  explain() takes the same path up to the plan
 * and hands it to explain.c, the only place a plan becomes words.
 *
 * Style: nothing the caller passed is written before validation has
 * finished; every path ends in the close function of its call.
 */
#include "call.h"

#include <math.h>
#include <string.h>

#include "args.h"
#include "dlpack_out.h"
#include "explain.h"
#include "host_array.h"
#include "module.h"
#include "tensor.h"
#include "validate.h"

/* log2(e): the kernels compute exp(x) as exp2(x * log2(e)). */
static const double fmha_log2e = 1.4426950408889634;

/* The output a call returns, as a new reference: the caller's (given; already
 * opened as view), or else one allocated where the inputs live and viewed for
 * writing; like (or NULL) lends a NumPy output its dtype object. */
static PyObject *take_output(const fmha_module_state *st, fmha_open_ctx *ctx, PyObject *given,
                             const fmha_tensor *like, int on_gpu, int device, int ndim,
                             const int64_t *shape, fmha_elem elem, fmha_tensor *view)
{
    if (given != Py_None) {
        Py_INCREF(given);
        return given;
    }
    PyObject *obj = on_gpu ? fmha_device_tensor_new(st, device, ctx->stream, ndim, shape, elem)
                           : fmha_host_array_new(like, ndim, shape, elem);
    if (!obj)
        return NULL;
    if (fmha_tensor_open(obj, FMHA_OPEN_WRITE, ctx, view) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

/* ------------------------------------------------------------------------ */
/* forward / explain                                                         */
/* ------------------------------------------------------------------------ */

typedef struct fmha_fwd_call {
    fmha_fwd_args a;
    fmha_open_ctx ctx;
    fmha_fwd_views t;
    int append;                 /* k_new/v_new are written into k/v */
    fmha_fwd_geometry g;        /* modes and sizes, from validation */
    fmha_cache_lengths lengths;

    /* decision */
    fmha_fwd_params p;
    fmha_backend backend;
    int gpu_device;
    const fmha_device_info *dev_info;
    int empty;                  /* batch or seqlen_q (packed: total_q) is 0: nothing runs */
    fmha_status plan_status;
    fmha_plan plan;
    int gpu_rejected;           /* device=None on host arrays: the GPU gate said no */
    fmha_plan gpu_plan;

    /* run */
    PyObject *out_obj, *lse_obj; /* strong references to the returned outputs */
    int staged;                  /* host arrays were copied to a GPU */
    int need_sync;               /* ... and the call must wait for the stream */
    int synced;
} fmha_fwd_call;

static void fwd_close(fmha_fwd_call *c)
{
    if (c->staged && !c->synced && (c->need_sync || PyErr_Occurred())) {
        /* Uploads may still read host copies that close frees. */
        Py_BEGIN_ALLOW_THREADS
        (void)fmha_gpu_stream_sync(c->gpu_device, c->ctx.stream);
        Py_END_ALLOW_THREADS
        c->synced = 1;
    }
    fmha_tensor *views[] = {&c->t.q,     &c->t.k,     &c->t.v,           &c->t.out,
                            &c->t.lse,   &c->t.seqlens, &c->t.k_new,     &c->t.v_new,
                            &c->t.block_table, &c->t.cu_q, &c->t.cu_k, &c->t.sinks,
                            &c->t.k_scale, &c->t.v_scale};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++)
        fmha_tensor_close(views[i]);
    Py_CLEAR(c->out_obj);
    Py_CLEAR(c->lse_obj);
}

/* Open every tensor argument that was given. */
static int fwd_open(fmha_module_state *st, fmha_fwd_call *c)
{
    const fmha_fwd_args *a = &c->a;
    struct {
        PyObject *obj;
        fmha_tensor *view;
        const char *name;
        unsigned flags;
    } args[] = {
        {a->q, &c->t.q, "q", 0},
        {a->k, &c->t.k, "k", c->append ? FMHA_OPEN_WRITE : 0},
        {a->v, &c->t.v, "v", c->append ? FMHA_OPEN_WRITE : 0},
        {a->out, &c->t.out, "out", FMHA_OPEN_WRITE},
        {a->lse, &c->t.lse, "lse", FMHA_OPEN_WRITE},
        {a->cache_seqlens, &c->t.seqlens, "cache_seqlens", 0},
        {a->k_new, &c->t.k_new, "k_new", 0},
        {a->v_new, &c->t.v_new, "v_new", 0},
        {a->block_table, &c->t.block_table, "block_table", 0},
        {a->cu_seqlens_q, &c->t.cu_q, "cu_seqlens_q", 0},
        {a->cu_seqlens_k, &c->t.cu_k, "cu_seqlens_k", 0},
        {a->sinks, &c->t.sinks, "sinks", 0},
        {a->k_scale.obj, &c->t.k_scale, "k_scale", 0},
        {a->v_scale.obj, &c->t.v_scale, "v_scale", 0},
    };
    size_t n = sizeof args / sizeof args[0];
    for (size_t i = 0; i < n; i++)
        fmha_tensor_init(args[i].view, args[i].name);
    fmha_open_ctx_init(&c->ctx, st, c->a.stream.handle);
    /* q, k and v are required: None is an error of theirs (open says so). */
    for (size_t i = 0; i < n; i++)
        if ((i < 3 || args[i].obj != Py_None) &&
            fmha_tensor_open(args[i].obj, args[i].flags, &c->ctx, args[i].view) < 0)
            return -1;
    return 0;
}

/* The problem fields of the params (pointers come with fwd_fill_pointers),
 * from the geometry validation found (fmha.h: packed sequences and a paged
 * KV cache). */
static void fwd_fill_problem(fmha_fwd_call *c)
{
    fmha_fwd_params *p = &c->p;
    const fmha_fwd_geometry *g = &c->g;
    memset(p, 0, sizeof *p);
    p->batch = g->batch;
    p->seqlen_q = g->seqlen_q;
    p->heads_q = g->heads_q;
    p->head_dim = g->head_dim;
    p->seqlen_k = g->seqlen_k;
    p->heads_kv = g->heads_kv;
    p->dtype = (fmha_dtype)c->t.q.elem;
    /* out's dtype: the caller's out (validated: q's or float32), else out_dtype's */
    p->out_dtype = c->t.out.present ? (fmha_dtype)c->t.out.elem
                   : c->a.out_f32   ? FMHA_DTYPE_F32
                                    : p->dtype;
    p->causal = c->a.causal;
    double scale = c->a.scale.given ? c->a.scale.value : 1.0 / sqrt((double)p->head_dim);
    p->softmax_scale = (float)scale;
    p->scale_log2 = (float)(scale * fmha_log2e);
    p->window_left = c->a.window.given ? (int64_t)c->a.window.left : -1;
    p->window_right = c->a.window.given ? (int64_t)c->a.window.right : -1;
    p->softcap = (float)c->a.softcap;
    /* Only its presence counts until fwd_fill_pointers points it at placed memory. */
    static const float sinks_present = 0.0f;
    p->sinks = c->t.sinks.present ? &sinks_present : NULL;
    /* fp8 KV cache (issue 22): a number's factor here, an array's in fwd_fill_pointers. */
    p->kv_dtype = g->kv_fp8 ? FMHA_DTYPE_E4M3 : p->dtype;
    p->k_scale = (float)c->a.k_scale.value;
    p->v_scale = (float)c->a.v_scale.value;
    p->seqlen_new = c->append ? g->seqlen_new : 0;
    p->total_q = g->varlen_q ? g->total_q : 0;
    p->total_k = g->varlen_k ? g->total_k : 0;
    p->page_size = g->paged ? g->page_size : 0;
    p->num_pages = g->paged ? g->num_pages : 0;
    p->stream = c->ctx.stream;
    p->num_threads = 0;
    c->empty = p->batch == 0 || p->seqlen_q == 0 || (g->varlen_q && g->total_q == 0);
}

/* Element strides of a [batch, rows, heads, head_dim] view, or of a packed
 * [rows, heads, head_dim] one (batch stride 0: unused with cu_seqlens), into
 * three params fields (head_dim stride is 1). */
static void strides3(const fmha_tensor *t, int64_t *batch, int64_t *row, int64_t *head)
{
    int packed = t->ndim == 3;
    *batch = packed ? 0 : t->strides[0];
    *row = t->strides[packed ? 0 : 1];
    *head = t->strides[packed ? 1 : 2];
}

/* The params' lse pointer and strides: t's own memory ([batch, heads_q,
 * seqlen_q], or packed [heads_q, total_q] with batch stride 0). */
static void lse_layout(const fmha_tensor *t, fmha_fwd_params *p)
{
    int packed = t->ndim == 2;
    p->lse = t->data;
    p->lse_batch_stride = packed ? 0 : t->strides[0];
    p->lse_head_stride = t->strides[packed ? 0 : 1];
    p->lse_row_stride = t->strides[packed ? 1 : 2];
}

/* Pointer and strides the backend will see for t: its own memory, or (when
 * staged or allocated by us) a compact buffer, whose allocation is aligned
 * for any vector access and whose address is not known yet (NULL stands for
 * it, which the planner's alignment rule treats alike). */
static void planned_layout(const fmha_tensor *t, int compact, const void **ptr, int64_t *batch,
                           int64_t *row, int64_t *head)
{
    if (compact) {
        int n = t->ndim;
        *ptr = NULL;
        *head = t->shape[n - 1];
        *row = t->shape[n - 2] * *head;
        *batch = n == 4 ? t->shape[1] * *row : 0;
    } else {
        *ptr = t->data;
        strides3(t, batch, row, head);
    }
}

/* What the planner is told about backend (the GPU: the call's device). */
static void fill_target(const fmha_fwd_call *c, fmha_backend backend, fmha_target *target)
{
    memset(target, 0, sizeof *target);
    target->backend = backend;
    target->num_threads = fmha_cpu_num_threads();
    target->device = backend == FMHA_BACKEND_GPU ? c->dev_info : NULL;
    target->gpu_compiled = fmha_gpu_compiled();
    target->prefill = fmha_gpu_prefill_choice();
}

/*
 * Plan for one backend on the layout the backend will get once memory is
 * placed, so that the one plan made before placement is the plan that runs
 * (and the plan explain shows).  With host cache_seqlens the planner sees the
 * longest cache length as seqlen_k and the sum of all keys.  Device lengths
 * are never read here (no copy, no sync: a graph-captured decode replays with
 * new lengths), so the plan is length-independent: made for max_seqlen_k
 * keys, or the capacity, and the kernels stop at each sequence's length.
 */
static fmha_status plan_for(const fmha_fwd_call *c, fmha_backend backend, fmha_plan *plan)
{
    fmha_target target;
    fill_target(c, backend, &target);
    fmha_fwd_params planned = c->p;
    fmha_fwd_params *p = &planned;
    const fmha_fwd_views *t = &c->t;
    int gpu = backend == FMHA_BACKEND_GPU;
    const void *out_ptr = NULL;
    planned_layout(&t->q, gpu && !t->q.on_gpu, &p->q, &p->q_batch_stride, &p->q_row_stride,
                   &p->q_head_stride);
    planned_layout(&t->k, gpu && !t->k.on_gpu, &p->k, &p->k_batch_stride, &p->k_row_stride,
                   &p->k_head_stride);
    planned_layout(&t->v, gpu && !t->v.on_gpu, &p->v, &p->v_batch_stride, &p->v_row_stride,
                   &p->v_head_stride);
    /* An output we allocate is compact, like a staged copy of q. */
    const fmha_tensor *out = t->out.present ? &t->out : &t->q;
    planned_layout(out, !t->out.present || (gpu && !t->out.on_gpu), &out_ptr,
                   &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
    p->out = (void *)(uintptr_t)out_ptr;
    if (t->lse.present && !(gpu && !t->lse.on_gpu))
        lse_layout(&t->lse, p);
    if (c->append) {
        planned_layout(&t->k_new, gpu && !t->k_new.on_gpu, &p->k_new, &p->knew_batch_stride,
                       &p->knew_row_stride, &p->knew_head_stride);
        planned_layout(&t->v_new, gpu && !t->v_new.on_gpu, &p->v_new, &p->vnew_batch_stride,
                       &p->vnew_row_stride, &p->vnew_head_stride);
    }
    /* Only their presence matters to the planner, which reads nothing behind them. */
    static const int32_t present = 0;
    p->seqlens_k = t->seqlens.present ? &present : NULL;
    p->block_table = t->block_table.present ? &present : NULL;
    p->cu_seqlens_q = t->cu_q.present ? &present : NULL;
    p->cu_seqlens_k = t->cu_k.present ? &present : NULL;
    if (c->lengths.known) {
        /* fmha_num_key_blocks adds the appended rows to a cache's keys */
        p->seqlen_k = c->lengths.max_keys - (p->seqlens_k ? p->seqlen_new : 0);
        p->total_keys = c->lengths.total_keys;
    } else if (p->seqlens_k) {
        int64_t keys = c->a.max_seqlen_k.given ? c->a.max_seqlen_k.value : p->seqlen_k;
        p->seqlen_k = keys > p->seqlen_new ? keys - p->seqlen_new : 0;
        p->total_keys = 0;
    }
    return fmha_plan_make(p, &target, c->a.num_splits, plan);
}

/* Choose the backend and make the call's one plan. */
static int fwd_plan(fmha_module_state *st, fmha_fwd_call *c)
{
    int want_gpu = c->t.q.on_gpu || c->a.device == FMHA_DEVICE_GPU ||
                   (c->a.device == FMHA_DEVICE_AUTO && fmha_gpu_device_count() > 0 && !c->empty);
    c->gpu_device = c->t.q.on_gpu ? c->t.q.device_id : 0;
    c->p.device = c->gpu_device;
    if (want_gpu) {
        fmha_status status = fmha_gpu_device_info(c->gpu_device, &c->dev_info);
        if (fmha_raise_status(st, status, "reading the GPU's properties") < 0)
            return -1;
    }
    c->backend = want_gpu ? FMHA_BACKEND_GPU : FMHA_BACKEND_CPU;
    if (c->empty) {
        /* Nothing runs: no plan (explain says so). */
        c->plan_status = FMHA_OK;
        return 0;
    }
    c->plan_status = plan_for(c, c->backend, &c->plan);
    if (c->plan_status == FMHA_ERR_UNSUPPORTED && c->backend == FMHA_BACKEND_GPU &&
        c->a.device == FMHA_DEVICE_AUTO && !c->t.q.on_gpu) {
        /* Host arrays with device=None: the CPU runs what the GPU cannot. */
        c->gpu_rejected = 1;
        c->gpu_plan = c->plan;
        c->backend = FMHA_BACKEND_CPU;
        c->plan_status = plan_for(c, c->backend, &c->plan);
    }
    if (c->plan_status != FMHA_OK && c->plan_status != FMHA_ERR_UNSUPPORTED)
        return fmha_raise_status(st, c->plan_status, "planning");
    return 0;
}

/* How an fp8 scale was given: a number or a 0-d array is per tensor. */
static fmha_scale_kind scale_kind(const fmha_opt_kv_scale *a, const fmha_tensor *t)
{
    if (!a->given)
        return FMHA_SCALE_NONE;
    if (!t->present || t->ndim == 0)
        return FMHA_SCALE_TENSOR;
    return t->ndim == 1 ? FMHA_SCALE_HEAD : FMHA_SCALE_BATCH_HEAD;
}

/* The call as explain.c describes it. */
static fmha_explain_input explain_input(const fmha_fwd_call *c, fmha_target *target,
                                        fmha_target *gpu_target)
{
    fill_target(c, c->backend, target);
    fill_target(c, FMHA_BACKEND_GPU, gpu_target);
    fmha_explain_input in = {
        .p = &c->p, .target = target, .plan = &c->plan,
        .k_scale_kind = scale_kind(&c->a.k_scale, &c->t.k_scale),
        .v_scale_kind = scale_kind(&c->a.v_scale, &c->t.v_scale),
        .requested_splits = c->a.num_splits,
        .kv_cache = c->t.seqlens.present,
        .inputs_on_host = !c->t.q.on_gpu, .device_ordinal = c->gpu_device,
        .gpu_rejected = c->gpu_rejected ? &c->gpu_plan : NULL,
        .gpu_rejected_target = c->gpu_rejected ? gpu_target : NULL, .empty = c->empty,
        .length_independent = c->t.seqlens.present && !c->lengths.known,
        .planned_keys = c->a.max_seqlen_k.given ? c->a.max_seqlen_k.value : c->p.seqlen_k,
        .serving = {
            .paged = c->g.paged, .page_size = c->g.page_size, .num_pages = c->g.num_pages,
            .max_blocks = c->g.max_blocks,
            .varlen_q = c->g.varlen_q, .varlen_k = c->g.varlen_k,
            .total_q = c->g.total_q, .total_k = c->g.total_k,
            .max_seqlen_q = c->g.seqlen_q, .max_seqlen_k = c->g.seqlen_k,
            .q_source = c->g.q_source, .k_source = c->g.k_source,
        },
    };
    return in;
}

/*
 * The GPU kernels read packed and paged rows in place: gpu.c stages no
 * aligned copy of them (a copy of a paged cache would cost the whole pool,
 * and packed rows have no per-batch layout to copy by).  Host arrays are
 * copied compact, so only device tensors can fail here.
 */
static int require_rows_aligned(const fmha_fwd_call *c)
{
    const fmha_fwd_views *t = &c->t;
    const fmha_tensor *in[] = {&t->q, &t->k, &t->v, &t->k_new, &t->v_new};
    for (size_t i = 0; i < sizeof in / sizeof in[0] + 1; i++) {
        const fmha_tensor *x = i < sizeof in / sizeof in[0] ? in[i] : &t->out;
        /* an out of another dtype than q's is written by the combine alone: any layout */
        int64_t align = x != &t->out ? FMHA_GPU_ALIGN_IN
                        : x->elem == t->q.elem ? FMHA_GPU_ALIGN_OUT : 1;
        int64_t bs, rs, hs;
        if (!x->present || !x->on_gpu || fmha_tensor_numel(x) == 0)
            continue;
        /* 1-byte fp8 codes (uint8 storage too): the same bytes */
        const int64_t elem = fmha_elem_size(x->elem) == 1 ? 1 : FMHA_GPU_ELEM_BYTES;
        if (elem == 1)
            align *= FMHA_GPU_ELEM_BYTES;
        strides3(x, &bs, &rs, &hs);
        if (!fmha_rows_aligned(x->data, bs, rs, hs, c->p.head_dim, align, elem)) {
            PyErr_Format(PyExc_ValueError, "%s: on the GPU, packed (cu_seqlens_q/cu_seqlens_k) "
                         "and paged (block_table) calls read rows in place, so every row must "
                         "start on a %d-byte boundary (data pointer and strides multiples of "
                         "%lld elements); make %s contiguous first", x->name,
                         (int)(align * elem), (long long)align, x->name);
            return -1;
        }
    }
    return 0;
}

/* Everything up to (and including) the plan; runs nothing, writes nothing. */
static int fwd_prepare(fmha_module_state *st, fmha_fwd_call *c)
{
    c->append = c->a.k_new != Py_None && c->a.v_new != Py_None && c->a.cache_seqlens != Py_None;
    if (fwd_open(st, c) < 0 ||
        fmha_validate_forward(st, &c->t, &c->a, c->append, c->ctx.stream, &c->g,
                              &c->lengths) < 0)
        return -1;
    fwd_fill_problem(c);
    if (fwd_plan(st, c) < 0)
        return -1;
    if (c->backend == FMHA_BACKEND_GPU && !c->empty && c->plan_status == FMHA_OK &&
        (c->g.paged || c->g.varlen_q) && require_rows_aligned(c) < 0)
        return -1;
    return 0;
}

/* Outputs: the caller's, or new ones where the inputs live. */
static int fwd_outputs(fmha_module_state *st, fmha_fwd_call *c)
{
    int on_gpu = c->t.q.on_gpu;
    /* Packed: lse [heads_q, total_q], FlashAttention's varlen layout. */
    int64_t lse_shape[3] = {c->p.batch, c->p.heads_q, c->p.seqlen_q};
    int64_t packed_lse_shape[2] = {c->g.heads_q, c->g.total_q};
    int packed = c->g.varlen_q;
    if (!(c->out_obj = take_output(st, &c->ctx, c->a.out, &c->t.q, on_gpu, c->gpu_device,
                                   c->t.q.ndim, c->t.q.shape, (fmha_elem)c->p.out_dtype,
                                   &c->t.out)))
        return -1;
    if ((c->a.lse != Py_None || c->a.return_lse) &&
        !(c->lse_obj = take_output(st, &c->ctx, c->a.lse, NULL, on_gpu, c->gpu_device,
                                   packed ? 2 : 3, packed ? packed_lse_shape : lse_shape,
                                   FMHA_ELEM_F32, &c->t.lse)))
        return -1;
    return 0;
}

/* Copy host memory to the GPU, or point the CPU backend at usable memory. */
static int fwd_place_memory(const fmha_module_state *st, fmha_fwd_call *c)
{
    fmha_tensor *inputs[] = {&c->t.q,       &c->t.k,           &c->t.v,    &c->t.k_new,
                             &c->t.v_new,   &c->t.seqlens,     &c->t.cu_q, &c->t.cu_k,
                             &c->t.block_table, &c->t.sinks, &c->t.k_scale, &c->t.v_scale};
    fmha_tensor *outputs[] = {&c->t.out, &c->t.lse};
    if (c->backend == FMHA_BACKEND_CPU) {
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
            if (inputs[i]->present && fmha_tensor_host_prepare(inputs[i], 1, 1) < 0)
                return -1;
        if (fmha_tensor_host_prepare(&c->t.out, 1, 0) < 0)
            return -1;
        if (c->t.lse.present && fmha_tensor_host_prepare(&c->t.lse, 0, 0) < 0)
            return -1;
        return 0;
    }
    /*
     * GPU: host arrays (all of them, or only cache_seqlens next to device
     * tensors) get device copies.  Host results need a stream sync; so does
     * an upload from a host copy that fwd_close frees.  An upload straight
     * from the caller's pageable memory has been read when the copy call
     * returns (CUDA and HIP semantics for pageable sources), so device
     * tensors with a host cache_seqlens stay asynchronous.
     */
    fmha_status status = FMHA_OK;
    for (size_t i = 0; status == FMHA_OK && i < sizeof inputs / sizeof inputs[0]; i++) {
        if (inputs[i]->present && !inputs[i]->on_gpu) {
            c->staged = 1;
            status = fmha_tensor_stage(inputs[i], c->gpu_device, c->ctx.stream, 1);
            c->need_sync |= inputs[i]->host_copy != NULL;
        }
    }
    for (size_t i = 0; status == FMHA_OK && i < sizeof outputs / sizeof outputs[0]; i++) {
        if (outputs[i]->present && !outputs[i]->on_gpu) {
            c->staged = 1;
            c->need_sync = 1;
            status = fmha_tensor_stage(outputs[i], c->gpu_device, c->ctx.stream, 0);
        }
    }
    return fmha_raise_status(st, status, "copying host arrays to the GPU");
}

/* An fp8 scale array's pointer and (batch, kv head) strides: [] and [heads_kv] have
 * batch stride 0, [] head stride 0 too; NULL when not given. */
static void scale_layout(const fmha_tensor *t, const float **ptr, int64_t *batch, int64_t *head)
{
    *ptr = t->present ? (const float *)t->data : NULL;
    *batch = t->present && t->ndim == 2 ? t->strides[0] : 0;
    *head = t->present && t->ndim >= 1 ? t->strides[t->ndim - 1] : 0;
}

/* Point the params at the views' (possibly copied or staged) memory. */
static void fwd_fill_pointers(fmha_fwd_call *c)
{
    fmha_fwd_params *p = &c->p;
    const fmha_fwd_views *t = &c->t;
    p->q = t->q.data;
    p->k = t->k.data;
    p->v = t->v.data;
    p->out = t->out.data;
    strides3(&t->q, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
    strides3(&t->k, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride);
    strides3(&t->v, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride);
    strides3(&t->out, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
    p->lse = NULL;
    if (t->lse.present)
        lse_layout(&t->lse, p);
    p->seqlens_k = t->seqlens.present ? (const int32_t *)t->seqlens.data : NULL;
    p->cu_seqlens_q = t->cu_q.present ? (const int32_t *)t->cu_q.data : NULL;
    p->cu_seqlens_k = t->cu_k.present ? (const int32_t *)t->cu_k.data : NULL;
    p->block_table = t->block_table.present ? (const int32_t *)t->block_table.data : NULL;
    p->block_table_stride = t->block_table.present ? t->block_table.strides[0] : 0;
    p->sinks = t->sinks.present ? (const float *)t->sinks.data : NULL;
    scale_layout(&t->k_scale, &p->k_scales, &p->k_scales_batch_stride, &p->k_scales_head_stride);
    scale_layout(&t->v_scale, &p->v_scales, &p->v_scales_batch_stride, &p->v_scales_head_stride);
    if (c->append) {
        p->k_new = t->k_new.data;
        p->v_new = t->v_new.data;
        strides3(&t->k_new, &p->knew_batch_stride, &p->knew_row_stride, &p->knew_head_stride);
        strides3(&t->v_new, &p->vnew_batch_stride, &p->vnew_row_stride, &p->vnew_head_stride);
    }
}

/* Outputs of a problem with no keys at all, written here on the host. */
static void fill_no_keys(fmha_fwd_call *c)
{
    const float neg_inf = -INFINITY;
    const unsigned char zero_bytes[sizeof(float)] = {0}; /* +0 in every element type */
    fmha_tensor_fill_host(&c->t.out, zero_bytes);
    if (c->t.lse.present)
        fmha_tensor_fill_host(&c->t.lse, &neg_inf);
}

/* Run the backend on the placed memory (GIL released) and finish the writes. */
static int fwd_execute(fmha_module_state *st, fmha_fwd_call *c)
{
    int gpu = c->backend == FMHA_BACKEND_GPU;
    fmha_plan_apply(&c->plan, &c->p);
    fmha_status status, sync_status = FMHA_OK;
    fmha_tensor *written[] = {&c->t.out, &c->t.lse, c->append ? &c->t.k : NULL,
                              c->append ? &c->t.v : NULL};
    size_t n_written = sizeof written / sizeof written[0];
    Py_BEGIN_ALLOW_THREADS
    status = gpu ? fmha_gpu_fwd(&c->p) : fmha_cpu_fwd(&c->p);
    if (c->need_sync) {
        for (size_t i = 0; status == FMHA_OK && i < n_written; i++)
            if (written[i])
                status = fmha_tensor_download(written[i]);
        sync_status = fmha_gpu_stream_sync(c->gpu_device, c->ctx.stream);
        c->synced = 1;
    }
    Py_END_ALLOW_THREADS
    if (status == FMHA_OK)
        status = sync_status;
    if (fmha_raise_status(st, status, gpu ? "GPU forward" : "CPU forward") < 0)
        return -1;
    for (size_t i = 0; i < n_written; i++) {
        if (!written[i])
            continue;
        if (written[i]->on_gpu)
            fmha_tensor_mark_written(written[i], c->ctx.stream);
        else
            fmha_tensor_host_writeback(written[i]);
    }
    return 0;
}

static PyObject *fwd_run(fmha_module_state *st, fmha_fwd_call *c)
{
    if (c->plan_status == FMHA_ERR_UNSUPPORTED) {
        fmha_target target, gpu_target;
        fmha_explain_input in = explain_input(c, &target, &gpu_target);
        return fmha_explain_raise_unsupported(&in);
    }
    if (fwd_outputs(st, c) < 0)
        return NULL;
    /* No keys at all: (0, -inf) everywhere, written here; with sinks each row's lse is its
     * head's sink, which the backend writes. */
    if (!c->empty && c->p.seqlen_k == 0 && !c->t.out.on_gpu && !c->t.sinks.present) {
        fill_no_keys(c);
    } else if (!c->empty) {
        if (fwd_place_memory(st, c) < 0)
            return NULL;
        fwd_fill_pointers(c);
        if (fwd_execute(st, c) < 0)
            return NULL;
    }
    if (!c->a.return_lse) {
        Py_INCREF(c->out_obj);
        return c->out_obj;
    }
    return PyTuple_Pack(2, c->out_obj, c->lse_obj);
}

static PyObject *fwd_explain(fmha_module_state *st, fmha_fwd_call *c)
{
    (void)st;
    fmha_target target, gpu_target;
    fmha_explain_input in = explain_input(c, &target, &gpu_target);
    return fmha_explain_dict(&in);
}

/* forward and explain: parse and prepare the same call, then `finish` it. */
static PyObject *fwd_call(PyObject *module, const char *name, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames,
                          PyObject *(*finish)(fmha_module_state *, fmha_fwd_call *))
{
    fmha_module_state *st = PyModule_GetState(module);
    fmha_fwd_call c;
    PyObject *result = NULL;
    memset(&c, 0, sizeof c);
    if (fmha_parse_forward(st, name, args, nargs, kwnames, &c.a) >= 0 &&
        fwd_prepare(st, &c) >= 0)
        result = finish(st, &c);
    fwd_close(&c);
    return result;
}

PyObject *fmha_call_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    return fwd_call(module, "forward", args, nargs, kwnames, fwd_run);
}

PyObject *fmha_call_explain(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    return fwd_call(module, "explain", args, nargs, kwnames, fwd_explain);
}

/* ------------------------------------------------------------------------ */
/* combine                                                                   */
/* ------------------------------------------------------------------------ */

/* The combine parameters for the views' (placed) memory. */
static void combine_fill(const fmha_combine_views *t, void *stream, fmha_combine_params *cp)
{
    memset(cp, 0, sizeof *cp);
    cp->num_splits = t->outs.shape[0];
    cp->batch = t->outs.shape[1];
    cp->seqlen_q = t->outs.shape[2];
    cp->heads = t->outs.shape[3];
    cp->head_dim = t->outs.shape[4];
    cp->in_dtype = (fmha_dtype)t->outs.elem;
    cp->out_dtype = (fmha_dtype)t->out.elem;
    cp->o_partial = t->outs.data;
    cp->op_split_stride = t->outs.strides[0];
    cp->op_batch_stride = t->outs.strides[1];
    cp->op_row_stride = t->outs.strides[2];
    cp->op_head_stride = t->outs.strides[3];
    cp->lse_partial = t->lses.data;
    cp->lp_split_stride = t->lses.strides[0];
    cp->lp_batch_stride = t->lses.strides[1];
    cp->lp_head_stride = t->lses.strides[2];
    cp->lp_row_stride = t->lses.strides[3];
    cp->out = t->out.data;
    cp->o_batch_stride = t->out.strides[0];
    cp->o_row_stride = t->out.strides[1];
    cp->o_head_stride = t->out.strides[2];
    cp->lse = t->lse.data;
    cp->lse_batch_stride = t->lse.strides[0];
    cp->lse_head_stride = t->lse.strides[1];
    cp->lse_row_stride = t->lse.strides[2];
    cp->sinks = t->sinks.present ? (const float *)t->sinks.data : NULL;
    cp->stream = stream;
    cp->device = t->outs.device_id;
    cp->num_threads = 0;
}

PyObject *fmha_call_combine(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    fmha_module_state *st = PyModule_GetState(module);
    fmha_combine_args a;
    fmha_combine_views t;
    fmha_open_ctx ctx;
    PyObject *out_obj = NULL, *lse_obj = NULL, *result = NULL;
    fmha_tensor_init(&t.outs, "outs");
    fmha_tensor_init(&t.lses, "lses");
    fmha_tensor_init(&t.out, "out");
    fmha_tensor_init(&t.lse, "lse");
    fmha_tensor_init(&t.sinks, "sinks");
    if (fmha_parse_combine(st, args, nargs, kwnames, &a) < 0)
        goto done;
    fmha_open_ctx_init(&ctx, st, a.stream.handle);
    if (fmha_tensor_open(a.outs, 0, &ctx, &t.outs) < 0 ||
        fmha_tensor_open(a.lses, 0, &ctx, &t.lses) < 0 ||
        (a.out != Py_None && fmha_tensor_open(a.out, FMHA_OPEN_WRITE, &ctx, &t.out) < 0) ||
        (a.lse != Py_None && fmha_tensor_open(a.lse, FMHA_OPEN_WRITE, &ctx, &t.lse) < 0) ||
        (a.sinks != Py_None && fmha_tensor_open(a.sinks, 0, &ctx, &t.sinks) < 0))
        goto done;
    if (fmha_validate_combine(&t) < 0)
        goto done;
    int on_gpu = t.outs.on_gpu, device = t.outs.device_id;
    int64_t batch = t.outs.shape[1], seqlen_q = t.outs.shape[2], heads = t.outs.shape[3];
    int64_t out_shape[4] = {batch, seqlen_q, heads, t.outs.shape[4]};
    int64_t lse_shape[3] = {batch, heads, seqlen_q};
    if (!(out_obj = take_output(st, &ctx, a.out, &t.outs, on_gpu, device, 4, out_shape,
                                t.outs.elem, &t.out)) ||
        !(lse_obj = take_output(st, &ctx, a.lse, NULL, on_gpu, device, 3, lse_shape,
                                FMHA_ELEM_F32, &t.lse)))
        goto done;

    if (batch * seqlen_q * heads > 0) {
        if (fmha_tensor_host_prepare(&t.outs, 1, 1) < 0 ||
            fmha_tensor_host_prepare(&t.lses, 0, 1) < 0 ||
            fmha_tensor_host_prepare(&t.out, 1, 0) < 0 ||
            fmha_tensor_host_prepare(&t.lse, 0, 0) < 0 ||
            (t.sinks.present && fmha_tensor_host_prepare(&t.sinks, 1, 1) < 0))
            goto done;
        fmha_combine_params cp;
        combine_fill(&t, ctx.stream, &cp);
        fmha_status status;
        Py_BEGIN_ALLOW_THREADS
        status = on_gpu ? fmha_gpu_combine(&cp) : fmha_cpu_combine(&cp);
        Py_END_ALLOW_THREADS
        if (fmha_raise_status(st, status, on_gpu ? "GPU combine" : "CPU combine") < 0)
            goto done;
        if (on_gpu) {
            fmha_tensor_mark_written(&t.out, ctx.stream);
            fmha_tensor_mark_written(&t.lse, ctx.stream);
        } else {
            fmha_tensor_host_writeback(&t.out);
            fmha_tensor_host_writeback(&t.lse);
        }
    }
    result = PyTuple_Pack(2, out_obj, lse_obj);
done:
    fmha_tensor_close(&t.outs);
    fmha_tensor_close(&t.lses);
    fmha_tensor_close(&t.out);
    fmha_tensor_close(&t.lse);
    fmha_tensor_close(&t.sinks);
    Py_XDECREF(out_obj);
    Py_XDECREF(lse_obj);
    return result;
}
