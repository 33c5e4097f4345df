/*
 * dlpack_out.h: fmha_native.Tensor, our DLPack producer (dlpack_out.c).
 */
#ifndef FMHA_DLPACK_OUT_H
#define FMHA_DLPACK_OUT_H

#include "tensor.h"

extern PyType_Spec fmha_device_tensor_spec;

/*
 * A new uninitialised fmha_native.Tensor of compact shape on GPU device,
 * allocated in stream order on stream.  NULL with an exception on failure.
 */
PyObject *fmha_device_tensor_new(const fmha_module_state *st, int device, void *stream,
                                 int ndim, const int64_t *shape, fmha_elem elem);

/* Read one of our Tensors into t (see fmha_tensor_open); work on another
 * stream that last wrote it is waited for first.  0 or -1. */
int fmha_device_tensor_open(PyObject *obj, const fmha_open_ctx *ctx, fmha_tensor *t);

/* After a launch on stream wrote t: when t is a fmha_native.Tensor, later
 * consumers on other streams must wait for stream. */
void fmha_tensor_mark_written(fmha_tensor *t, void *stream);

#endif /* FMHA_DLPACK_OUT_H */
