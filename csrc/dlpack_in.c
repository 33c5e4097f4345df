/*
 * dlpack_in.c: the DLPack consumer.
 *
 * Owns the reading of DLPack capsules, versioned (1.x) and legacy, into a
 * view; the device query and the stream argument of the Python exchange
 * protocol; the ownership hand-over of a consumed managed tensor; and the
 * names of DLPack dtypes.  Rules followed (array API "data interchange"):
 * __dlpack_device__ first, then __dlpack__(stream=..., max_version=(1, 0))
 * with the stream only for device tensors; the capsule is renamed to its
 * "used_" name only once its tensor has been read, after which we own the
 * managed tensor and call its deleter in fmha_tensor_close.  Before the
 * rename, an error simply drops the capsule and the producer's destructor
 * deletes it.
 */
#include "dlpack_in.h"

#include <stdio.h>
#include <string.h>

static int platform_is(const char *name) { return strcmp(fmha_gpu_platform(), name) == 0; }

int fmha_dlpack_platform_is_hip(void) { return platform_is("hip"); }

uintptr_t fmha_dlpack_canonical_stream(uintptr_t s)
{
    if (!fmha_dlpack_platform_is_hip() && s == FMHA_DLPACK_CUDA_LEGACY_STREAM)
        return 0;
    return s;
}

/* ------------------------------------------------------------------------ */
/* Devices and streams                                                       */
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

/* ------------------------------------------------------------------------ */
/* Dtypes                                                                    */
/* ------------------------------------------------------------------------ */

/* The element types we compute with; everything else is OTHER. */
static fmha_elem dl_elem(DLDataType dt)
{
    if (dt.lanes != 1)
        return FMHA_ELEM_OTHER;
    if (dt.code == kDLFloat && dt.bits == 16)
        return FMHA_ELEM_F16;
    if (dt.code == kDLFloat && dt.bits == 32)
        return FMHA_ELEM_F32;
    if (dt.code == kDLBfloat && dt.bits == 16)
        return FMHA_ELEM_BF16;
    if (dt.code == kDLInt && dt.bits == 32)
        return FMHA_ELEM_I32;
    if (dt.code == kDLFloat8_e4m3fn && dt.bits == 8)
        return FMHA_ELEM_E4M3;
    if (dt.code == kDLUInt && dt.bits == 8)
        return FMHA_ELEM_U8;
    return FMHA_ELEM_OTHER;
}

const char *fmha_dlpack_dtype_name(DLDataType dt, char *buf, size_t len)
{
    static const char *const low_precision[] = {
        [kDLFloat8_e3m4] = "float8_e3m4",
        [kDLFloat8_e4m3] = "float8_e4m3",
        [kDLFloat8_e4m3b11fnuz] = "float8_e4m3b11fnuz",
        [kDLFloat8_e4m3fn] = "float8_e4m3fn",
        [kDLFloat8_e4m3fnuz] = "float8_e4m3fnuz",
        [kDLFloat8_e5m2] = "float8_e5m2",
        [kDLFloat8_e5m2fnuz] = "float8_e5m2fnuz",
        [kDLFloat8_e8m0fnu] = "float8_e8m0fnu",
        [kDLFloat6_e2m3fn] = "float6_e2m3fn",
        [kDLFloat6_e3m2fn] = "float6_e3m2fn",
        [kDLFloat4_e2m1fn] = "float4_e2m1fn",
    };
    const char *kind = NULL;    /* a name with the width in bits after it */
    const char *fixed = NULL;   /* a name that says its width */
    int b = dt.bits;
    switch (dt.code) {
    case kDLInt:
        kind = b == 8 || b == 16 || b == 32 || b == 64 ? "int" : NULL;
        break;
    case kDLUInt:
        kind = b == 8 || b == 16 || b == 32 || b == 64 ? "uint" : NULL;
        break;
    case kDLFloat:
        kind = b == 16 || b == 32 || b == 64 ? "float" : NULL;
        break;
    case kDLBfloat:
        fixed = b == 16 ? "bfloat16" : NULL;
        break;
    case kDLComplex:
        kind = b == 64 || b == 128 ? "complex" : NULL;
        break;
    case kDLBool:
        fixed = b == 8 ? "bool" : NULL;
        break;
    default:
        if (dt.code < sizeof low_precision / sizeof low_precision[0])
            fixed = low_precision[dt.code];
        break;
    }
    if (dt.lanes == 1 && kind)
        snprintf(buf, len, "%s%d", kind, b);
    else if (dt.lanes == 1 && fixed)
        snprintf(buf, len, "%s", fixed);
    else
        snprintf(buf, len, "DLPack dtype code %d, %d bits, %d lanes", (int)dt.code, b,
                 (int)dt.lanes);
    return buf;
}

/* ------------------------------------------------------------------------ */
/* Capsules                                                                  */
/* ------------------------------------------------------------------------ */

int fmha_dlpack_view_capsule(PyObject *capsule, unsigned flags, fmha_tensor *t)
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
    t->source = FMHA_SOURCE_DLPACK;
    t->dl_dtype = dl->dtype;
    t->elem = dl_elem(dl->dtype);
    if (dl->ndim < 0 || dl->ndim > FMHA_TENSOR_MAX_NDIM) {
        fmha_tensor_raise_ndim(t, (int)dl->ndim);
        goto fail;
    }
    if ((flags & FMHA_OPEN_WRITE) && (dl_flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
        PyErr_Format(PyExc_ValueError, "%s was exported by DLPack as a copy, so writes to it "
                     "would be lost; pass a tensor that shares memory", t->name);
        goto fail;
    }
    if (t->elem != FMHA_ELEM_OTHER) {
        t->itemsize = fmha_elem_size(t->elem);
    } else {
        /* Only for extents: such a view fails validation before its memory is used. */
        size_t bits = (size_t)dl->dtype.bits * (dl->dtype.lanes ? dl->dtype.lanes : 1);
        t->itemsize = bits >= 8 ? (bits + 7) / 8 : 1;
    }
    t->ndim = dl->ndim;
    for (int d = 0; d < t->ndim; d++)
        t->shape[d] = dl->shape[d];
    if (dl->strides) {
        for (int d = 0; d < t->ndim; d++)
            t->strides[d] = dl->strides[d];
    } else {
        fmha_compact_strides(t->ndim, t->shape, t->strides);
    }
    t->data = (char *)dl->data + dl->byte_offset;
    t->on_gpu = where == 1;
    t->device_id = t->on_gpu ? dl->device.device_id : 0;
    t->readonly = (dl_flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;

    /* Read: take ownership of the managed tensor (fmha_tensor_close deletes it,
     * also when the view fails the checks that follow). */
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

int fmha_dlpack_open(PyObject *obj, unsigned flags, const fmha_open_ctx *ctx, fmha_tensor *t)
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
    return fmha_dlpack_view_capsule(capsule, flags, t);
}

void fmha_dlpack_release(void *managed, int versioned)
{
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->deleter)
            m->deleter(m);
    } else {
        DLManagedTensor *m = managed;
        if (m->deleter)
            m->deleter(m);
    }
}
