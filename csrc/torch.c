/*
 * torch.c: the torch fast path into the DLPack consumer.
 *
 * torch.Tensor's __dlpack_device__ and __dlpack__ are Python functions that
 * cost more than the rest of a decode call together.  For exact torch.Tensor
 * inputs this file does in C what they would do (the checks that make them
 * raise or order streams) and calls the exporter they end in; every other
 * case goes to the generic consumer in dlpack_in.c, which calls __dlpack__
 * itself.  Owns the resolution of torch's entry points (fmha_torch_hooks in
 * the module state) the first time a torch tensor is seen.
 */
#include "torch.h"

#include <string.h>

#include "dlpack_in.h"

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
    if (fmha_dlpack_canonical_stream((uintptr_t)stream) !=
        fmha_dlpack_canonical_stream((uintptr_t)ctx->stream))
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
PyObject *fmha_torch_capsule(PyObject *obj, fmha_open_ctx *ctx)
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
