/*
 * validate.c: the checks of the public contract (DESIGN.md, errors).
 *
 * Owns every check of opened tensors that forward and combine make before
 * anything runs: dtypes (named as the user knows them, with what the
 * argument expects), dimensions and shapes, one device for all, the layouts
 * device tensors must already have, written tensors that would alias
 * themselves, an input or each other, the serving modes (packed sequences,
 * a paged KV cache: which arguments combine, their shapes, the geometry
 * call.c fills the params from) and the values of the int32 metadata
 * (cu_seqlens_q, cu_seqlens_k, cache_seqlens, block_table: host arrays
 * always; device memory only under FMHA_VALIDATE=1, because reading it
 * costs a copy and a stream sync, which a decode step captured in a CUDA
 * graph cannot have; the kernels' rule for bad device metadata is in
 * fmha.h and DESIGN.md, errors).
 * The sequences the two entry points share are written once.  Every failure
 * is a TypeError or ValueError naming the argument; nothing is written.
 */
#include "validate.h"

#include <math.h>
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

/* out: q's dtype, or float32 (fmha.h out_dtype); with out_dtype=float32 it must be float32. */
static int out_dtype_rule(const fmha_fwd_views *t, const fmha_fwd_args *a)
{
    char expect[64];
    fmha_elem q = t->q.elem;
    if (q == FMHA_ELEM_F32)
        snprintf(expect, sizeof expect, "have q's dtype float32");
    else
        snprintf(expect, sizeof expect, "have q's dtype %s or float32", fmha_elem_name(q));
    if (require_dtype(&t->out, t->out.elem == q || t->out.elem == FMHA_ELEM_F32,
                      PyExc_ValueError, expect) < 0)
        return -1;
    if (a->out_f32 && t->out.present && t->out.elem != FMHA_ELEM_F32) {
        PyErr_Format(PyExc_ValueError, "out has dtype %s but out_dtype is float32: they must "
                     "agree (out_dtype=None takes out's dtype)", fmha_elem_name(t->out.elem));
        return -1;
    }
    return 0;
}

/* 1 when k/v are an fp8 KV cache: float8_e4m3fn arrays, or uint8 codes with
 * kv_dtype="e4m3fn" (issue 22). */
static int kv_is_fp8(const fmha_fwd_views *t, const fmha_fwd_args *a)
{
    return t->k.elem == FMHA_ELEM_E4M3 ||
           (a->kv_dtype == FMHA_KV_E4M3FN && t->k.elem == FMHA_ELEM_U8);
}

/* The dtypes of an fp8 KV cache: k float8_e4m3fn (or uint8 with kv_dtype="e4m3fn"), v
 * the same as k, k_new/v_new in q's dtype (quantized on write), scale arrays float32;
 * scales given without an fp8 cache are refused. */
static int fp8_dtypes(const fmha_fwd_views *t, const fmha_fwd_args *a, int fp8)
{
    char same_as_k[64];
    if (a->kv_dtype == FMHA_KV_E4M3FN && !fp8 &&
        require_dtype(&t->k, 0, PyExc_TypeError, "be float8_e4m3fn, or uint8 holding its codes, "
                      "with kv_dtype=\"e4m3fn\"") < 0)
        return -1;
    if (!fp8) {
        const fmha_opt_kv_scale *sc[2] = {&a->k_scale, &a->v_scale};
        for (int i = 0; i < 2; i++) {
            if (!sc[i]->given)
                continue;
            char got[FMHA_DTYPE_NAME_LEN];
            PyErr_Format(PyExc_ValueError, "%s applies to an fp8 KV cache only (k and v "
                         "float8_e4m3fn, or uint8 with kv_dtype=\"e4m3fn\"), but k is %s",
                         i ? "v_scale" : "k_scale", fmha_tensor_dtype_name(&t->k, got, sizeof got));
            return -1;
        }
        return 0;
    }
    snprintf(same_as_k, sizeof same_as_k, "have k's dtype %s", fmha_elem_name(t->k.elem));
    if (require_dtype(&t->v, t->v.elem == t->k.elem, PyExc_TypeError, same_as_k) < 0 ||
        require_dtype(&t->k_scale, t->k_scale.elem == FMHA_ELEM_F32, PyExc_TypeError,
                      "be float32 (or a Python number)") < 0 ||
        require_dtype(&t->v_scale, t->v_scale.elem == FMHA_ELEM_F32, PyExc_TypeError,
                      "be float32 (or a Python number)") < 0)
        return -1;
    return 0;
}

