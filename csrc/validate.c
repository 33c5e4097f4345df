/*
 * validate.c: the checks of the public contract (DESIGN.md, errors).
 *
 * Owns every check of opened tensors that forward and combine make before
 * anything runs: dtypes (named as the user knows them, with what the
 * argument expects), dimensions and shapes, one device for all, the layouts
 * device tensors must already have, written tensors that would alias
 * themselves, an input or each other, and the values of cache_seqlens
 * (host arrays always; device memory only under FMHA_VALIDATE=1, because
 * reading it costs a copy and a stream sync, which a decode step captured
 * in a CUDA graph cannot have; the kernels' rule for bad device lengths is
 * in DESIGN.md, errors).
 * The sequences the two entry points share are written once.  Every failure
 * is a TypeError or ValueError naming the argument; nothing is written.
 */
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for a formatted shape or device in messages. */
#define FMHA_MSG_SHORT 96

/* ------------------------------------------------------------------------ */
/* Checks both entry points make                                             */
/* ------------------------------------------------------------------------ */

static void format_shape(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "",
                                 (long long)shape[d]);
    if (ndim == 1 && used < len)
        used += (size_t)snprintf(buf + used, len - used, ",");
    if (used < len)
        snprintf(buf + used, len - used, ")");
}

static void format_place(const fmha_tensor *t, char *buf, size_t len)
{
    if (t->on_gpu)
        snprintf(buf, len, "%s:%d", fmha_gpu_platform(), t->device_id);
    else
        snprintf(buf, len, "cpu");
}

/* "<name> must <expect>, got <dtype>": exc, or TypeError when the view holds
 * a dtype that no argument accepts. */
static int require_dtype(const fmha_tensor *t, int ok, PyObject *exc, const char *expect)
{
    if (!t->present || ok)
        return 0;
    char got[FMHA_DTYPE_NAME_LEN];
    PyErr_Format(t->elem == FMHA_ELEM_OTHER ? PyExc_TypeError : exc, "%s must %s, got %s",
                 t->name, expect, fmha_tensor_dtype_name(t, got, sizeof got));
    return -1;
}

static int is_float(fmha_elem elem)
{
    return elem == FMHA_ELEM_F16 || elem == FMHA_ELEM_BF16 || elem == FMHA_ELEM_F32;
}

static int require_ndim(const fmha_tensor *t, int ndim, const char *layout)
{
    if (t->ndim == ndim)
        return 0;
    char shape[FMHA_MSG_SHORT];
    format_shape(t->ndim, t->shape, shape, sizeof shape);
    PyErr_Format(PyExc_ValueError, "%s must be %d-D %s, got shape %s", t->name, ndim, layout,
                 shape);
    return -1;
}

static int require_shape(const fmha_tensor *t, int ndim, const int64_t *shape, const char *layout)
{
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == shape[d];
    if (ok)
        return 0;
    char got[FMHA_MSG_SHORT], want[FMHA_MSG_SHORT];
    format_shape(t->ndim, t->shape, got, sizeof got);
    format_shape(ndim, shape, want, sizeof want);
    PyErr_Format(PyExc_ValueError, "%s must have shape %s %s, got %s", t->name, want, layout, got);
    return -1;
}

static int require_same_place(const fmha_tensor *t, const fmha_tensor *ref)
{
    if (!t->present || (t->on_gpu == ref->on_gpu && (!t->on_gpu || t->device_id == ref->device_id)))
        return 0;
    char a[FMHA_MSG_SHORT], b[FMHA_MSG_SHORT];
    format_place(t, a, sizeof a);
    format_place(ref, b, sizeof b);
    PyErr_Format(PyExc_ValueError, "%s is on %s but %s is on %s; all tensors must be on one "
                 "device", t->name, a, ref->name, b);
    return -1;
}

/* Device tensors are used as they are: whole-element alignment, non-negative
 * strides, and (unit_last) a unit stride on the last dimension. */
