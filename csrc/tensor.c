/*
 * tensor.c: the uniform tensor view and what is done with it.
 *
 * Owns the lifetime of fmha_tensor (init, close), the dispatch of
 * fmha_tensor_open to the producer that exported the object (the producers'
 * own files read it into the view; the checks every view needs end the
 * open here), the
 * naming of a view's dtype, the overlap checks of written tensors, and the
 * host copies and device staging that let the backends assume a unit
 * head_dim stride.
 */
#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlpack_in.h"
#include "dlpack_out.h"
#include "host_array.h"
#include "torch.h"

const char *fmha_elem_name(fmha_elem elem)
{
    switch (elem) {
    case FMHA_ELEM_F16: return "float16";
    case FMHA_ELEM_BF16: return "bfloat16";
    case FMHA_ELEM_F32: return "float32";
    case FMHA_ELEM_I32: return "int32";
    case FMHA_ELEM_E4M3: return "float8_e4m3fn";
    case FMHA_ELEM_U8: return "uint8";
    case FMHA_ELEM_OTHER: break;
    }
    return "unknown";
}

size_t fmha_elem_size(fmha_elem elem)
{
    if (elem == FMHA_ELEM_E4M3 || elem == FMHA_ELEM_U8)
        return 1;
    return elem == FMHA_ELEM_F16 || elem == FMHA_ELEM_BF16 ? 2 : 4;
}

const char *fmha_tensor_dtype_name(const fmha_tensor *t, char *buf, size_t len)
{
    if (t->elem != FMHA_ELEM_OTHER) {
        snprintf(buf, len, "%s", fmha_elem_name(t->elem));
        return buf;
    }
    switch (t->source) {
    case FMHA_SOURCE_NUMPY:
        return fmha_numpy_dtype_name(t->array, buf, len);
    case FMHA_SOURCE_BUFFER:
        return fmha_buffer_format_name(t->buffer.format, (size_t)t->buffer.itemsize, buf, len);
    case FMHA_SOURCE_DLPACK:
        return fmha_dlpack_dtype_name(t->dl_dtype, buf, len);
    case FMHA_SOURCE_TENSOR:
        break;
    }
    snprintf(buf, len, "unknown");
    return buf;
}

/* ------------------------------------------------------------------------ */
/* View lifetime                                                             */
/* ------------------------------------------------------------------------ */

void fmha_tensor_init(fmha_tensor *t, const char *name)
{
    memset(t, 0, sizeof *t);
    t->name = name;
}

void fmha_tensor_close(fmha_tensor *t)
{
    if (t->dev_copy) {
        /* A failure here leaks device memory; there is nobody to tell. */
        (void)fmha_gpu_free(t->dev_copy_device, t->dev_copy_stream, t->dev_copy);
        t->dev_copy = NULL;
    }
    free(t->host_copy);
    t->host_copy = NULL;
    if (t->has_buffer) {
        PyBuffer_Release(&t->buffer);
        t->has_buffer = 0;
    }
    if (t->dl_managed) {
        fmha_dlpack_release(t->dl_managed, t->dl_versioned);
        t->dl_managed = NULL;
    }
    Py_CLEAR(t->array);
    Py_CLEAR(t->tensor_obj);
    t->data = NULL;
    t->user_data = NULL;
    t->present = 0;
}

int64_t fmha_tensor_numel(const fmha_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

void fmha_compact_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = s;
        s *= shape[d] > 0 ? shape[d] : 1;
    }
}

int fmha_tensor_raise_ndim(const fmha_tensor *t, int ndim)
{
    PyErr_Format(PyExc_ValueError, "%s has %d dimensions; at most %d are supported", t->name,
                 ndim, FMHA_TENSOR_MAX_NDIM);
    return -1;
}

/*
 * The checks every view needs once a producer has read its object: the
 * shape, byte sizes that overflow, writes to read-only memory; strides of
 * size-1 dimensions are made canonical (they are never multiplied by a
 * non-zero index, and producers disagree about them), and the caller's
 * memory is recorded.
 */
static int finish_view(fmha_tensor *t, unsigned flags)
{
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0) {
            PyErr_Format(PyExc_ValueError, "%s has a negative dimension (%lld)", t->name,
                         (long long)t->shape[d]);
            return -1;
        }
        if (t->shape[d] == 1)
            t->strides[d] = d == t->ndim - 1 ? 1 : 0;
        if (t->shape[d] > 0 && numel > INT64_MAX / t->shape[d]) {
            PyErr_Format(PyExc_ValueError, "%s is too large", t->name);
            return -1;
        }
        numel *= t->shape[d];
    }
    if (numel > (int64_t)(PY_SSIZE_T_MAX / (Py_ssize_t)t->itemsize)) {
        PyErr_Format(PyExc_ValueError, "%s is too large", t->name);
        return -1;
    }
    if ((flags & FMHA_OPEN_WRITE) && t->readonly) {
        PyErr_Format(PyExc_ValueError, "%s must be writable, but it is read-only", t->name);
        return -1;
    }
    t->user_data = t->data;
    memcpy(t->user_strides, t->strides, sizeof t->strides);
    t->present = 1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Open: which producer builds the view                                      */