static int forward_dtypes(const fmha_fwd_views *t, const fmha_fwd_args *a)
{
    char same_as_q[48];
    const int fp8 = kv_is_fp8(t, a);
    if (require_dtype(&t->q, is_float(t->q.elem), PyExc_TypeError,
                      "be float16 or bfloat16 (float32 on the CPU)") < 0)
        return -1;
    fmha_elem q = t->q.elem;
    snprintf(same_as_q, sizeof same_as_q, "have q's dtype %s", fmha_elem_name(q));
    if (fp8_dtypes(t, a, fp8) < 0)
        return -1;
    if (t->k.elem == FMHA_ELEM_U8 && a->kv_dtype == FMHA_KV_AUTO) {
        char expect[160];
        snprintf(expect, sizeof expect, "have q's dtype %s (uint8 holding float8 e4m3fn codes "
                 "needs kv_dtype=\"e4m3fn\")", fmha_elem_name(q));
        return require_dtype(&t->k, 0, PyExc_TypeError, expect);
    }
    if ((!fp8 && require_dtype(&t->k, t->k.elem == q, PyExc_TypeError, same_as_q) < 0) ||
        (!fp8 && require_dtype(&t->v, t->v.elem == q, PyExc_TypeError, same_as_q) < 0) ||
        out_dtype_rule(t, a) < 0 ||
        require_dtype(&t->lse, t->lse.elem == FMHA_ELEM_F32, PyExc_ValueError, "be float32") < 0 ||
        require_dtype(&t->seqlens, t->seqlens.elem == FMHA_ELEM_I32, PyExc_TypeError,
                      "be int32") < 0 ||
        require_dtype(&t->k_new, t->k_new.elem == q, PyExc_TypeError,
                      fp8 ? "have q's dtype (an fp8 cache quantizes appended rows on write)"
                          : same_as_q) < 0 ||
        require_dtype(&t->v_new, t->v_new.elem == q, PyExc_TypeError,
                      fp8 ? "have q's dtype (an fp8 cache quantizes appended rows on write)"
                          : same_as_q) < 0 ||
        require_dtype(&t->block_table, t->block_table.elem == FMHA_ELEM_I32, PyExc_TypeError,
                      "be int32") < 0 ||
        require_dtype(&t->cu_q, t->cu_q.elem == FMHA_ELEM_I32, PyExc_TypeError, "be int32") < 0 ||
        require_dtype(&t->cu_k, t->cu_k.elem == FMHA_ELEM_I32, PyExc_TypeError, "be int32") < 0 ||
        require_dtype(&t->sinks, t->sinks.elem == FMHA_ELEM_F32, PyExc_TypeError,
                      "be float32 (one logit per query head)") < 0)
        return -1;
    return 0;
}

/* window, softcap and sinks (issue 21): the window's values were checked when parsed;
 * with causal its right bound is 0 already, so only 0 or -1 agree with it. */
