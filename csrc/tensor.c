/*
 * tensor.c: the tensor layer between Python objects and fmha_fwd_params.
 *
 * Owns the uniform view of a caller's tensor (fmha_tensor) built from the
 * buffer protocol (NumPy, including ml_dtypes bfloat16, which has no buffer
 * format) or from DLPack (torch, CuPy, JAX, NumPy), the host copies and
 * device staging that let the backends assume a unit head_dim stride, and
 * fmha_native.Tensor, the DLPack producer for device memory we allocate.
 *
 * DLPack consumer rules followed here (array API "data interchange"):
 * __dlpack_device__ first, then __dlpack__(stream=..., max_version=(1, 0))
 * with the stream only for device tensors; the capsule is renamed to its
 * "used_" name only once the view is complete, after which we own the managed
 * tensor and call its deleter in fmha_tensor_close.  Before the rename, an
 * error simply drops the capsule and the producer's destructor deletes it.
 *
 * torch.Tensor's __dlpack_device__ and __dlpack__ are Python functions that
 * cost more than the rest of a decode call together; for exact torch.Tensor
 * inputs torch_fast_capsule does in C what they would do and calls the
 * exporter they end in, and hands every other case to the generic path.
 * Also owns the module state's interned names and torch hooks.
 */
#include "tensor.h"

#include <stdlib.h>
#include <string.h>

#include "dlpack.h"

/* The legacy default stream as a DLPack `stream` argument: CUDA reserves 0
 * (ambiguous) and names the legacy stream 1; ROCm names its default stream 0. */
#define FMHA_DLPACK_CUDA_LEGACY_STREAM 1
#define FMHA_DLPACK_ROCM_DEFAULT_STREAM 0
/* A consumer passing stream=-1 asks the producer not to synchronise. */
#define FMHA_DLPACK_NO_SYNC_STREAM (-1)

static int platform_is(const char *name) { return strcmp(fmha_gpu_platform(), name) == 0; }

const char *fmha_elem_name(fmha_elem elem)
{
    switch (elem) {
    case FMHA_ELEM_F16: return "float16";
    case FMHA_ELEM_BF16: return "bfloat16";
    case FMHA_ELEM_F32: return "float32";
    case FMHA_ELEM_I32: return "int32";
    }
    return "unknown";
}

static size_t elem_size(fmha_elem elem)
{
    return elem == FMHA_ELEM_F16 || elem == FMHA_ELEM_BF16 ? 2 : 4;
}

int fmha_raise_status(const fmha_module_state *st, fmha_status status, const char *what)
{
    switch (status) {
    case FMHA_OK:
        return 0;
    case FMHA_ERR_NOMEM:
        PyErr_Format(PyExc_MemoryError, "%s: out of memory", what);
        break;
    case FMHA_ERR_RUNTIME:
        PyErr_Format(st->error, "%s: GPU runtime error: %s", what, fmha_gpu_error_string());
        break;
    case FMHA_ERR_UNSUPPORTED:
        PyErr_Format(PyExc_NotImplementedError, "%s: not supported by this backend", what);
        break;
    case FMHA_ERR_NO_DEVICE:
        PyErr_Format(st->error, "%s: no GPU is available: %s", what, fmha_gpu_error_string());
        break;
    case FMHA_ERR_INVALID:
    default:
        PyErr_Format(st->error, "%s: internal error: the backend rejected the parameters "
                     "(status %d)", what, (int)status);
        break;
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Module state                                                              */
/* ------------------------------------------------------------------------ */

int fmha_state_init(fmha_module_state *st)
{
    static const char *const texts[FMHA_NAME_COUNT] = {
#define FMHA_NAME_TEXT(id, text) text,
        FMHA_NAMES(FMHA_NAME_TEXT)
#undef FMHA_NAME_TEXT
    };
    for (int i = 0; i < FMHA_NAME_COUNT; i++)
        if (!(st->names[i] = PyUnicode_InternFromString(texts[i])))
            return -1;
    st->dlpack_version = Py_BuildValue("(ii)", FMHA_DLPACK_MAJOR_VERSION,
                                       FMHA_DLPACK_MINOR_VERSION);
    st->kw_stream_version = PyTuple_Pack(2, st->names[FMHA_NAME_STREAM],
                                         st->names[FMHA_NAME_MAX_VERSION]);
    st->kw_version = PyTuple_Pack(1, st->names[FMHA_NAME_MAX_VERSION]);
    st->kw_stream = PyTuple_Pack(1, st->names[FMHA_NAME_STREAM]);
    st->kw_dtype = PyTuple_Pack(1, st->names[FMHA_NAME_DTYPE]);
    if (!st->dlpack_version || !st->kw_stream_version || !st->kw_version || !st->kw_stream ||
        !st->kw_dtype)
        return -1;
    return 0;
}

/* Every object reference the state holds besides names[] (traverse and clear). */
#define FMHA_STATE_REFS(X)                                                                 \
    X(error) X(tensor_type) X(dlpack_version) X(kw_stream_version) X(kw_version)           \
    X(kw_stream) X(kw_dtype) X(torch.tensor_type) X(torch.strided) X(torch.to_dlpack)     \
    X(torch.has_torch_function) X(torch.current_device) X(torch.current_stream)

int fmha_state_traverse(fmha_module_state *st, visitproc visit, void *arg)
{
    for (int i = 0; i < FMHA_NAME_COUNT; i++)
        Py_VISIT(st->names[i]);
#define FMHA_VISIT(member) Py_VISIT(st->member);
    FMHA_STATE_REFS(FMHA_VISIT)
#undef FMHA_VISIT
    return 0;
}

void fmha_state_clear(fmha_module_state *st)
{
    for (int i = 0; i < FMHA_NAME_COUNT; i++)
        Py_CLEAR(st->names[i]);
#define FMHA_CLEAR(member) Py_CLEAR(st->member);
    FMHA_STATE_REFS(FMHA_CLEAR)
#undef FMHA_CLEAR
    st->torch.state = 0;
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
        if (t->dl_versioned) {
            DLManagedTensorVersioned *m = t->dl_managed;
            if (m->deleter)
                m->deleter(m);
        } else {
            DLManagedTensor *m = t->dl_managed;
            if (m->deleter)
                m->deleter(m);
        }
        t->dl_managed = NULL;
    }
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

static void compact_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = s;
        s *= shape[d] > 0 ? shape[d] : 1;
    }
}