/* ------------------------------------------------------------------------ */

void fmha_open_ctx_init(fmha_open_ctx *ctx, fmha_module_state *state, void *stream)
{
    ctx->stream = stream;
    ctx->state = state;
    ctx->torch_device = -1;
}

int fmha_tensor_open(PyObject *obj, unsigned flags, fmha_open_ctx *ctx, fmha_tensor *t)
{
    const fmha_module_state *st = ctx->state;
    PyObject *capsule;
    int rc;
    if (PyObject_TypeCheck(obj, st->tensor_type))
        rc = fmha_device_tensor_open(obj, ctx, t);
    else if (fmha_is_numpy_array(obj))
        rc = fmha_numpy_open(obj, t);
    /* Other exporters of both protocols go through DLPack: CuPy arrays, for
     * one, claim the buffer protocol but refuse it for device memory. */
    else if (PyObject_CheckBuffer(obj) && !PyObject_HasAttr(obj, st->names[FMHA_NAME_DLPACK]))
        rc = fmha_buffer_open(obj, flags, t);
    else if ((capsule = fmha_torch_capsule(obj, ctx)) != NULL)
        rc = fmha_dlpack_view_capsule(capsule, flags, t);
    else if (PyErr_Occurred())
        rc = -1;
    else if (PyObject_HasAttr(obj, st->names[FMHA_NAME_DLPACK])) {
        /* Arbitrary Python runs here and may switch torch's device or stream. */
        ctx->torch_device = -1;
        rc = fmha_dlpack_open(obj, flags, ctx, t);
    } else {
        PyErr_Format(PyExc_TypeError, "%s must be an array (buffer protocol or DLPack: NumPy, "
                     "torch, CuPy, JAX), got %.200s", t->name, Py_TYPE(obj)->tp_name);
        rc = -1;
    }
    if (rc == 0)
        rc = finish_view(t, flags);
    if (rc < 0)
        fmha_tensor_close(t);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Memory extents                                                            */
/* ------------------------------------------------------------------------ */

/* [lo, hi) byte range of the caller's memory; 0 when empty. */
static int user_extent(const fmha_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    if (fmha_tensor_numel(t) == 0 || !t->user_data)
        return 0;
    int64_t low = 0, high = 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = (t->shape[d] - 1) * t->user_strides[d];
        if (span < 0)
            low += span;
        else
            high += span;
    }
    uintptr_t base = (uintptr_t)t->user_data;
    *lo = base + (uintptr_t)(low * (int64_t)t->itemsize);
    *hi = base + (uintptr_t)(high * (int64_t)t->itemsize) + t->itemsize;
    return 1;
}

int fmha_tensor_overlap(const fmha_tensor *a, const fmha_tensor *b)
{
    uintptr_t alo, ahi, blo, bhi;
    if (a->on_gpu != b->on_gpu || (a->on_gpu && a->device_id != b->device_id))
        return 0;
    if (!user_extent(a, &alo, &ahi) || !user_extent(b, &blo, &bhi))
        return 0;
    return alo < bhi && blo < ahi;
}

int fmha_tensor_self_overlaps(const fmha_tensor *t)
{
    /* Sufficient condition for distinct addresses: ordered by |stride|, each
     * stride steps over everything the smaller ones span. */
    int order[FMHA_TENSOR_MAX_NDIM];
    int n = 0;
    if (fmha_tensor_numel(t) == 0)
        return 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1)
            order[n++] = d;
    for (int i = 1; i < n; i++) {
        int key = order[i], j = i - 1;
        while (j >= 0 && llabs(t->user_strides[order[j]]) > llabs(t->user_strides[key])) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = key;
    }
    int64_t span = 1; /* elements covered by the smaller dimensions, plus one */
    for (int i = 0; i < n; i++) {
        int64_t stride = llabs(t->user_strides[order[i]]);
        if (stride < span)
            return 1;
        span += (t->shape[order[i]] - 1) * stride;
    }
    return 0;
}

/* 1 when the caller's memory is compact row-major. */
static int is_compact(const fmha_tensor *t)
{
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->user_strides[d] != expect)
            return 0;
        expect *= t->shape[d];
    }
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Host copies                                                               */
/* ------------------------------------------------------------------------ */

/* Copy every element of an ndim-dimensional array between two layouts. */
static void strided_copy(char *dst, const int64_t *dst_strides, const char *src,
                         const int64_t *src_strides, const int64_t *shape, int ndim,
                         size_t itemsize)
{
    int64_t index[FMHA_TENSOR_MAX_NDIM] = {0};
    if (ndim == 0) {
        memcpy(dst, src, itemsize);
        return;
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0)
            return;
    int last = ndim - 1;
    int rows_contiguous = dst_strides[last] == 1 && src_strides[last] == 1;
    for (;;) {
        int64_t doff = 0, soff = 0;
        for (int d = 0; d < last; d++) {
            doff += index[d] * dst_strides[d];
            soff += index[d] * src_strides[d];
        }
        if (rows_contiguous) {
            memcpy(dst + doff * (int64_t)itemsize, src + soff * (int64_t)itemsize,
                   (size_t)shape[last] * itemsize);
        } else {
            for (int64_t i = 0; i < shape[last]; i++)
                memcpy(dst + (doff + i * dst_strides[last]) * (int64_t)itemsize,
                       src + (soff + i * src_strides[last]) * (int64_t)itemsize, itemsize);
        }
        int d = last - 1;
        while (d >= 0 && ++index[d] == shape[d]) {
            index[d] = 0;
            d--;
        }
        if (d < 0)
            return;
    }
}