static int check_features(const fmha_fwd_views *t, const fmha_fwd_args *a,
                          const fmha_fwd_geometry *g)
{
    if (a->causal && a->window.given && a->window.right > 0) {
        PyErr_Format(PyExc_ValueError, "window=(%lld, %lld) with causal=True: causal sets the "
                     "right bound to 0, so window's right must be 0 or -1",
                     a->window.left, a->window.right);
        return -1;
    }
    if (t->sinks.present) {
        int64_t shape[1] = {g->heads_q};
        if (require_shape(&t->sinks, 1, shape, "[heads_q] (one logit per query head)") < 0 ||
            require_same_place(&t->sinks, &t->q) < 0 || require_device_layout(&t->sinks, 1) < 0)
            return -1;
    }
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

/* ------------------------------------------------------------------------ */
/* forward: the serving arguments' combinations and shapes                   */
/* ------------------------------------------------------------------------ */

/* Packed keys are a plain ragged batch: no cache to read from or append to. */
static int check_combinations(const fmha_fwd_views *t)
{
    if (t->cu_k.present && !t->cu_q.present) {
        PyErr_SetString(PyExc_ValueError, "cu_seqlens_k needs cu_seqlens_q: packed keys come "
                        "with packed queries");
        return -1;
    }
    const fmha_tensor *cache[] = {&t->seqlens, &t->block_table, &t->k_new, &t->v_new};
    for (size_t i = 0; t->cu_k.present && i < sizeof cache / sizeof cache[0]; i++) {
        if (cache[i]->present) {
            PyErr_Format(PyExc_ValueError, "cu_seqlens_k cannot be combined with %s: packed "
                         "keys [total_k, heads_kv, head_dim] are not a KV cache", cache[i]->name);
            return -1;
        }
    }
    return 0;
}

/* q and out are [batch, seqlen_q, ...] or, packed, [total_q, ...]; the
 * problem's batch comes from cu_seqlens_q then. */
static int check_q(const fmha_fwd_views *t, fmha_fwd_geometry *g)
{
    char shape_buf[FMHA_MSG_SHORT];
    if (g->varlen_q) {
        if (require_ndim(&t->cu_q, 1, "[batch + 1]") < 0)
            return -1;
        if (t->cu_q.shape[0] < 1) {
            PyErr_SetString(PyExc_ValueError, "cu_seqlens_q must have batch + 1 >= 1 entries, "
                            "got shape (0,)");
            return -1;
        }
        if (require_ndim(&t->q, 3, "[total_q, heads_q, head_dim] (packed: cu_seqlens_q is "
                         "given)") < 0)
            return -1;
        g->batch = t->cu_q.shape[0] - 1;
        g->total_q = t->q.shape[0];
        g->seqlen_q = 0; /* max_seqlen_q: set once the lengths are known */
    } else {
        if (require_ndim(&t->q, 4, "[batch, seqlen_q, heads_q, head_dim]") < 0)
            return -1;
        g->batch = t->q.shape[0];
        g->seqlen_q = t->q.shape[1];
    }
    g->heads_q = t->q.shape[t->q.ndim - 2];
    g->head_dim = t->q.shape[t->q.ndim - 1];
    if (g->heads_q < 1 || g->head_dim < 1) {
        format_shape(t->q.ndim, t->q.shape, shape_buf, sizeof shape_buf);
        PyErr_Format(PyExc_ValueError, "q must have heads_q >= 1 and head_dim >= 1, got shape %s",
                     shape_buf);
        return -1;
    }
    return 0;
}

/* k and v: dense [batch, seqlen_k, ...], packed [total_k, ...] or pages
 * [num_pages, page_size, ...] that block_table maps. */
static int check_kv(const fmha_fwd_views *t, fmha_fwd_geometry *g)
{
    char shape_buf[FMHA_MSG_SHORT];
    const char *layout = g->varlen_k ? "[total_k, heads_kv, head_dim] (packed: cu_seqlens_k is "
                                       "given)"
                         : g->paged  ? "[num_pages, page_size, heads_kv, head_dim] (paged: "
                                       "block_table is given)"
                                     : "[batch, seqlen_k, heads_kv, head_dim]";
    int ndim = g->varlen_k ? 3 : 4;
    if (require_ndim(&t->k, ndim, layout) < 0 || require_ndim(&t->v, ndim, layout) < 0)
        return -1;
    g->heads_kv = t->k.shape[ndim - 2];
    if (g->heads_kv < 1) {
        format_shape(t->k.ndim, t->k.shape, shape_buf, sizeof shape_buf);
        PyErr_Format(PyExc_ValueError, "k must have heads_kv >= 1, got shape %s", shape_buf);
        return -1;
    }
    int64_t kv_shape[4];
    const char *expect;
    if (g->varlen_k) {
        g->total_k = t->k.shape[0];
        kv_shape[0] = g->total_k;
        kv_shape[1] = g->heads_kv;
        kv_shape[2] = g->head_dim;
        expect = "[total_k, heads_kv, head_dim] (head_dim of q)";
    } else if (g->paged) {
        g->num_pages = t->k.shape[0];
        g->page_size = t->k.shape[1];
        if (t->v.shape[1] != g->page_size) {
            PyErr_Format(PyExc_ValueError, "v has page_size %lld (v.shape[1]) but k has %lld "
                         "(k.shape[1]); k and v must share one page layout",
                         (long long)t->v.shape[1], (long long)g->page_size);
            return -1;
        }
        if (g->page_size < 16 || g->page_size % 16 != 0) {
            PyErr_Format(PyExc_ValueError, "page_size (k.shape[1], paged: block_table is given) "
                         "must be a positive multiple of 16, got %lld", (long long)g->page_size);
            return -1;
        }
        kv_shape[0] = g->num_pages;
        kv_shape[1] = g->page_size;
        kv_shape[2] = g->heads_kv;
        kv_shape[3] = g->head_dim;
        expect = "[num_pages, page_size, heads_kv, head_dim] (head_dim of q)";
    } else {
        kv_shape[0] = g->batch;
        kv_shape[1] = t->k.shape[1];
        kv_shape[2] = g->heads_kv;
        kv_shape[3] = g->head_dim;
        expect = g->varlen_q ? "[batch, seqlen_k, heads_kv, head_dim] (batch = "
                               "cu_seqlens_q.shape[0] - 1, head_dim of q)"
                             : "[batch, seqlen_k, heads_kv, head_dim] (batch and head_dim of q)";
        g->seqlen_k = t->k.shape[1];
    }
    if (require_shape(&t->k, ndim, kv_shape, expect) < 0 ||
        require_shape(&t->v, ndim, kv_shape, "(the shape of k)") < 0)
        return -1;
    if (g->heads_q % g->heads_kv != 0) {
        PyErr_Format(PyExc_ValueError, "heads_q (%lld, q.shape[%d]) must be a multiple of "
                     "heads_kv (%lld, k.shape[%d])", (long long)g->heads_q, t->q.ndim - 2,
                     (long long)g->heads_kv, ndim - 2);
        return -1;
    }
    if (g->varlen_k) {
        int64_t cu_shape[1] = {g->batch + 1};
        if (require_shape(&t->cu_k, 1, cu_shape, "[batch + 1] (the shape of cu_seqlens_q)") < 0)
            return -1;
    }
    if (g->paged) {
        if (require_ndim(&t->block_table, 2, "[batch, max_blocks_per_seq]") < 0)
            return -1;
        int64_t table_shape[2] = {g->batch, t->block_table.shape[1]};
        if (require_shape(&t->block_table, 2, table_shape, "[batch, max_blocks_per_seq]") < 0)
            return -1;
        g->max_blocks = t->block_table.shape[1];
        if (g->max_blocks > INT64_MAX / g->page_size) {
            PyErr_SetString(PyExc_ValueError, "block_table is too wide: max_blocks_per_seq * "
                            "page_size overflows");
            return -1;
        }
        g->seqlen_k = g->max_blocks * g->page_size;
    }
    return 0;
}

/* The capacity of a KV cache, as messages name it. */
static const char *capacity_name(const fmha_fwd_geometry *g)
{
    return g->paged ? "block_table.shape[1] * page_size" : "k.shape[1]";
}

/* out, lse, cache_seqlens, k_new and v_new against q's and k's shapes. */
static int check_outputs_and_cache(const fmha_fwd_views *t, int append, fmha_fwd_geometry *g)
{
    if (t->out.present && require_shape(&t->out, t->q.ndim, t->q.shape, "(the shape of q)") < 0)
        return -1;
    if (t->lse.present) {
        int64_t lse_shape[3] = {g->batch, g->heads_q, g->seqlen_q};
        int64_t packed_shape[2] = {g->heads_q, g->total_q};
        if (g->varlen_q ? require_shape(&t->lse, 2, packed_shape, "[heads_q, total_q] (packed: "
                                        "cu_seqlens_q is given)") < 0
                        : require_shape(&t->lse, 3, lse_shape, "[batch, heads_q, seqlen_q]") < 0)
            return -1;
    }
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
        int64_t seqlens_shape[1] = {g->batch};
        if (require_shape(&t->seqlens, 1, seqlens_shape, "[batch]") < 0)
            return -1;
    }
    if (!append)
        return 0;
    if (g->varlen_q) {
        int64_t new_shape[3] = {g->total_q, g->heads_kv, g->head_dim};
        if (require_shape(&t->k_new, 3, new_shape, "[total_q, heads_kv, head_dim] (packed: "
                          "sequence b appends its cu_seqlens_q rows)") < 0 ||
            require_shape(&t->v_new, 3, new_shape, "(the shape of k_new)") < 0)
            return -1;
        return 0; /* seqlen_new: the longest len_q, once known */
    }
    if (require_ndim(&t->k_new, 4, "[batch, seqlen_new, heads_kv, head_dim]") < 0)
        return -1;
    g->seqlen_new = t->k_new.shape[1];
    int64_t new_shape[4] = {g->batch, g->seqlen_new, g->heads_kv, g->head_dim};
    if (require_shape(&t->k_new, 4, new_shape, "[batch, seqlen_new, heads_kv, head_dim]") < 0 ||
        require_shape(&t->v_new, 4, new_shape, "(the shape of k_new)") < 0)
        return -1;
    return 0;
}

