/*
 * torch.h: the torch fast path (torch.c).
 */
#ifndef FMHA_TORCH_H
#define FMHA_TORCH_H

#include "tensor.h"

/*
 * The capsule torch.Tensor.__dlpack__(stream=..., max_version=(1, 0)) would
 * return for obj, taken without running torch's Python code, when obj is an
 * exact torch.Tensor for which that function would do nothing but export.
 * NULL without an exception: take the generic DLPack path.  NULL with one:
 * error.
 */
PyObject *fmha_torch_capsule(PyObject *obj, fmha_open_ctx *ctx);

#endif /* FMHA_TORCH_H */