/* Make t->host_copy a compact mirror of the caller's memory (gathered when
 * gather) and point data at it. */
static int make_host_copy(fmha_tensor *t, int gather)
{
    int64_t compact[FMHA_TENSOR_MAX_NDIM];
    fmha_compact_strides(t->ndim, t->shape, compact);
    if (!t->host_copy) {
        size_t bytes = (size_t)fmha_tensor_numel(t) * t->itemsize;
        t->host_copy = malloc(bytes ? bytes : 1);
        if (!t->host_copy) {
            PyErr_Format(PyExc_MemoryError, "%s: cannot allocate a host copy of %zu bytes",
                         t->name, bytes);
            return -1;
        }
        if (gather)
            strided_copy(t->host_copy, compact, t->user_data, t->user_strides, t->shape,
                         t->ndim, t->itemsize);
    }
    t->data = t->host_copy;
    memcpy(t->strides, compact, sizeof compact);
    return 0;
}

int fmha_tensor_host_prepare(fmha_tensor *t, int unit_last, int gather)
{
    if (t->on_gpu || fmha_tensor_numel(t) == 0)
        return 0;
    int need = (uintptr_t)t->user_data % t->itemsize != 0;
    for (int d = 0; d < t->ndim; d++)
        need |= t->user_strides[d] < 0;
    if (unit_last && t->ndim > 0)
        need |= t->user_strides[t->ndim - 1] != 1;
    return need ? make_host_copy(t, gather) : 0;
}

void fmha_tensor_fill_host(fmha_tensor *t, const void *value)
{
    /* A source whose strides are all zero is the value everywhere. */
    static const int64_t broadcast[FMHA_TENSOR_MAX_NDIM] = {0};
    if (t->on_gpu)
        return;
    strided_copy(t->user_data, t->user_strides, value, broadcast, t->shape, t->ndim, t->itemsize);
}

void fmha_tensor_host_writeback(fmha_tensor *t)
{
    if (!t->host_copy || fmha_tensor_numel(t) == 0)
        return;
    int64_t compact[FMHA_TENSOR_MAX_NDIM];
    fmha_compact_strides(t->ndim, t->shape, compact);
    strided_copy(t->user_data, t->user_strides, t->host_copy, compact, t->shape, t->ndim,
                 t->itemsize);
}

/* ------------------------------------------------------------------------ */
/* Device staging of host arrays                                             */
/* ------------------------------------------------------------------------ */

fmha_status fmha_tensor_stage(fmha_tensor *t, int device, void *stream, int upload)
{
    if (t->on_gpu)
        return FMHA_OK;
    int64_t numel = fmha_tensor_numel(t);
    size_t bytes = (size_t)numel * t->itemsize;
    int64_t compact[FMHA_TENSOR_MAX_NDIM];
    fmha_compact_strides(t->ndim, t->shape, compact);
    if (numel == 0) {
        t->data = NULL;
        memcpy(t->strides, compact, sizeof compact);
        return FMHA_OK;
    }
    const void *src = t->user_data;
    if (!is_compact(t) || (uintptr_t)t->user_data % t->itemsize != 0) {
        if (!t->host_copy) {
            t->host_copy = malloc(bytes);
            if (!t->host_copy)
                return FMHA_ERR_NOMEM;
            if (upload)
                strided_copy(t->host_copy, compact, t->user_data, t->user_strides, t->shape,
                             t->ndim, t->itemsize);
        }
        src = t->host_copy;
    }
    fmha_status st = fmha_gpu_malloc(device, stream, bytes, &t->dev_copy);
    if (st != FMHA_OK) {
        t->dev_copy = NULL;
        return st;
    }
    t->dev_copy_device = device;
    t->dev_copy_stream = stream;
    if (upload) {
        st = fmha_gpu_memcpy(device, stream, t->dev_copy, src, bytes, FMHA_COPY_H2D);
        if (st != FMHA_OK)
            return st;
    }
    t->data = t->dev_copy;
    memcpy(t->strides, compact, sizeof compact);
    return FMHA_OK;
}

fmha_status fmha_tensor_download(fmha_tensor *t)
{
    if (!t->dev_copy)
        return FMHA_OK;
    size_t bytes = (size_t)fmha_tensor_numel(t) * t->itemsize;
    /* Straight into the caller's memory when it is compact, else into the
     * host mirror that fmha_tensor_host_writeback scatters afterwards. */
    void *dst = t->host_copy ? t->host_copy : t->user_data;
    return fmha_gpu_memcpy(t->dev_copy_device, t->dev_copy_stream, dst, t->dev_copy, bytes,
                           FMHA_COPY_D2H);
}