/* One device for everything; metadata may also be on the host. */
static int check_places(const fmha_fwd_views *t, fmha_device_choice device)
{
    const fmha_tensor *placed[] = {&t->k, &t->v, &t->out, &t->lse, &t->k_new, &t->v_new};
    for (size_t i = 0; i < sizeof placed / sizeof placed[0]; i++)
        if (require_same_place(placed[i], &t->q) < 0)
            return -1;
    const fmha_tensor *meta[] = {&t->seqlens, &t->block_table, &t->cu_q, &t->cu_k};
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++)
        if (meta[i]->on_gpu && require_same_place(meta[i], &t->k) < 0)
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
    if (require_device_layout(&t->lse, 0) < 0)
        return -1;
    /* The kernels read device metadata as packed int32 rows. */
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++)
        if (require_device_layout(meta[i], 1) < 0)
            return -1;
    return 0;
}

/* max_seqlen_q / max_seqlen_k within their ranges (the lengths themselves are
 * checked against them when they are read). */
static int check_length_hints(const fmha_fwd_views *t, const fmha_fwd_args *a,
                              const fmha_fwd_geometry *g)
{
    (void)t;
    const fmha_opt_int *mq = &a->max_seqlen_q, *mk = &a->max_seqlen_k;
    if (mq->given && !g->varlen_q) {
        PyErr_SetString(PyExc_ValueError, "max_seqlen_q is the longest packed query sequence "
                        "and needs cu_seqlens_q");
        return -1;
    }
    if (mq->given && (mq->value < (g->total_q > 0) || mq->value > g->total_q)) {
        PyErr_Format(PyExc_ValueError, "max_seqlen_q must be in [%d, %lld] (total_q = "
                     "q.shape[0]), got %lld", g->total_q > 0, (long long)g->total_q, mq->value);
        return -1;
    }
    if (!mk->given)
        return 0;
    if (g->varlen_k) {
        if (mk->value < (g->total_k > 0) || mk->value > g->total_k) {
            PyErr_Format(PyExc_ValueError, "max_seqlen_k must be in [%d, %lld] (total_k = "
                         "k.shape[0]), got %lld", g->total_k > 0, (long long)g->total_k,
                         mk->value);
            return -1;
        }
        return 0;
    }
    /* A plan hint for cache lengths: keys of the longest sequence, appended rows included. */
    int64_t lo = g->seqlen_new > 1 && !g->varlen_q ? g->seqlen_new : 1;
    if (mk->value < lo || mk->value > g->seqlen_k) {
        PyErr_Format(PyExc_ValueError, "max_seqlen_k must be in [%lld, %lld] (%s to %s, the "
                     "cache capacity), got %lld", (long long)lo, (long long)g->seqlen_k,
                     lo > 1 ? "k_new.shape[1]" : "1", capacity_name(g), mk->value);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* forward: metadata values                                                  */
/* ------------------------------------------------------------------------ */

/* One int32 metadata array as the host reads it: the caller's host memory,
 * or (FMHA_VALIDATE=1) a copy of device memory; base NULL = not readable. */
typedef struct meta_view {
    const char *base;
    int64_t stride0, stride1;   /* elements */
    int32_t *copy;              /* the downloaded copy (malloc) */
} meta_view;

static int32_t meta_at(const meta_view *m, int64_t i, int64_t j)
{
    int32_t v;
    memcpy(&v, m->base + (i * m->stride0 + j * m->stride1) * (int64_t)sizeof v, sizeof v);
    return v;
}

/* Make the host-readable views of the given metadata: host arrays in place;
 * device ones, under FMHA_VALIDATE=1, copied down on stream with one sync. */
static int open_meta(const fmha_module_state *st, const fmha_tensor *const *t, meta_view *m,
                     size_t n, void *stream)
{
    int device = -1;
    fmha_status status = FMHA_OK;
    memset(m, 0, n * sizeof *m); /* the caller frees every copy, also after a failure */
    for (size_t i = 0; i < n; i++) {
        if (!t[i]->present || fmha_tensor_numel(t[i]) == 0)
            continue;
        m[i].stride0 = t[i]->user_strides[0];
        m[i].stride1 = t[i]->ndim > 1 ? t[i]->user_strides[1] : 0;
        if (!t[i]->on_gpu) {
            m[i].base = t[i]->user_data;
            continue;
        }
        if (!validate_device_metadata())
            continue;
        /* Device metadata has non-negative strides and a unit last stride (checked):
         * the span from the first element to the last covers it. */
        int64_t span = (t[i]->shape[0] - 1) * m[i].stride0 + 1;
        if (t[i]->ndim > 1)
            span += (t[i]->shape[1] - 1) * m[i].stride1;
        m[i].copy = malloc((size_t)span * sizeof(int32_t));
        if (!m[i].copy) {
            PyErr_NoMemory();
            return -1;
        }
        device = t[i]->device_id;
        Py_BEGIN_ALLOW_THREADS
        status = fmha_gpu_memcpy(device, stream, m[i].copy, t[i]->user_data,
                                 (size_t)span * sizeof(int32_t), FMHA_COPY_D2H);
        Py_END_ALLOW_THREADS
        if (fmha_raise_status(st, status, "reading device metadata") < 0)
            return -1;
        m[i].base = (const char *)m[i].copy;
    }
    if (device >= 0) {
        Py_BEGIN_ALLOW_THREADS
        status = fmha_gpu_stream_sync(device, stream);
        Py_END_ALLOW_THREADS
        if (fmha_raise_status(st, status, "reading device metadata") < 0)
            return -1;
    }
    return 0;
}

/* cu_seqlens: starts at 0, never decreases, ends at the total; its longest
 * sequence within max_seqlen when given.  *longest gets the longest. */
static int check_cu_seqlens(const meta_view *m, int64_t batch, const char *name,
                            const char *total_name, int64_t total, const fmha_opt_int *max_seqlen,
                            const char *max_name, int64_t *longest)
{
    int32_t first = meta_at(m, 0, 0);
    *longest = 0;
    if (first != 0) {
        PyErr_Format(PyExc_ValueError, "%s[0] = %d: %s must start at 0", name, (int)first, name);
        return -1;
    }
    for (int64_t b = 0; b < batch; b++) {
        int32_t lo = meta_at(m, b, 0), hi = meta_at(m, b + 1, 0);
        if (hi < lo) {
            PyErr_Format(PyExc_ValueError, "%s[%lld] = %d < %s[%lld] = %d: %s must not decrease",
                         name, (long long)(b + 1), (int)hi, name, (long long)b, (int)lo, name);
            return -1;
        }
        if ((int64_t)hi - lo > *longest)
            *longest = (int64_t)hi - lo;
    }
    int32_t last = meta_at(m, batch, 0);
    if (last != total) {
        PyErr_Format(PyExc_ValueError, "%s[%lld] = %d: %s must end at %s = %lld", name,
                     (long long)batch, (int)last, name, total_name, (long long)total);
        return -1;
    }
    if (max_seqlen->given && *longest > max_seqlen->value) {
        for (int64_t b = 0; b < batch; b++) {
            int64_t len = (int64_t)meta_at(m, b + 1, 0) - meta_at(m, b, 0);
            if (len > max_seqlen->value) {
                PyErr_Format(PyExc_ValueError, "%s: sequence %lld has %lld rows, more than "
                             "%s = %lld", name, (long long)b, (long long)len, max_name,
                             max_seqlen->value);
                return -1;
            }
        }
    }
    return 0;
}

/* Rows sequence b appends: -1 when not known on the host (device cu_seqlens_q). */
static int64_t new_rows(const fmha_fwd_geometry *g, int append, const meta_view *cu_q, int64_t b)
{
    if (!append)
        return 0;
    if (!g->varlen_q)
        return g->seqlen_new;
    if (!cu_q->base)
        return -1;
    return (int64_t)meta_at(cu_q, b + 1, 0) - meta_at(cu_q, b, 0);
}

/* Check 0 <= s and s + new_len(b) <= capacity for every cache_seqlens entry
 * (new_len not known: s <= capacity) and learn the key lengths when every
 * one is known on the host. */
static int check_cache_seqlens(const fmha_fwd_views *t, const fmha_fwd_geometry *g, int append,
                               const meta_view *seqlens, const meta_view *cu_q,
                               fmha_cache_lengths *lengths)
{
    int known = 1;
    for (int64_t b = 0; b < g->batch; b++) {
        int32_t s = meta_at(seqlens, b, 0);
        int64_t n = new_rows(g, append, cu_q, b);
        known &= n >= 0;
        if (s < 0 || (int64_t)s + (n > 0 ? n : 0) > g->seqlen_k) {
            const char *plus = !append ? "" : g->varlen_q ? " + (its new rows in cu_seqlens_q)"
                                                          : " + k_new.shape[1]";
            if (append && g->varlen_q && n < 0)
                plus = "";
            PyErr_Format(PyExc_ValueError, "cache_seqlens[%lld] = %d: need 0 <= cache_seqlens[b]"
                         "%s <= %lld (the cache capacity %s)", (long long)b, (int)s, plus,
                         (long long)g->seqlen_k, capacity_name(g));
            return -1;
        }
        int64_t keys = (int64_t)s + (n > 0 ? n : 0);
        if (keys > lengths->max_keys)
            lengths->max_keys = keys;
        lengths->total_keys += keys;
    }
    (void)t;
    lengths->known = known;
    return 0;
}

/* Host block_table entries within each sequence's keys must name a page of
 * k/v: the first ceil(len_k(b) / page_size) entries of row b, or every entry
 * where len_k(b) is the capacity (no cache_seqlens) or not known on the host. */
static int check_block_table(const fmha_fwd_geometry *g, int append, const meta_view *table,
                             const meta_view *seqlens, const meta_view *cu_q, int have_seqlens)
{
    for (int64_t b = 0; b < g->batch; b++) {
        int64_t used = g->max_blocks;
        const char *which = !have_seqlens ? "entries of every row (without cache_seqlens each "
                                            "sequence fills its row)"
                                          : "entries of every row (the sequences' lengths are "
                                            "not known on the host)";
        int64_t n = have_seqlens && seqlens->base ? new_rows(g, append, cu_q, b) : -1;
        if (n >= 0) {
            int64_t keys = (int64_t)meta_at(seqlens, b, 0) + n;
            used = (keys + g->page_size - 1) / g->page_size;
            which = "first ceil(len_k(b) / page_size) entries of row b";
        }
        for (int64_t i = 0; i < used; i++) {
            int32_t page = meta_at(table, b, i);
            if (page < 0 || page >= g->num_pages) {
                PyErr_Format(PyExc_ValueError, "block_table[%lld, %lld] = %d: need 0 <= "
                             "block_table[b, i] < num_pages = %lld (k.shape[0]) for the %s",
                             (long long)b, (long long)i, (int)page, (long long)g->num_pages,
                             which);
                return -1;
            }
        }
    }
    return 0;
}

/* Read what host (or, under FMHA_VALIDATE=1, device) metadata says, check it,
 * and settle the longest lengths. */
static int check_metadata(const fmha_module_state *st, const fmha_fwd_views *t,
                          const fmha_fwd_args *a, int append, void *stream,
                          fmha_fwd_geometry *g, fmha_cache_lengths *lengths)
{
    enum { CU_Q, CU_K, SEQLENS, TABLE, N_META };
    const fmha_tensor *tensors[N_META] = {&t->cu_q, &t->cu_k, &t->seqlens, &t->block_table};
    meta_view m[N_META];
    int rc = -1;
    if (open_meta(st, tensors, m, N_META, stream) < 0)
        goto done;
    if (g->varlen_q) {
        int64_t longest = g->total_q;
        g->q_source = a->max_seqlen_q.given ? FMHA_LEN_GIVEN : FMHA_LEN_TOTAL;
        if (m[CU_Q].base) {
            if (check_cu_seqlens(&m[CU_Q], g->batch, "cu_seqlens_q", "total_q = q.shape[0]",
                                 g->total_q, &a->max_seqlen_q, "max_seqlen_q", &longest) < 0)
                goto done;
            if (!a->max_seqlen_q.given && !t->cu_q.on_gpu)
                g->q_source = FMHA_LEN_COMPUTED;
            else if (!a->max_seqlen_q.given)
                longest = g->total_q; /* FMHA_VALIDATE read it: the plan must not depend on that */
        }
        g->seqlen_q = a->max_seqlen_q.given ? a->max_seqlen_q.value : longest;
        if (append)
            g->seqlen_new = g->seqlen_q;
    }
    if (g->varlen_k) {
        int64_t longest = g->total_k;
        g->k_source = a->max_seqlen_k.given ? FMHA_LEN_GIVEN : FMHA_LEN_TOTAL;
        if (m[CU_K].base) {
            if (check_cu_seqlens(&m[CU_K], g->batch, "cu_seqlens_k", "total_k = k.shape[0]",
                                 g->total_k, &a->max_seqlen_k, "max_seqlen_k", &longest) < 0)
                goto done;
            if (!t->cu_k.on_gpu) {
                if (!a->max_seqlen_k.given)
                    g->k_source = FMHA_LEN_COMPUTED;
                lengths->known = 1;
                lengths->max_keys = longest;
                lengths->total_keys = g->total_k;
            } else if (!a->max_seqlen_k.given) {
                longest = g->total_k;
            }
        }
        g->seqlen_k = a->max_seqlen_k.given ? a->max_seqlen_k.value : longest;
    }
    if (t->seqlens.present) {
        /* The kernels read device lengths as a packed int32 array. */
        if (t->seqlens.on_gpu && g->batch > 1 && t->seqlens.strides[0] != 1) {
            PyErr_SetString(PyExc_ValueError, "cache_seqlens on a GPU must be contiguous");
            goto done;
        }
        fmha_cache_lengths found = {0, 0, 0};
        if (m[SEQLENS].base &&
            check_cache_seqlens(t, g, append, &m[SEQLENS], &m[CU_Q], &found) < 0)
            goto done;
        /* Only host arrays may shape the plan (device ones read under FMHA_VALIDATE
         * must plan as they would without it), and only when every length is known. */
        if (!t->seqlens.on_gpu && !(g->varlen_q && append && t->cu_q.on_gpu) && found.known)
            *lengths = found;
    }
    if (g->paged && m[TABLE].base &&
        check_block_table(g, append, &m[TABLE], &m[SEQLENS], &m[CU_Q], t->seqlens.present) < 0)
        goto done;
    rc = 0;
done:
    for (int i = 0; i < N_META; i++)
        free(m[i].copy);
    return rc;
}

/* k_scale / v_scale arrays of an fp8 KV cache: [] (per tensor), [heads_kv] or [batch,
 * heads_kv], on k's device; host values positive and finite (device values are not read:
 * no sync; fmha.h says what the math does with them). */
static int check_kv_scales(const fmha_fwd_views *t, const fmha_fwd_geometry *g)
{
    const fmha_tensor *sc[2] = {&t->k_scale, &t->v_scale};
    for (int i = 0; i < 2; i++) {
        const fmha_tensor *s = sc[i];
        if (!s->present)
            continue;
        int ok = s->ndim == 0 || (s->ndim == 1 && s->shape[0] == g->heads_kv) ||
                 (s->ndim == 2 && s->shape[0] == g->batch && s->shape[1] == g->heads_kv);
        if (!ok) {
            char got[FMHA_MSG_SHORT];
            format_shape(s->ndim, s->shape, got, sizeof got);
            PyErr_Format(PyExc_ValueError, "%s must be a Python number, or float32 of shape () "
                         "(per tensor), (heads_kv,) = (%lld,) or (batch, heads_kv) = (%lld, %lld), "
                         "got shape %s", s->name, (long long)g->heads_kv, (long long)g->batch,
                         (long long)g->heads_kv, got);
            return -1;
        }
        if (require_same_place(s, &t->k) < 0 || require_device_layout(s, 0) < 0)
            return -1;
        if (s->on_gpu)
            continue;
        int64_t rows = s->ndim == 2 ? s->shape[0] : 1, cols = s->ndim >= 1 ? s->shape[s->ndim - 1] : 1;
        int64_t rs = s->ndim == 2 ? s->user_strides[0] : 0;
        int64_t cs = s->ndim >= 1 ? s->user_strides[s->ndim - 1] : 0;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) {
                float v;
                memcpy(&v, (const char *)s->user_data + (r * rs + c * cs) * (int64_t)sizeof v,
                       sizeof v);
                if (v > 0.0f && isfinite(v))
                    continue;
                char where[48];
                if (s->ndim == 2)
                    snprintf(where, sizeof where, "[%lld, %lld]", (long long)r, (long long)c);
                else if (s->ndim == 1)
                    snprintf(where, sizeof where, "[%lld]", (long long)c);
                else
                    where[0] = '\0';
                char value[32];
                snprintf(value, sizeof value, "%.9g", (double)v);
                PyErr_Format(PyExc_ValueError, "%s%s = %s: every fp8 dequantization factor "
                             "must be positive and finite", s->name, where, value);
                return -1;
            }
        }
    }
    return 0;
}

