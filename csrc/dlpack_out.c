/*
 * dlpack_out.c: fmha_native.Tensor, the DLPack producer for device memory we
 * allocate.
 *
 * Owns the Tensor type (outputs of forward/combine on a GPU for callers the
 * Python glue does not know), its __dlpack__/__dlpack_device__ with the
 * stream rules of the exchange protocol, the capsules it hands out and their
 * deleters (which may run on any thread, with or without the GIL), and the
 * view of our own Tensor when it comes back as an argument.
 */
#include "dlpack_out.h"

#include <stdlib.h>
#include <string.h>

#include "dlpack_in.h"

/* 1 when two stream handles name the same queue. */
static int same_stream(uintptr_t a, uintptr_t b)
{
    return fmha_dlpack_canonical_stream(a) == fmha_dlpack_canonical_stream(b);
}

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
int fmha_device_tensor_open(PyObject *obj, const fmha_open_ctx *ctx, fmha_tensor *t)
{
    fmha_device_tensor *dt = (fmha_device_tensor *)obj;
    if (!same_stream((uintptr_t)dt->ready_stream, (uintptr_t)ctx->stream)) {
        fmha_status st;
        Py_BEGIN_ALLOW_THREADS
        st = fmha_gpu_stream_sync(dt->device, dt->ready_stream);
        Py_END_ALLOW_THREADS
        const fmha_module_state *state = PyType_GetModuleState(Py_TYPE(obj));
        if (!state || fmha_raise_status(state, st, "waiting for the stream that wrote a "
                                        "fmha_native.Tensor") < 0)
            return -1;
    }
    t->source = FMHA_SOURCE_TENSOR;
    t->elem = dt->elem;
    t->itemsize = fmha_elem_size(dt->elem);
    t->ndim = dt->ndim;
    memcpy(t->shape, dt->shape, sizeof t->shape);
    memcpy(t->strides, dt->strides, sizeof t->strides);
    t->data = dt->data;
    t->on_gpu = 1;
    t->device_id = dt->device;
    t->readonly = 0;
    Py_INCREF(obj);
    t->tensor_obj = obj;
    return 0;
}

void fmha_tensor_mark_written(fmha_tensor *t, void *stream)
{
    if (t->tensor_obj)
        ((fmha_device_tensor *)t->tensor_obj)->ready_stream = stream;
}

/* ------------------------------------------------------------------------ */
/* Export                                                                    */
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
    int versioned = PyCapsule_IsValid(capsule, FMHA_DLPACK_CAPSULE_VERSIONED);
    if (versioned || PyCapsule_IsValid(capsule, FMHA_DLPACK_CAPSULE)) {
        void *m = PyCapsule_GetPointer(capsule, versioned ? FMHA_DLPACK_CAPSULE_VERSIONED
                                                          : FMHA_DLPACK_CAPSULE);
        if (m)
            fmha_dlpack_release(m, versioned);
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved);
#else
    PyErr_Restore(exc_type, exc_value, exc_tb);
#endif
}

static int32_t own_dl_device_type(void)
{
    return fmha_dlpack_platform_is_hip() ? kDLROCM : kDLCUDA;
}

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
    /* The consumer reads on stream (None: the default stream; -1: it asks for no wait). */
    int wait;
    if (stream != Py_None) {
        if (!PyLong_Check(stream) || PyBool_Check(stream)) {
            PyErr_SetString(PyExc_TypeError, "stream must be an integer or None");
            return NULL;
        }
        long long s = PyLong_AsLongLong(stream);
        if (s == -1 && PyErr_Occurred())
            return NULL;
        if (s != FMHA_DLPACK_NO_SYNC_STREAM &&
            (s < 0 || (s == 0 && !fmha_dlpack_platform_is_hip()))) {
            PyErr_SetString(PyExc_ValueError, "stream must be -1, a stream handle or 1 or 2 "
                            "(CUDA forbids 0)");
            return NULL;
        }
        wait = s != FMHA_DLPACK_NO_SYNC_STREAM &&
               !same_stream((uintptr_t)s, (uintptr_t)self->ready_stream);
    } else {
        wait = !same_stream((uintptr_t)self->ready_stream, 0);
    }
    if (wait) {
        /* No cross-stream events in our ABI: wait on the host instead. */
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
        if (!same_stream((uintptr_t)self->ready_stream, (uintptr_t)self->alloc_stream))
            (void)fmha_gpu_stream_sync(self->device, self->ready_stream);
        (void)fmha_gpu_free(self->device, self->alloc_stream, self->data);
        self->data = NULL;
    }
    type->tp_free(self_obj);
    Py_DECREF(type);
}

static PyMethodDef device_tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))device_tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n"
     "--\n\n"
     "Export as a DLPack capsule (versioned when max_version >= (1, 0))."},
    {"__dlpack_device__", device_tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\n(device_type, device_id) of the DLPack protocol."},
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
    fmha_compact_strides(ndim, self->shape, self->strides);
    if (numel > 0) {
        fmha_status status = fmha_gpu_malloc(device, stream, (size_t)numel * fmha_elem_size(elem),
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
