/*
 * dlpack_in.h: the DLPack consumer (dlpack_in.c).
 */
#ifndef FMHA_DLPACK_IN_H
#define FMHA_DLPACK_IN_H

#include "tensor.h"

/* The generic consumer: obj.__dlpack_device__(), then obj.__dlpack__() with
 * the call's stream for device tensors (see fmha_tensor_open). */
int fmha_dlpack_open(PyObject *obj, unsigned flags, const fmha_open_ctx *ctx, fmha_tensor *t);

/* View the tensor in a DLPack capsule (versioned or legacy) and own it once
 * the view is complete; takes the reference to capsule.  0 or -1. */
int fmha_dlpack_view_capsule(PyObject *capsule, unsigned flags, fmha_tensor *t);

/* Call the deleter of a managed tensor (versioned or legacy), if it has one. */
void fmha_dlpack_release(void *managed, int versioned);

/* A DLPack dtype as users know it ("int64", "bfloat16", "float8_e4m3fn";
 * "DLPack dtype code C, B bits, L lanes" when it has no name); into buf,
 * which it returns. */
const char *fmha_dlpack_dtype_name(DLDataType dtype, char *buf, size_t len);

/* 1 when this build's GPU runtime is HIP (DLPack numbers its devices and
 * default stream differently from CUDA). */
int fmha_dlpack_platform_is_hip(void);

/* Streams that name the same queue map to one value: on CUDA 0 (our NULL)
 * and the DLPack legacy-stream number 1 are both the legacy default stream. */
uintptr_t fmha_dlpack_canonical_stream(uintptr_t stream);

#endif /* FMHA_DLPACK_IN_H */