/*
 * Shared end of every open: check the shape, make strides of size-1
 * dimensions canonical (they are never multiplied by a non-zero index, and
 * producers disagree about them), reject byte sizes that overflow, and record
 * the caller's memory.
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
/* Buffer protocol                                                           */
/* ------------------------------------------------------------------------ */

static int host_is_little_endian(void)
{
    const uint16_t probe = 1;
    return *(const unsigned char *)&probe == 1;
}

/* Element type of a struct-module format string with native sizes; 0 or -1. */
static int parse_format(const char *fmt, Py_ssize_t itemsize, fmha_elem *elem)
{
    if (!fmt)
        return -1; /* unsigned bytes */
    char order = fmt[0];
    if (order == '@' || order == '=' || order == '<' || order == '>' || order == '!') {
        int little = order == '<';
        int big = order == '>' || order == '!';
        if ((little && !host_is_little_endian()) || (big && host_is_little_endian()))
            return -1;
        fmt++;
    }
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return -1;
    switch (fmt[0]) {
    case 'e': *elem = FMHA_ELEM_F16; break;
    case 'f': *elem = FMHA_ELEM_F32; break;
    case 'i':
    case 'l':
        *elem = FMHA_ELEM_I32;
        break;
    default: return -1;
    }
    return itemsize == (Py_ssize_t)elem_size(*elem) ? 0 : -1;
}

/* getattr(obj, name, None) without raising AttributeError: 0 (with *out
 * possibly NULL) or -1 on another error. */
static int get_optional_attr(PyObject *obj, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(obj, name);
    if (*out)
        return 0;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* 1 when obj is a NumPy array of ml_dtypes bfloat16 (itemsize 2), 0 if not,
 * -1 on error. */
static int is_numpy_bfloat16(PyObject *obj)
{
    PyObject *dtype = NULL, *name = NULL, *itemsize = NULL;
    int result = 0;
    if (get_optional_attr(obj, "dtype", &dtype) < 0)
        return -1;
    if (!dtype)
        return 0;
    if (get_optional_attr(dtype, "name", &name) < 0)
        goto fail;
    if (get_optional_attr(dtype, "itemsize", &itemsize) < 0)
        goto fail;
    if (name && itemsize && PyUnicode_Check(name) && PyLong_Check(itemsize)) {
        result = PyUnicode_CompareWithASCIIString(name, "bfloat16") == 0 &&
                 PyLong_AsLong(itemsize) == (long)elem_size(FMHA_ELEM_BF16);
    }
    Py_DECREF(dtype);
    Py_XDECREF(name);
    Py_XDECREF(itemsize);
    return result;
fail:
    Py_XDECREF(dtype);
    Py_XDECREF(name);
    Py_XDECREF(itemsize);
    return -1;
}

/*
 * PyObject_GetBuffer with PyBUF_WRITABLE added under FMHA_OPEN_WRITE.  0 on
 * success; -1 when the exporter refused the request (exception set); -2 when
 * it refused only because the object is read-only (ValueError set).
 */
static int get_buffer(PyObject *obj, int request, unsigned flags, fmha_tensor *t)
{
    int writable = (flags & FMHA_OPEN_WRITE) != 0;
    if (PyObject_GetBuffer(obj, &t->buffer, request | (writable ? PyBUF_WRITABLE : 0)) == 0) {
        t->has_buffer = 1;
        return 0;
    }
    if (!writable)
        return -1;
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    if (PyObject_GetBuffer(obj, &t->buffer, request) == 0) {
        PyBuffer_Release(&t->buffer);
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        PyErr_Format(PyExc_ValueError, "%s must be writable, but it is read-only", t->name);
        return -2;
    }
    PyErr_Clear();
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return -1;
}

static int open_buffer(PyObject *obj, unsigned flags, fmha_tensor *t)
{
    int rc = get_buffer(obj, PyBUF_STRIDES | PyBUF_FORMAT, flags, t);
    if (rc == -2)
        return -1;
    if (rc == 0) {
        if (parse_format(t->buffer.format, t->buffer.itemsize, &t->elem) < 0) {
            PyErr_Format(PyExc_TypeError,
                         "%s has element format '%s'; expected float16, bfloat16 or float32 "
                         "(int32 for cache_seqlens) in native byte order",
                         t->name, t->buffer.format ? t->buffer.format : "B");
            return -1;
        }
    } else {
        /* ml_dtypes' bfloat16 has no buffer format: NumPy refuses PyBUF_FORMAT. */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        int bf16 = is_numpy_bfloat16(obj);
        if (bf16 <= 0) {
            if (bf16 == 0) {
                PyObject *why = exc_value ? PyObject_Str(exc_value) : NULL;
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s: cannot read its buffer (%S); expected "
                             "float16, bfloat16 or float32 elements", t->name,
                             why ? why : Py_None);
                Py_XDECREF(why);
            }
            Py_XDECREF(exc_type);
            Py_XDECREF(exc_value);
            Py_XDECREF(exc_tb);
            return -1;
        }
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        if (get_buffer(obj, PyBUF_STRIDES, flags, t) < 0)
            return -1;
        if (t->buffer.itemsize != (Py_ssize_t)elem_size(FMHA_ELEM_BF16)) {
            PyErr_Format(PyExc_TypeError, "%s: a bfloat16 array must have 2-byte items",
                         t->name);
            return -1;
        }
        t->elem = FMHA_ELEM_BF16;
    }

    Py_buffer *b = &t->buffer;
    if (b->ndim > FMHA_TENSOR_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "%s has %d dimensions; at most %d are supported",
                     t->name, b->ndim, FMHA_TENSOR_MAX_NDIM);
        return -1;
    }
    t->itemsize = elem_size(t->elem);
    t->ndim = b->ndim;
    for (int d = 0; d < t->ndim; d++) {
        t->shape[d] = b->shape[d];
        if (b->strides[d] % b->itemsize != 0) {
            PyErr_Format(PyExc_ValueError, "%s has a byte stride (%zd) that is not a multiple "
                         "of its item size (%zd)", t->name, b->strides[d], b->itemsize);
            return -1;
        }
        t->strides[d] = b->strides[d] / b->itemsize;
    }
    t->data = b->buf;
    t->readonly = b->readonly;
    t->on_gpu = 0;
    t->from_buffer = 1;
    return finish_view(t, flags);
}