static int require_device_layout(const fmha_tensor *t, int unit_last)
{
    if (!t->present || !t->on_gpu || fmha_tensor_numel(t) == 0)
        return 0;
    if ((uintptr_t)t->data % t->itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: device data is not aligned to its %zu-byte "
                     "elements", t->name, t->itemsize);
        return -1;
    }
    for (int d = 0; d < t->ndim; d++) {
        if (t->strides[d] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: device tensors need non-negative strides "
                         "(dimension %d has stride %lld)", t->name, d, (long long)t->strides[d]);
            return -1;
        }
    }
    if (unit_last && t->ndim > 0 && t->strides[t->ndim - 1] != 1) {
        PyErr_Format(PyExc_ValueError, "%s: device tensors need a unit stride on the last "
                     "(head_dim) dimension, got stride %lld; make it contiguous first",
                     t->name, (long long)t->strides[t->ndim - 1]);
        return -1;
    }
    return 0;
}

static int require_no_overlap(const fmha_tensor *written, const fmha_tensor *other)
{
    if (!written->present || !other->present || !fmha_tensor_overlap(written, other))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s overlaps %s in memory; outputs must not share memory "
                 "with the inputs or each other", written->name, other->name);
    return -1;
}

/*
 * Written tensors (NULL entries skipped) must not alias among their own
 * elements, any input or each other; the twins (k and v of one packed cache,
 * or NULL) may share memory with each other.
 */
static int require_apart(fmha_tensor *const *written, size_t n_written,
                         fmha_tensor *const *inputs, size_t n_inputs,
                         const fmha_tensor *twin_a, const fmha_tensor *twin_b)
{
    for (size_t w = 0; w < n_written; w++) {
        const fmha_tensor *t = written[w];
        if (!t || !t->present)
            continue;
        if (fmha_tensor_self_overlaps(t)) {
            PyErr_Format(PyExc_ValueError, "%s has elements that share memory (zero or "
                         "overlapping strides), so it cannot be written", t->name);
            return -1;
        }
        for (size_t i = 0; i < n_inputs; i++) {
            int twins = twin_a && ((t == twin_a && inputs[i] == twin_b) ||
                                   (t == twin_b && inputs[i] == twin_a));
            if (inputs[i] != t && !twins && require_no_overlap(t, inputs[i]) < 0)
                return -1;
        }
    }
    for (size_t w = 0; w < n_written; w++) {
        for (size_t u = w + 1; u < n_written; u++) {
            const fmha_tensor *a = written[w], *b = written[u];
            int twins = twin_a && ((a == twin_a && b == twin_b) || (a == twin_b && b == twin_a));
            if (a && b && !twins && require_no_overlap(a, b) < 0)
                return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */
/* ------------------------------------------------------------------------ */

static int forward_dtypes(const fmha_fwd_views *t)
{
    char same_as_q[48];
    if (require_dtype(&t->q, is_float(t->q.elem), PyExc_TypeError,
                      "be float16 or bfloat16 (float32 on the CPU)") < 0)
        return -1;
    fmha_elem q = t->q.elem;
    snprintf(same_as_q, sizeof same_as_q, "have q's dtype %s", fmha_elem_name(q));
    if (require_dtype(&t->k, t->k.elem == q, PyExc_TypeError, same_as_q) < 0 ||
        require_dtype(&t->v, t->v.elem == q, PyExc_TypeError, same_as_q) < 0 ||
        require_dtype(&t->out, t->out.elem == q, PyExc_ValueError, same_as_q) < 0 ||
        require_dtype(&t->lse, t->lse.elem == FMHA_ELEM_F32, PyExc_ValueError, "be float32") < 0 ||
        require_dtype(&t->seqlens, t->seqlens.elem == FMHA_ELEM_I32, PyExc_TypeError,
                      "be int32") < 0 ||
        require_dtype(&t->k_new, t->k_new.elem == q, PyExc_TypeError, same_as_q) < 0 ||
        require_dtype(&t->v_new, t->v_new.elem == q, PyExc_TypeError, same_as_q) < 0)
        return -1;
    return 0;
}

/* FMHA_VALIDATE=1: device metadata is copied to the host and checked (with a
 * stream sync), for debugging.  Read once per process, like the CPU's
 * variables; the GIL guards the first read. */
static int validate_device_metadata(void)
{
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("FMHA_VALIDATE");
        on = env && env[0] && strcmp(env, "0") != 0;
    }
    return on;
}

/* Check 0 <= s and s + seqlen_new <= capacity for every cache_seqlens entry:
 * host arrays in place, device memory copied down (only under FMHA_VALIDATE=1).
 * Host lengths are also what the planner sizes a ragged batch by. */
static int check_cache_seqlens(const fmha_module_state *st, const fmha_fwd_views *v,
                               int64_t seqlen_new, void *stream, fmha_cache_lengths *lengths)
{
    const fmha_tensor *t = &v->seqlens;
    int64_t batch = t->shape[0];
    int32_t *host = NULL;
    const char *base = t->user_data;
    int64_t stride = t->user_strides[0];
    /* The kernels read device lengths as a packed int32 array. */
    if (t->on_gpu && batch > 1 && stride != 1) {
        PyErr_SetString(PyExc_ValueError, "cache_seqlens on a GPU must be contiguous");
        return -1;
    }
    lengths->known = !t->on_gpu;
    if (batch == 0 || (t->on_gpu && !validate_device_metadata()))
        return 0;
    if (t->on_gpu) {
        host = malloc((size_t)batch * sizeof *host);
        if (!host) {
            PyErr_NoMemory();
            return -1;
        }
        fmha_status status;
        Py_BEGIN_ALLOW_THREADS
        status = fmha_gpu_memcpy(t->device_id, stream, host, t->user_data,
                                 (size_t)batch * sizeof *host, FMHA_COPY_D2H);
        if (status == FMHA_OK)
            status = fmha_gpu_stream_sync(t->device_id, stream);
        Py_END_ALLOW_THREADS
        if (fmha_raise_status(st, status, "reading cache_seqlens") < 0) {
            free(host);
            return -1;
        }
        base = (const char *)host;
        stride = 1;
    }
    int64_t capacity = v->k.shape[1];
    for (int64_t b = 0; b < batch; b++) {
        int32_t s;
        memcpy(&s, base + b * stride * (int64_t)sizeof s, sizeof s);
        if (s < 0 || (int64_t)s + seqlen_new > capacity) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens[%lld] = %d: need 0 <= cache_seqlens[b]"
                         "%s <= %lld (the cache capacity k.shape[1])", (long long)b, (int)s,
                         seqlen_new ? " + k_new.shape[1]" : "", (long long)capacity);
            free(host);
            return -1;
        }
        if (s > lengths->max_seqlen)
            lengths->max_seqlen = s;
        lengths->total_keys += (int64_t)s + seqlen_new;
    }
    free(host);
    return 0;
}