int fmha_validate_forward(const fmha_module_state *st, fmha_fwd_views *t,
                          const fmha_fwd_args *a, int append, void *stream,
                          fmha_fwd_geometry *g, fmha_cache_lengths *lengths)
{
    memset(lengths, 0, sizeof *lengths);
    memset(g, 0, sizeof *g);
    g->varlen_q = t->cu_q.present;
    g->varlen_k = t->cu_k.present;
    g->paged = t->block_table.present;
    if (forward_dtypes(t, a) < 0 || check_combinations(t) < 0 || check_q(t, g) < 0 ||
        check_kv(t, g) < 0 || check_outputs_and_cache(t, append, g) < 0 ||
        check_places(t, a->device) < 0 || check_features(t, a, g) < 0 ||
        check_kv_scales(t, g) < 0)
        return -1;
    g->kv_fp8 = kv_is_fp8(t, a);

    /* Written tensors: no aliasing among their own elements or with anything else. */
    fmha_tensor *inputs[] = {&t->q, &t->k, &t->v, &t->k_new, &t->v_new, &t->seqlens,
                             &t->block_table, &t->cu_q, &t->cu_k, &t->sinks,
                             &t->k_scale, &t->v_scale};
    fmha_tensor *written[] = {&t->out, &t->lse, append ? &t->k : NULL, append ? &t->v : NULL};
    if (require_apart(written, sizeof written / sizeof written[0], inputs,
                      sizeof inputs / sizeof inputs[0], &t->k, &t->v) < 0)
        return -1;

    if (check_length_hints(t, a, g) < 0)
        return -1;
    return check_metadata(st, t, a, append, stream, g, lengths);
}