/* ------------------------------------------------------------------------ */
/* DLPack consumer                                                           */
/* ------------------------------------------------------------------------ */

static const char *dl_device_name(int32_t type)
{
    switch (type) {
    case kDLCPU: return "CPU";
    case kDLCUDA: return "CUDA";
    case kDLCUDAHost: return "CUDA host";
    case kDLROCM: return "ROCm";
    case kDLROCMHost: return "ROCm host";
    case kDLCUDAManaged: return "CUDA managed";
    default: return "unknown";
    }
}

/* Where a DLPack device type lives for this build: 0 host, 1 GPU, -1 unusable. */
static int classify_device(int32_t type)
{
    switch (type) {
    case kDLCPU:
    case kDLCUDAHost:
    case kDLROCMHost:
        return 0;
    case kDLCUDA:
    case kDLCUDAManaged:
        return platform_is("cuda") ? 1 : -1;
    case kDLROCM:
        return platform_is("hip") ? 1 : -1;
    default:
        return -1;
    }
}

static int raise_bad_device(const fmha_tensor *t, int32_t type)
{
    PyErr_Format(PyExc_ValueError, "%s lives on DLPack device type %d (%s), which this build "
                 "of fmha_native cannot read (GPU backend: %s)", t->name, (int)type,
                 dl_device_name(type), fmha_gpu_platform());
    return -1;
}

/* The `stream` argument for __dlpack__ of a device tensor used on stream. */
static PyObject *dlpack_stream_arg(void *stream)
{
    uintptr_t s = (uintptr_t)stream;
    if (s == 0)
        s = platform_is("hip") ? FMHA_DLPACK_ROCM_DEFAULT_STREAM : FMHA_DLPACK_CUDA_LEGACY_STREAM;
    return PyLong_FromUnsignedLongLong((unsigned long long)s);
}