int fmha_validate_forward(const fmha_module_state *st, fmha_fwd_views *t,
                          fmha_device_choice device, int append, void *stream,
                          const fmha_opt_int *max_seqlen_k, fmha_cache_lengths *lengths)
{
    char shape_buf[FMHA_MSG_SHORT];
    memset(lengths, 0, sizeof *lengths);
    if (forward_dtypes(t) < 0)
        return -1;
    if (require_ndim(&t->q, 4, "[batch, seqlen_q, heads_q, head_dim]") < 0 ||
        require_ndim(&t->k, 4, "[batch, seqlen_k, heads_kv, head_dim]") < 0 ||
        require_ndim(&t->v, 4, "[batch, seqlen_k, heads_kv, head_dim]") < 0)
        return -1;
    int64_t batch = t->q.shape[0], seqlen_q = t->q.shape[1], heads_q = t->q.shape[2];
    int64_t head_dim = t->q.shape[3];
    int64_t seqlen_k = t->k.shape[1], heads_kv = t->k.shape[2];
    int64_t kv_shape[4] = {batch, seqlen_k, heads_kv, head_dim};
    if (heads_q < 1 || head_dim < 1) {
        format_shape(t->q.ndim, t->q.shape, shape_buf, sizeof shape_buf);
        PyErr_Format(PyExc_ValueError, "q must have heads_q >= 1 and head_dim >= 1, got shape %s",
                     shape_buf);
        return -1;
    }
    if (heads_kv < 1) {
        format_shape(t->k.ndim, t->k.shape, shape_buf, sizeof shape_buf);
        PyErr_Format(PyExc_ValueError, "k must have heads_kv >= 1, got shape %s", shape_buf);
        return -1;
    }
    if (require_shape(&t->k, 4, kv_shape, "[batch, seqlen_k, heads_kv, head_dim] (batch and "
                      "head_dim of q)") < 0 ||
        require_shape(&t->v, 4, kv_shape, "(the shape of k)") < 0)
        return -1;
    if (heads_q % heads_kv != 0) {
        PyErr_Format(PyExc_ValueError, "heads_q (%lld, q.shape[2]) must be a multiple of "
                     "heads_kv (%lld, k.shape[2])", (long long)heads_q, (long long)heads_kv);
        return -1;
    }

    /* One device for everything (cache_seqlens may also be on the host). */
    const fmha_tensor *placed[] = {&t->k, &t->v, &t->out, &t->lse, &t->k_new, &t->v_new};
    for (size_t i = 0; i < sizeof placed / sizeof placed[0]; i++)
        if (require_same_place(placed[i], &t->q) < 0)
            return -1;
    if (t->seqlens.on_gpu && require_same_place(&t->seqlens, &t->k) < 0)
        return -1;
    if (device == FMHA_DEVICE_CPU && t->q.on_gpu) {
        char place[FMHA_MSG_SHORT];
        format_place(&t->q, place, sizeof place);
        PyErr_Format(PyExc_ValueError, "device=\"cpu\" but q is on %s; fmha_native does not copy "
                     "device tensors to the host (move them yourself)", place);
        return -1;
    }
    if (device == FMHA_DEVICE_GPU && !t->q.on_gpu && fmha_gpu_device_count() == 0) {
        PyErr_Format(PyExc_ValueError, "device=\"gpu\" but no GPU is available (%s)",
                     fmha_gpu_compiled() ? "the runtime lists no device"
                                         : "this build has no GPU backend");
        return -1;
    }
    const fmha_tensor *rows[] = {&t->q, &t->k, &t->v, &t->out, &t->k_new, &t->v_new};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (require_device_layout(rows[i], 1) < 0)
            return -1;
    if (require_device_layout(&t->lse, 0) < 0 || require_device_layout(&t->seqlens, 1) < 0)
        return -1;

    /* Outputs. */
    if (t->out.present && require_shape(&t->out, 4, t->q.shape, "(the shape of q)") < 0)
        return -1;
    if (t->lse.present) {
        int64_t lse_shape[3] = {batch, heads_q, seqlen_q};
        if (require_shape(&t->lse, 3, lse_shape, "[batch, heads_q, seqlen_q]") < 0)
            return -1;
    }

    /* KV cache. */
    int64_t seqlen_new = 0;
    if (t->k_new.present != t->v_new.present) {
        PyErr_SetString(PyExc_ValueError, "k_new and v_new must be given together");
        return -1;
    }
    if (t->k_new.present && !t->seqlens.present) {
        PyErr_SetString(PyExc_ValueError, "k_new/v_new append to a KV cache and need "
                        "cache_seqlens");
        return -1;
    }
    if (t->seqlens.present) {
        int64_t seqlens_shape[1] = {batch};
        if (require_shape(&t->seqlens, 1, seqlens_shape, "[batch]") < 0)
            return -1;
    }
    if (append) {
        if (require_ndim(&t->k_new, 4, "[batch, seqlen_new, heads_kv, head_dim]") < 0)
            return -1;
        seqlen_new = t->k_new.shape[1];
        int64_t new_shape[4] = {batch, seqlen_new, heads_kv, head_dim};
        if (require_shape(&t->k_new, 4, new_shape, "[batch, seqlen_new, heads_kv, head_dim]") < 0 ||
            require_shape(&t->v_new, 4, new_shape, "(the shape of k_new)") < 0)
            return -1;
    }

    /* Written tensors: no aliasing among their own elements or with anything else. */
    fmha_tensor *inputs[] = {&t->q, &t->k, &t->v, &t->k_new, &t->v_new, &t->seqlens};
    fmha_tensor *written[] = {&t->out, &t->lse, append ? &t->k : NULL, append ? &t->v : NULL};
    if (require_apart(written, sizeof written / sizeof written[0], inputs,
                      sizeof inputs / sizeof inputs[0], &t->k, &t->v) < 0)
        return -1;

    /* A plan hint for device lengths: keys of the longest sequence, appended rows included. */
    if (max_seqlen_k->given &&
        (max_seqlen_k->value < (seqlen_new > 1 ? seqlen_new : 1) || max_seqlen_k->value > seqlen_k)) {
        PyErr_Format(PyExc_ValueError, "max_seqlen_k must be in [%lld, %lld] (%s to k.shape[1], the "
                     "cache capacity), got %lld", (long long)(seqlen_new > 1 ? seqlen_new : 1),
                     (long long)seqlen_k, seqlen_new > 1 ? "k_new.shape[1]" : "1",
                     max_seqlen_k->value);
        return -1;
    }
    if (t->seqlens.present && check_cache_seqlens(st, t, seqlen_new, stream, lengths) < 0)
        return -1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* combine                                                                   */
/* ------------------------------------------------------------------------ */

int fmha_validate_combine(fmha_combine_views *t)
{
    char same_as_outs[48];
    if (require_dtype(&t->outs, is_float(t->outs.elem), PyExc_TypeError,
                      "be float16, bfloat16 or float32") < 0 ||
        require_dtype(&t->lses, t->lses.elem == FMHA_ELEM_F32, PyExc_TypeError, "be float32") < 0)
        return -1;
    snprintf(same_as_outs, sizeof same_as_outs, "have outs' dtype %s",
             fmha_elem_name(t->outs.elem));
    if (require_dtype(&t->out, t->out.elem == t->outs.elem, PyExc_ValueError, same_as_outs) < 0 ||
        require_dtype(&t->lse, t->lse.elem == FMHA_ELEM_F32, PyExc_ValueError, "be float32") < 0)
        return -1;
    if (require_ndim(&t->outs, 5, "[num_splits, batch, seqlen_q, heads, head_dim]") < 0 ||
        require_ndim(&t->lses, 4, "[num_splits, batch, heads, seqlen_q]") < 0)
        return -1;
    int64_t num_splits = t->outs.shape[0], batch = t->outs.shape[1], seqlen_q = t->outs.shape[2];
    int64_t heads = t->outs.shape[3], head_dim = t->outs.shape[4];
    if (num_splits < 1 || num_splits > FMHA_MAX_SPLITS) {
        PyErr_Format(PyExc_ValueError, "outs must hold 1..%d partial states (outs.shape[0]), "
                     "got %lld", FMHA_MAX_SPLITS, (long long)num_splits);
        return -1;
    }
    if (head_dim < 1) {
        PyErr_SetString(PyExc_ValueError, "outs must have head_dim >= 1 (outs.shape[4])");
        return -1;
    }
    int64_t lses_shape[4] = {num_splits, batch, heads, seqlen_q};
    int64_t out_shape[4] = {batch, seqlen_q, heads, head_dim};
    int64_t lse_shape[3] = {batch, heads, seqlen_q};
    if (require_shape(&t->lses, 4, lses_shape, "[num_splits, batch, heads, seqlen_q] (from outs)") < 0 ||
        require_same_place(&t->lses, &t->outs) < 0)
        return -1;
    if (t->out.present &&
        (require_shape(&t->out, 4, out_shape, "[batch, seqlen_q, heads, head_dim]") < 0 ||
         require_same_place(&t->out, &t->outs) < 0))
        return -1;
    if (t->lse.present &&
        (require_shape(&t->lse, 3, lse_shape, "[batch, heads, seqlen_q]") < 0 ||
         require_same_place(&t->lse, &t->outs) < 0))
        return -1;
    if (require_device_layout(&t->outs, 1) < 0 || require_device_layout(&t->lses, 0) < 0 ||
        require_device_layout(&t->out, 1) < 0 || require_device_layout(&t->lse, 0) < 0)
        return -1;
    fmha_tensor *written[] = {&t->out, &t->lse};
    fmha_tensor *inputs[] = {&t->outs, &t->lses};
    return require_apart(written, 2, inputs, 2, NULL, NULL);
}