/* ------------------------------------------------------------------------ */
/* combine                                                                   */
/* ------------------------------------------------------------------------ */

/*
 * 1 when out is exactly partial g of outs for some g (the same address for every
 * element out[b, i, h, d] and outs[g, b, i, h, d]); such an out may be written.
 * Both combines read every partial of a row's span of features before they
 * write that span of the row, and no row reads another row's partials:
 * cpu_fwd.c combine_row accumulates a chunk of features over all splits before
 * storing it, combine.hip loads a chunk's features of every split, meets
 * __syncthreads, then stores.  lse gets no such allowance: combine.hip reads a
 * row's lses again for each chunk of features after the first chunk has stored
 * lse, so lse must stay apart from lses.
 */
static int out_is_one_partial(const fmha_tensor *out, const fmha_tensor *outs)
{
    if (!out->present || !outs->present || out->ndim != 4 || outs->ndim != 5 ||
        out->on_gpu != outs->on_gpu || (out->on_gpu && out->device_id != outs->device_id) ||
        out->itemsize != outs->itemsize || out->itemsize == 0)
        return 0;
    for (int d = 0; d < 4; d++)
        if (out->shape[d] != outs->shape[d + 1] ||
            (out->shape[d] > 1 && out->user_strides[d] != outs->user_strides[d + 1]))
            return 0;
    /* Byte distance from partial 0 to out, in steps of one partial. */
    intptr_t diff = (intptr_t)((uintptr_t)out->user_data - (uintptr_t)outs->user_data);
    int64_t step = outs->user_strides[0] * (int64_t)outs->itemsize;
    if (outs->shape[0] == 1 || step == 0)
        return diff == 0;
    if (diff % step != 0)
        return 0;
    int64_t g = (int64_t)(diff / step);
    return g >= 0 && g < outs->shape[0];
}

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
    if (t->sinks.present) {
        int64_t sinks_shape[1] = {heads};
        if (require_dtype(&t->sinks, t->sinks.elem == FMHA_ELEM_F32, PyExc_TypeError,
                          "be float32 (one logit per head)") < 0 ||
            require_shape(&t->sinks, 1, sinks_shape, "[heads] (one logit per head)") < 0 ||
            require_same_place(&t->sinks, &t->outs) < 0)
            return -1;
    }
    if (require_device_layout(&t->outs, 1) < 0 || require_device_layout(&t->lses, 0) < 0 ||
        require_device_layout(&t->out, 1) < 0 || require_device_layout(&t->lse, 0) < 0 ||
        require_device_layout(&t->sinks, 1) < 0)
        return -1;
    fmha_tensor *written[] = {&t->out, &t->lse};
    fmha_tensor *inputs[] = {&t->outs, &t->lses, &t->sinks};
    /* out exactly one of the partials is allowed (out_is_one_partial says why): the
     * pair is passed as twins, so every other overlap is still refused. */
    if (out_is_one_partial(&t->out, &t->outs))
        return require_apart(written, 2, inputs, 3, &t->out, &t->outs);
    return require_apart(written, 2, inputs, 3, NULL, NULL);
}