/* (device_type, device_id) from __dlpack_device__; 0 or -1. */
static int query_dlpack_device(const fmha_module_state *st, PyObject *obj, const fmha_tensor *t,
                               int *have, int32_t *type)
{
    PyObject *res = NULL, *item = NULL;
    *have = 0;
    if (!PyObject_HasAttr(obj, st->names[FMHA_NAME_DLPACK_DEVICE]))
        return 0;
    PyObject *self_arg[1] = {obj};
    res = PyObject_VectorcallMethod(st->names[FMHA_NAME_DLPACK_DEVICE], self_arg,
                                    1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (!res)
        goto fail;
    if (!PySequence_Check(res) || PySequence_Size(res) != 2) {
        PyErr_Format(PyExc_TypeError, "%s.__dlpack_device__() must return a pair "
                     "(device_type, device_id)", t->name);
        goto fail;
    }
    item = PySequence_GetItem(res, 0);
    if (!item)
        goto fail;
    long v = PyLong_AsLong(item);
    if (v == -1 && PyErr_Occurred())
        goto fail;
    *type = (int32_t)v;
    *have = 1;
    Py_DECREF(item);
    Py_DECREF(res);
    return 0;
fail:
    Py_XDECREF(item);
    Py_XDECREF(res);
    return -1;
}

/* obj.__dlpack__(stream=..., max_version=(1, 0)), keywords passed by vectorcall
 * with the module's interned names. */
static PyObject *call_dlpack(const fmha_module_state *st, PyObject *obj, int pass_stream,
                             void *stream)
{
    PyObject *method = NULL, *stream_arg = NULL, *capsule = NULL;
    method = PyObject_GetAttr(obj, st->names[FMHA_NAME_DLPACK]);
    if (!method)
        goto done;
    if (pass_stream && !(stream_arg = dlpack_stream_arg(stream)))
        goto done;
    PyObject *with_version[2] = {pass_stream ? stream_arg : st->dlpack_version,
                                 st->dlpack_version};
    capsule = PyObject_Vectorcall(method, with_version, 0,
                                  pass_stream ? st->kw_stream_version : st->kw_version);
    if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {
        /* A producer older than DLPack 1.0 has no max_version keyword. */
        PyErr_Clear();
        PyObject *without_version[1] = {stream_arg};
        capsule = PyObject_Vectorcall(method, pass_stream ? without_version : NULL, 0,
                                      pass_stream ? st->kw_stream : NULL);
    }
done:
    Py_XDECREF(method);
    Py_XDECREF(stream_arg);
    return capsule;
}

static int dl_elem(const fmha_tensor *t, DLDataType dt, fmha_elem *elem)
{
    if (dt.lanes == 1) {
        if (dt.code == kDLFloat && dt.bits == 16) {
            *elem = FMHA_ELEM_F16;
            return 0;
        }
        if (dt.code == kDLFloat && dt.bits == 32) {
            *elem = FMHA_ELEM_F32;
            return 0;
        }
        if (dt.code == kDLBfloat && dt.bits == 16) {
            *elem = FMHA_ELEM_BF16;
            return 0;
        }
        if (dt.code == kDLInt && dt.bits == 32) {
            *elem = FMHA_ELEM_I32;
            return 0;
        }
    }
    PyErr_Format(PyExc_TypeError, "%s has DLPack dtype (code %d, %d bits, %d lanes); expected "
                 "float16, bfloat16 or float32 (int32 for cache_seqlens)", t->name,
                 (int)dt.code, (int)dt.bits, (int)dt.lanes);
    return -1;
}

static uintptr_t canonical_stream(uintptr_t s);

/* ---- torch fast path ---- */

/* Look torch's entry points up (see fmha_torch_hooks); stays unresolved while
 * torch is not imported, so a later import still gets the fast path. */
static void resolve_torch(fmha_module_state *st)
{
    fmha_torch_hooks *h = &st->torch;
    PyObject *torch = NULL, *torch_c = NULL, *cuda = NULL;
    torch = PyImport_GetModule(st->names[FMHA_NAME_TORCH]);
    if (!torch) {
        PyErr_Clear();
        return;
    }
    h->state = -1;
    h->tensor_type = PyObject_GetAttrString(torch, "Tensor");
    h->strided = PyObject_GetAttrString(torch, "strided");
    torch_c = PyObject_GetAttrString(torch, "_C");
    if (!h->tensor_type || !h->strided || !torch_c || !PyType_Check(h->tensor_type))
        goto fail;
    h->to_dlpack = PyObject_GetAttrString(torch_c, "_to_dlpack_versioned");
    h->has_torch_function = PyObject_GetAttrString(torch_c, "_has_torch_function_unary");
    if (!h->to_dlpack || !h->has_torch_function)
        goto fail;
    /* The tensor attributes torch_fast_capsule reads, in case this torch
     * predates one of them. */
    static const fmha_name attrs[] = {FMHA_NAME_REQUIRES_GRAD, FMHA_NAME_IS_CONJ,
                                      FMHA_NAME_LAYOUT, FMHA_NAME_IS_CPU, FMHA_NAME_IS_CUDA,
                                      FMHA_NAME_GET_DEVICE};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        if (!PyObject_HasAttr(h->tensor_type, st->names[attrs[i]]))
            goto fail;
    /* CUDA tensors also need the current device and stream; a CPU-only torch
     * has neither, and its tensors never reach that branch. */
    cuda = PyObject_GetAttrString(torch, "cuda");
    if (cuda) {
        h->current_device = PyObject_GetAttrString(cuda, "current_device");
        h->current_stream = PyObject_GetAttrString(torch_c, "_cuda_getCurrentRawStream");
    }
    if (!h->current_device || !h->current_stream) {
        Py_CLEAR(h->current_device);
        Py_CLEAR(h->current_stream);
    }
    PyErr_Clear();
    h->state = 1;
    goto done;
fail:
    PyErr_Clear();
    Py_CLEAR(h->tensor_type);
    Py_CLEAR(h->strided);
    Py_CLEAR(h->to_dlpack);
    Py_CLEAR(h->has_torch_function);
done:
    Py_XDECREF(cuda);
    Py_XDECREF(torch_c);
    Py_DECREF(torch);
}

/* bool(obj.<name>), or of obj.<name>() when call; 1, 0 or -1. */
static int torch_flag(PyObject *obj, PyObject *name, int call)
{
    PyObject *self_arg[1] = {obj};
    PyObject *v = call ? PyObject_VectorcallMethod(name, self_arg,
                                                   1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)
                       : PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* A Python int result of fn(arg) (or fn() when arg is NULL) as long long;
 * 0 or -1. */
static int torch_call_int(PyObject *fn, PyObject *arg, long long *out)
{
    PyObject *v = arg ? PyObject_CallOneArg(fn, arg) : PyObject_CallNoArgs(fn);
    if (!v)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/*
 * For a CUDA tensor: 1 when torch.Tensor.__dlpack__(stream=<our stream>)
 * would neither raise for the device nor order streams, i.e. the tensor is on
 * torch's current device and torch's current stream there is the stream we
 * launch on (the producer's pending work is then already ordered before
 * ours); 0 when the generic path must run; -1 on error.
 */
static int torch_cuda_ready(PyObject *obj, fmha_open_ctx *ctx)
{
    fmha_module_state *st = ctx->state;
    fmha_torch_hooks *h = &st->torch;
    long long device, current, stream;
    PyObject *self_arg[1] = {obj}, *device_obj = NULL;
    if (!h->current_device || !h->current_stream || !fmha_gpu_compiled())
        return 0;
    device_obj = PyObject_VectorcallMethod(st->names[FMHA_NAME_GET_DEVICE], self_arg,
                                           1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (!device_obj)
        return -1;
    device = PyLong_AsLongLong(device_obj);
    if (device == -1 && PyErr_Occurred())
        goto fail;
    if (device >= 0 && device == ctx->torch_device) {
        Py_DECREF(device_obj);
        return 1;
    }
    if (torch_call_int(h->current_device, NULL, &current) < 0)
        goto fail;
    if (device < 0 || current != device) {
        Py_DECREF(device_obj);
        return 0;
    }
    if (torch_call_int(h->current_stream, device_obj, &stream) < 0)
        goto fail;
    Py_DECREF(device_obj);
    if (canonical_stream((uintptr_t)stream) != canonical_stream((uintptr_t)ctx->stream))
        return 0;
    ctx->torch_device = (int)device;
    return 1;
fail:
    Py_DECREF(device_obj);
    return -1;
}

/*
 * The capsule torch.Tensor.__dlpack__(stream=..., max_version=(1, 0)) would
 * return for an exact torch.Tensor when everything that function does before
 * it calls torch._C._to_dlpack_versioned reduces to nothing (no
 * __torch_function__ override or mode, no autograd history, strided layout,
 * CPU, or CUDA as torch_cuda_ready says; no conjugate bit, checked last).
 * The capsule (never consumed on the way back to the generic path) is
 * dropped when that path must run instead, which only frees it.  NULL without
 * an exception: take the generic path, which calls __dlpack__ itself and so
 * raises or orders streams exactly as torch does.  NULL with one: error.
 */
static PyObject *torch_fast_capsule(PyObject *obj, fmha_open_ctx *ctx)
{
    fmha_module_state *st = ctx->state;
    fmha_torch_hooks *h = &st->torch;
    int r;
    if (h->state == 0 && strcmp(Py_TYPE(obj)->tp_name, "Tensor") == 0)
        resolve_torch(st);
    if (h->state != 1 || (PyObject *)Py_TYPE(obj) != h->tensor_type)
        return NULL;
    PyObject *overridden = PyObject_CallOneArg(h->has_torch_function, obj);
    if (!overridden)
        return NULL;
    r = PyObject_IsTrue(overridden);
    Py_DECREF(overridden);
    if (r != 0)
        return NULL;
    if ((r = torch_flag(obj, st->names[FMHA_NAME_REQUIRES_GRAD], 0)) != 0)
        return NULL;
    PyObject *layout = PyObject_GetAttr(obj, st->names[FMHA_NAME_LAYOUT]);
    if (!layout)
        return NULL;
    int strided = layout == h->strided;
    Py_DECREF(layout);
    if (!strided)
        return NULL;
    if ((r = torch_flag(obj, st->names[FMHA_NAME_IS_CPU], 0)) < 0)
        return NULL;
    if (r == 0) {
        if ((r = torch_flag(obj, st->names[FMHA_NAME_IS_CUDA], 0)) <= 0 ||
            (r = torch_cuda_ready(obj, ctx)) <= 0)
            return NULL;
    }
    PyObject *capsule = PyObject_CallOneArg(h->to_dlpack, obj);
    if (!capsule)
        return NULL;
    if (!PyCapsule_IsValid(capsule, FMHA_DLPACK_CAPSULE_VERSIONED)) {
        Py_DECREF(capsule);
        return NULL;
    }
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, FMHA_DLPACK_CAPSULE_VERSIONED);
    if (m->dl_tensor.dtype.code == kDLComplex) {
        /* Only complex tensors can carry the conjugate bit that __dlpack__
         * refuses; asking every tensor would cost more than the rest. */
        r = torch_flag(obj, st->names[FMHA_NAME_IS_CONJ], 1);
        if (r != 0) {
            Py_DECREF(capsule);
            return NULL;
        }
    }
    return capsule;
}

/* ---- capsule consumer ---- */

/* View the tensor in a DLPack capsule; takes the reference to capsule. */
static int view_capsule(PyObject *capsule, unsigned flags, fmha_tensor *t)
{
    DLTensor *dl = NULL;
    void *managed = NULL;
    int versioned = 0;
    uint64_t dl_flags = 0;
    if (PyCapsule_IsValid(capsule, FMHA_DLPACK_CAPSULE_VERSIONED)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, FMHA_DLPACK_CAPSULE_VERSIONED);
        if (!m)
            goto fail;
        if (m->version.major > FMHA_DLPACK_MAJOR_VERSION) {
            PyErr_Format(PyExc_TypeError, "%s: its DLPack version %u.%u is newer than the "
                         "%d.x that fmha_native reads", t->name, m->version.major,
                         m->version.minor, FMHA_DLPACK_MAJOR_VERSION);
            goto fail;
        }
        dl = &m->dl_tensor;
        dl_flags = m->flags;
        managed = m;
        versioned = 1;
    } else if (PyCapsule_IsValid(capsule, FMHA_DLPACK_CAPSULE)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, FMHA_DLPACK_CAPSULE);
        if (!m)
            goto fail;
        dl = &m->dl_tensor;
        managed = m;
    } else {
        PyErr_Format(PyExc_TypeError, "%s.__dlpack__() did not return an unconsumed DLPack "
                     "capsule", t->name);
        goto fail;
    }

    int where = classify_device(dl->device.device_type);
    if (where < 0) {
        raise_bad_device(t, dl->device.device_type);
        goto fail;
    }
    if (dl_elem(t, dl->dtype, &t->elem) < 0)
        goto fail;
    if (dl->ndim < 0 || dl->ndim > FMHA_TENSOR_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "%s has %d dimensions; at most %d are supported",
                     t->name, (int)dl->ndim, FMHA_TENSOR_MAX_NDIM);
        goto fail;
    }
    if ((flags & FMHA_OPEN_WRITE) && (dl_flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
        PyErr_Format(PyExc_ValueError, "%s was exported by DLPack as a copy, so writes to it "
                     "would be lost; pass a tensor that shares memory", t->name);
        goto fail;
    }
    t->itemsize = elem_size(t->elem);
    t->ndim = dl->ndim;
    for (int d = 0; d < t->ndim; d++)
        t->shape[d] = dl->shape[d];
    if (dl->strides) {
        for (int d = 0; d < t->ndim; d++)
            t->strides[d] = dl->strides[d];
    } else {
        compact_strides(t->ndim, t->shape, t->strides);
    }
    t->data = (char *)dl->data + dl->byte_offset;
    t->on_gpu = where == 1;
    t->device_id = t->on_gpu ? dl->device.device_id : 0;
    t->readonly = (dl_flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    if (finish_view(t, flags) < 0)
        goto fail;

    /* The view is complete: take ownership of the managed tensor. */
    if (PyCapsule_SetName(capsule, versioned ? FMHA_DLPACK_CAPSULE_VERSIONED_USED
                                             : FMHA_DLPACK_CAPSULE_USED) < 0)
        goto fail;
    t->dl_managed = managed;
    t->dl_versioned = versioned;
    Py_DECREF(capsule);
    return 0;
fail:
    /* Not renamed: dropping the capsule lets the producer's destructor delete it. */
    Py_XDECREF(capsule);
    return -1;
}

/* The generic consumer: __dlpack_device__ first, then __dlpack__ with our
 * stream for device tensors. */
static int open_dlpack(PyObject *obj, unsigned flags, const fmha_open_ctx *ctx, fmha_tensor *t)
{
    int have_device = 0;
    int32_t device_type = kDLCPU;
    if (query_dlpack_device(ctx->state, obj, t, &have_device, &device_type) < 0)
        return -1;
    int pass_stream = 0;
    if (have_device) {
        int where = classify_device(device_type);
        if (where < 0)
            return raise_bad_device(t, device_type);
        pass_stream = where == 1;
    }
    PyObject *capsule = call_dlpack(ctx->state, obj, pass_stream, ctx->stream);
    if (!capsule)
        return -1;
    return view_capsule(capsule, flags, t);
}

/* ------------------------------------------------------------------------ */
/* fmha_native.Tensor (producer)                                             */
/* ------------------------------------------------------------------------ */

typedef struct fmha_device_tensor {
    PyObject_HEAD
    void *data;                 /* device memory we own (NULL when empty) */
    int device;
    void *alloc_stream;         /* frees are ordered on the allocating stream */
    void *ready_stream;         /* the last write was on this stream */
    int ndim;
    int64_t shape[FMHA_TENSOR_MAX_NDIM];
    int64_t strides[FMHA_TENSOR_MAX_NDIM];
    fmha_elem elem;
} fmha_device_tensor;

/* Our own Tensor skips __dlpack__, so do here what its producer side would:
 * work on another stream that last wrote it must finish first. */
static int open_own_tensor(PyObject *obj, unsigned flags, const fmha_open_ctx *ctx,
                           fmha_tensor *t)
{
    fmha_device_tensor *dt = (fmha_device_tensor *)obj;
    if (canonical_stream((uintptr_t)dt->ready_stream) != canonical_stream((uintptr_t)ctx->stream)) {
        fmha_status st;
        Py_BEGIN_ALLOW_THREADS
        st = fmha_gpu_stream_sync(dt->device, dt->ready_stream);
        Py_END_ALLOW_THREADS
        const fmha_module_state *state = PyType_GetModuleState(Py_TYPE(obj));
        if (!state || fmha_raise_status(state, st, "waiting for the stream that wrote a "
                                        "fmha_native.Tensor") < 0)
            return -1;
    }
    t->elem = dt->elem;
    t->itemsize = elem_size(dt->elem);
    t->ndim = dt->ndim;
    memcpy(t->shape, dt->shape, sizeof t->shape);
    memcpy(t->strides, dt->strides, sizeof t->strides);
    t->data = dt->data;
    t->on_gpu = 1;
    t->device_id = dt->device;
    t->readonly = 0;
    Py_INCREF(obj);
    t->tensor_obj = obj;
    return finish_view(t, flags);
}

void fmha_open_ctx_init(fmha_open_ctx *ctx, fmha_module_state *state, void *stream)
{
    ctx->stream = stream;
    ctx->state = state;
    ctx->torch_device = -1;
}

/*
 * The buffer protocol is the way in for NumPy arrays (it reads ml_dtypes
 * bfloat16, which DLPack cannot describe) and for buffers without DLPack.
 * Other objects that export both go through DLPack: CuPy arrays, for one,
 * claim the buffer protocol but refuse it for device memory.
 */
static int prefers_buffer(const fmha_module_state *st, PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
    for (PyTypeObject *t = type; t; t = t->tp_base)
        if (strcmp(t->tp_name, "numpy.ndarray") == 0)
            return 1;
    return !PyObject_HasAttr(obj, st->names[FMHA_NAME_DLPACK]);
}

int fmha_tensor_open(PyObject *obj, unsigned flags, fmha_open_ctx *ctx, fmha_tensor *t)
{
    const fmha_module_state *st = ctx->state;
    PyObject *capsule;
    int rc;
    if (PyObject_TypeCheck(obj, st->tensor_type))
        rc = open_own_tensor(obj, flags, ctx, t);
    else if (PyObject_CheckBuffer(obj) && prefers_buffer(st, obj))
        rc = open_buffer(obj, flags, t);
    else if ((capsule = torch_fast_capsule(obj, ctx)) != NULL)
        rc = view_capsule(capsule, flags, t);
    else if (PyErr_Occurred())
        rc = -1;
    else if (PyObject_HasAttr(obj, st->names[FMHA_NAME_DLPACK])) {
        /* Arbitrary Python runs here and may switch torch's device or stream. */
        ctx->torch_device = -1;
        rc = open_dlpack(obj, flags, ctx, t);
    } else {
        PyErr_Format(PyExc_TypeError, "%s must be an array (buffer protocol or DLPack: NumPy, "
                     "torch, CuPy, JAX), got %.200s", t->name, Py_TYPE(obj)->tp_name);
        rc = -1;
    }
    if (rc < 0)
        fmha_tensor_close(t);
    return rc;
}

void fmha_tensor_mark_written(fmha_tensor *t, void *stream)
{
    if (t->tensor_obj)
        ((fmha_device_tensor *)t->tensor_obj)->ready_stream = stream;
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

int fmha_tensor_is_compact(const fmha_tensor *t)
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
    compact_strides(t->ndim, t->shape, compact);
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
    compact_strides(t->ndim, t->shape, compact);
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
    compact_strides(t->ndim, t->shape, compact);
    if (numel == 0) {
        t->data = NULL;
        memcpy(t->strides, compact, sizeof compact);
        return FMHA_OK;
    }
    const void *src = t->user_data;
    if (!fmha_tensor_is_compact(t) || (uintptr_t)t->user_data % t->itemsize != 0) {
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

/* ------------------------------------------------------------------------ */
/* fmha_native.Tensor methods                                                */
/* ------------------------------------------------------------------------ */

/* One allocation holds the managed tensor and the shape/strides it points to. */
typedef struct fmha_export {
    union {
        DLManagedTensor legacy;
        DLManagedTensorVersioned versioned;
    } m;                        /* first member: the deleter's argument is the export */
    PyObject *owner;            /* the Tensor, kept alive while a consumer holds it */
    int64_t shape[FMHA_TENSOR_MAX_NDIM];
    int64_t strides[FMHA_TENSOR_MAX_NDIM];
} fmha_export;

static int interpreter_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* The deleter may run on any thread, with or without the GIL, even while
 * the interpreter shuts down (then the Tensor is leaked, not touched). */
static void export_release(fmha_export *e)
{
    PyObject *owner = e->owner;
    free(e);
    if (!owner || !Py_IsInitialized() || interpreter_finalizing())
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(owner);
    PyGILState_Release(gil);
}

static void export_deleter_legacy(DLManagedTensor *m) { export_release((fmha_export *)m); }

static void export_deleter_versioned(DLManagedTensorVersioned *m)
{
    export_release((fmha_export *)m);
}

/* Destructor of the capsules we produce: deletes only unconsumed ones (a
 * consumer that renamed the capsule calls the deleter itself). */
static void export_capsule_destructor(PyObject *capsule)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *saved = PyErr_GetRaisedException();
#else
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
#endif
    if (PyCapsule_IsValid(capsule, FMHA_DLPACK_CAPSULE_VERSIONED)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, FMHA_DLPACK_CAPSULE_VERSIONED);
        if (m && m->deleter)
            m->deleter(m);
    } else if (PyCapsule_IsValid(capsule, FMHA_DLPACK_CAPSULE)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, FMHA_DLPACK_CAPSULE);
        if (m && m->deleter)
            m->deleter(m);
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved);
#else
    PyErr_Restore(exc_type, exc_value, exc_tb);
#endif
}

static int32_t own_dl_device_type(void) { return platform_is("hip") ? kDLROCM : kDLCUDA; }

static DLDataType own_dl_dtype(fmha_elem elem)
{
    DLDataType dt = {kDLFloat, 16, 1};
    if (elem == FMHA_ELEM_BF16)
        dt.code = kDLBfloat;
    else if (elem == FMHA_ELEM_F32)
        dt.bits = 32;
    else if (elem == FMHA_ELEM_I32) {
        dt.code = kDLInt;
        dt.bits = 32;
    }
    return dt;
}

/* Streams that name the same queue compare equal: on CUDA 0 (our NULL) and
 * the DLPack legacy-stream number 1 are both the legacy default stream. */
static uintptr_t canonical_stream(uintptr_t s)
{
    if (!platform_is("hip") && s == FMHA_DLPACK_CUDA_LEGACY_STREAM)
        return 0;
    return s;
}

/* FmhaError (from the Tensor type's module state) for a failed export sync. */
static int raise_export_status(PyObject *self_obj, fmha_status status)
{
    const fmha_module_state *state = PyType_GetModuleState(Py_TYPE(self_obj));
    if (!state)
        return -1;
    return fmha_raise_status(state, status, "fmha_native.Tensor.__dlpack__");
}

static PyObject *device_tensor_dlpack(PyObject *self_obj, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    fmha_device_tensor *self = (fmha_device_tensor *)self_obj;
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    fmha_export *e = NULL;
    PyObject *capsule = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream,
                                     &max_version, &dl_device, &copy))
        return NULL;

    int versioned = 0;
    if (max_version != Py_None) {
        long major;
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2 ||
            ((major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0))) == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
            return NULL;
        }
        versioned = major >= FMHA_DLPACK_MAJOR_VERSION;
    }
    if (dl_device != Py_None) {
        long type, id;
        if (!PyTuple_Check(dl_device) || PyTuple_GET_SIZE(dl_device) != 2 ||
            ((type = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 0))) == -1 && PyErr_Occurred()) ||
            ((id = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 1))) == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "dl_device must be a (device_type, device_id) tuple");
            return NULL;
        }
        if (type != own_dl_device_type() || id != self->device) {
            PyErr_SetString(PyExc_BufferError, "fmha_native.Tensor exports only to its own device");
            return NULL;
        }
    }
    if (copy != Py_None) {
        int want_copy = PyObject_IsTrue(copy);
        if (want_copy < 0)
            return NULL;
        if (want_copy) {
            PyErr_SetString(PyExc_BufferError, "fmha_native.Tensor cannot export a copy");
            return NULL;
        }
    }
    if (stream != Py_None) {
        if (!PyLong_Check(stream) || PyBool_Check(stream)) {
            PyErr_SetString(PyExc_TypeError, "stream must be an integer or None");
            return NULL;
        }
        long long s = PyLong_AsLongLong(stream);
        if (s == -1 && PyErr_Occurred())
            return NULL;
        if (s != FMHA_DLPACK_NO_SYNC_STREAM) {
            if (s < 0 || (s == 0 && !platform_is("hip"))) {
                PyErr_SetString(PyExc_ValueError, "stream must be -1, a stream handle or 1 or 2 "
                                "(CUDA forbids 0)");
                return NULL;
            }
            if (canonical_stream((uintptr_t)s) != canonical_stream((uintptr_t)self->ready_stream)) {
                /* No cross-stream events in our ABI: wait on the host instead. */
                fmha_status st;
                Py_BEGIN_ALLOW_THREADS
                st = fmha_gpu_stream_sync(self->device, self->ready_stream);
                Py_END_ALLOW_THREADS
                if (raise_export_status(self_obj, st) < 0)
                    return NULL;
            }
        }
    } else if (canonical_stream((uintptr_t)self->ready_stream) != 0) {
        /* None means the consumer uses the default stream. */
        fmha_status st;
        Py_BEGIN_ALLOW_THREADS
        st = fmha_gpu_stream_sync(self->device, self->ready_stream);
        Py_END_ALLOW_THREADS
        if (raise_export_status(self_obj, st) < 0)
            return NULL;
    }

    e = calloc(1, sizeof *e);
    if (!e)
        return PyErr_NoMemory();
    memcpy(e->shape, self->shape, sizeof e->shape);
    memcpy(e->strides, self->strides, sizeof e->strides);
    DLTensor *dl = versioned ? &e->m.versioned.dl_tensor : &e->m.legacy.dl_tensor;
    dl->data = self->data;
    dl->device.device_type = own_dl_device_type();
    dl->device.device_id = self->device;
    dl->ndim = self->ndim;
    dl->dtype = own_dl_dtype(self->elem);
    dl->shape = e->shape;
    dl->strides = e->strides;
    dl->byte_offset = 0;
    if (versioned) {
        e->m.versioned.version.major = FMHA_DLPACK_MAJOR_VERSION;
        e->m.versioned.version.minor = FMHA_DLPACK_MINOR_VERSION;
        e->m.versioned.manager_ctx = self;
        e->m.versioned.deleter = export_deleter_versioned;
        e->m.versioned.flags = 0;
    } else {
        e->m.legacy.manager_ctx = self;
        e->m.legacy.deleter = export_deleter_legacy;
    }
    capsule = PyCapsule_New(&e->m, versioned ? FMHA_DLPACK_CAPSULE_VERSIONED : FMHA_DLPACK_CAPSULE,
                            export_capsule_destructor);
    if (!capsule) {
        free(e);
        return NULL;
    }
    Py_INCREF(self_obj);
    e->owner = self_obj;
    return capsule;
}

static PyObject *device_tensor_dlpack_device(PyObject *self_obj, PyObject *unused)
{
    (void)unused;
    fmha_device_tensor *self = (fmha_device_tensor *)self_obj;
    return Py_BuildValue("(ii)", (int)own_dl_device_type(), self->device);
}

static PyObject *device_tensor_shape(PyObject *self_obj, void *closure)
{
    (void)closure;
    fmha_device_tensor *self = (fmha_device_tensor *)self_obj;
    PyObject *shape = PyTuple_New(self->ndim);
    if (!shape)
        return NULL;
    for (int d = 0; d < self->ndim; d++) {
        PyObject *v = PyLong_FromLongLong(self->shape[d]);
        if (!v) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, d, v);
    }
    return shape;
}

static PyObject *device_tensor_dtype(PyObject *self_obj, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(fmha_elem_name(((fmha_device_tensor *)self_obj)->elem));
}

static PyObject *device_tensor_device(PyObject *self_obj, void *closure)
{
    (void)closure;
    return PyUnicode_FromFormat("%s:%d", fmha_gpu_platform(),
                                ((fmha_device_tensor *)self_obj)->device);
}

static PyObject *device_tensor_ndim(PyObject *self_obj, void *closure)
{
    (void)closure;
    return PyLong_FromLong(((fmha_device_tensor *)self_obj)->ndim);
}

static PyObject *device_tensor_repr(PyObject *self_obj)
{
    PyObject *shape = device_tensor_shape(self_obj, NULL);
    if (!shape)
        return NULL;
    fmha_device_tensor *self = (fmha_device_tensor *)self_obj;
    PyObject *r = PyUnicode_FromFormat("fmha_native.Tensor(shape=%R, dtype=%s, device=%s:%d)",
                                       shape, fmha_elem_name(self->elem), fmha_gpu_platform(),
                                       self->device);
    Py_DECREF(shape);
    return r;
}

static void device_tensor_dealloc(PyObject *self_obj)
{
    fmha_device_tensor *self = (fmha_device_tensor *)self_obj;
    PyTypeObject *type = Py_TYPE(self_obj);
    if (self->data) {
        /* A write on another stream must finish before a free ordered on the
         * allocating stream can recycle the memory. */
        if (canonical_stream((uintptr_t)self->ready_stream) !=
            canonical_stream((uintptr_t)self->alloc_stream))
            (void)fmha_gpu_stream_sync(self->device, self->ready_stream);
        (void)fmha_gpu_free(self->device, self->alloc_stream, self->data);
        self->data = NULL;
    }
    type->tp_free(self_obj);
    Py_DECREF(type);
}

static PyMethodDef device_tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))device_tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "Export as a DLPack capsule (versioned when max_version >= (1, 0))."},
    {"__dlpack_device__", device_tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(device_type, device_id) of the DLPack protocol."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef device_tensor_getset[] = {
    {"shape", device_tensor_shape, NULL, "tuple of dimensions", NULL},
    {"dtype", device_tensor_dtype, NULL, "element type name", NULL},
    {"device", device_tensor_device, NULL, "\"cuda:N\" or \"hip:N\"", NULL},
    {"ndim", device_tensor_ndim, NULL, "number of dimensions", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#ifndef Py_TPFLAGS_DISALLOW_INSTANTIATION
/* Python 3.9: refuse construction from Python by hand. */
#define Py_TPFLAGS_DISALLOW_INSTANTIATION 0
static PyObject *device_tensor_no_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args, (void)kwargs;
    PyErr_Format(PyExc_TypeError, "cannot create '%s' instances", type->tp_name);
    return NULL;
}
#define FMHA_TENSOR_NO_NEW_SLOT {Py_tp_new, device_tensor_no_new},
#else
#define FMHA_TENSOR_NO_NEW_SLOT
#endif

static PyType_Slot device_tensor_slots[] = {
    FMHA_TENSOR_NO_NEW_SLOT
    {Py_tp_dealloc, device_tensor_dealloc},
    {Py_tp_repr, device_tensor_repr},
    {Py_tp_methods, device_tensor_methods},
    {Py_tp_getset, device_tensor_getset},
    {Py_tp_doc, "Device memory written by fmha_native, exported through DLPack "
                "(e.g. jax.numpy.from_dlpack(t)).  Created by forward/combine only."},
    {0, NULL},
};

PyType_Spec fmha_device_tensor_spec = {
    .name = "fmha_native.Tensor",
    .basicsize = sizeof(fmha_device_tensor),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = device_tensor_slots,
};

PyObject *fmha_device_tensor_new(const fmha_module_state *st, int device, void *stream,
                                 int ndim, const int64_t *shape, fmha_elem elem)
{
    PyTypeObject *type = st->tensor_type;
    fmha_device_tensor *self = (fmha_device_tensor *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->device = device;
    self->alloc_stream = stream;
    self->ready_stream = stream;
    self->ndim = ndim;
    self->elem = elem;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        self->shape[d] = shape[d];
        numel *= shape[d];
    }
    compact_strides(ndim, self->shape, self->strides);
    if (numel > 0) {
        fmha_status status = fmha_gpu_malloc(device, stream, (size_t)numel * elem_size(elem),
                                             &self->data);
        if (status != FMHA_OK) {
            self->data = NULL;
            Py_DECREF(self);
            fmha_raise_status(st, status, "allocating an output");
            return NULL;
        }
    }
    return (PyObject *)self;
}
