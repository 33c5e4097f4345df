/*
 * tensor.h: one view of a caller's tensor, whatever exported it.
 *
 * Owns fmha_tensor (data pointer, shape, element strides, dtype, where it
 * lives, read-only flag, which producer made it and what must be released),
 * the dispatch of fmha_tensor_open to the producer files (host_array.c for
 * NumPy and the buffer protocol, dlpack_out.c for our own Tensor, torch.c and
 * dlpack_in.c for DLPack), the overlap checks, and the host copies and device
 * staging that make any caller layout acceptable to the backends.  Every
 * function that can fail sets a Python exception and returns -1 (or NULL);
 * the views are released with fmha_tensor_close on every path.
 */
#ifndef FMHA_TENSOR_H
#define FMHA_TENSOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "dlpack.h"
#include "fmha.h"
#include "module.h"

/* More dimensions than any argument of ours has (combine's outs has 5). */
#define FMHA_TENSOR_MAX_NDIM 8

/* Element types a view can hold: the three of fmha_dtype, int32 for the
 * metadata (cache_seqlens, block_table, cu_seqlens_q/k), and OTHER for every dtype no argument accepts (the view is
 * still made, so that validation can name the argument, what it expects and
 * what it got: fmha_tensor_dtype_name). */
typedef enum fmha_elem {
    FMHA_ELEM_F16 = FMHA_DTYPE_F16,
    FMHA_ELEM_BF16 = FMHA_DTYPE_BF16,
    FMHA_ELEM_F32 = FMHA_DTYPE_F32,
    FMHA_ELEM_I32 = 3,
    FMHA_ELEM_OTHER = 4,
    /* An fp8 KV cache (issue 22): float8 e4m3fn (torch float8_e4m3fn, DLPack
     * kDLFloat8_e4m3fn, ml_dtypes float8_e4m3fn), or uint8 storage of the same codes,
     * which k/v accept with kv_dtype="e4m3fn". */
    FMHA_ELEM_E4M3 = 5,
    FMHA_ELEM_U8 = 6,
} fmha_elem;

/* Which producer made a view: decides how its dtype is named. */
typedef enum fmha_source {
    FMHA_SOURCE_NUMPY = 0,      /* a NumPy array (NumPy C API) */
    FMHA_SOURCE_BUFFER = 1,     /* another buffer-protocol exporter */
    FMHA_SOURCE_DLPACK = 2,     /* a DLPack capsule (torch, CuPy, JAX, ...) */
    FMHA_SOURCE_TENSOR = 3,     /* our own fmha_native.Tensor */
} fmha_source;

/* Flags of fmha_tensor_open. */
#define FMHA_OPEN_WRITE 1u /* we will write into it: it must be writable and not a copy */

/*
 * What fmha_tensor_open needs to know besides the object: the stream the
 * call will launch on (passed to __dlpack__ of device tensors so the producer
 * orders its pending work before ours) and the module state (Tensor type,
 * interned names, torch hooks).  One context serves all the tensors of one
 * call; torch_device memoises the torch fast path's device check for it.
 */
typedef struct fmha_open_ctx {
    void *stream;               /* the launch stream; NULL = the default stream */
    fmha_module_state *state;   /* this module's state */
    int torch_device;           /* CUDA ordinal whose current device and stream were
                                   found to match this call; -1 = none checked */
} fmha_open_ctx;

/* A context for one call on stream. */
void fmha_open_ctx_init(fmha_open_ctx *ctx, fmha_module_state *state, void *stream);

typedef struct fmha_tensor {
    const char *name;           /* the argument's name, for messages */
    fmha_elem elem;
    size_t itemsize;            /* bytes per element (1 for sub-byte OTHER dtypes) */
    int ndim;
    int64_t shape[FMHA_TENSOR_MAX_NDIM];

    /* What the backend reads or writes: the caller's memory, a compact host
     * copy of it, or a device copy of it (strides in elements). */
    void *data;
    int64_t strides[FMHA_TENSOR_MAX_NDIM];

    /* The caller's memory, kept for overlap checks and write-back. */
    void *user_data;
    int64_t user_strides[FMHA_TENSOR_MAX_NDIM];

    int present;                /* 1: opened (the argument was given) */
    int on_gpu;                 /* 1: device memory of GPU device_id */
    int device_id;
    int readonly;
    fmha_source source;
    DLDataType dl_dtype;        /* FMHA_SOURCE_DLPACK: the producer's dtype */

    /* ---- ownership (released by fmha_tensor_close) ---- */
    PyObject *array;            /* FMHA_SOURCE_NUMPY: the array (strong reference) */
    Py_buffer buffer;           /* valid when has_buffer */
    int has_buffer;
    void *dl_managed;           /* a consumed DLManagedTensor(Versioned): we call its deleter */
    int dl_versioned;
    PyObject *tensor_obj;       /* a fmha_native.Tensor we write into (strong reference) */
    void *host_copy;            /* compact host copy (malloc) */
    void *dev_copy;             /* device copy of a host array (fmha_gpu_malloc) */
    int dev_copy_device;
    void *dev_copy_stream;
} fmha_tensor;

/* Zero a view so that fmha_tensor_close is safe on it. */
void fmha_tensor_init(fmha_tensor *t, const char *name);

/*
 * View obj: our own Tensor, a NumPy array (incl. ml_dtypes bfloat16), the
 * buffer protocol of an object without DLPack, else DLPack (exact
 * torch.Tensor through the torch fast path when it applies), else TypeError
 * naming the argument.  Checks only what the view itself needs: a supported
 * device, at most FMHA_TENSOR_MAX_NDIM dimensions, strides that are whole
 * elements, and writability under FMHA_OPEN_WRITE; the dtype is checked by
 * validation.  Returns 0, or -1 with an exception set and t released.
 */
int fmha_tensor_open(PyObject *obj, unsigned flags, fmha_open_ctx *ctx, fmha_tensor *t);

/* Release everything the view holds.  Idempotent. */
void fmha_tensor_close(fmha_tensor *t);

/* Number of elements (0 when any dimension is 0). */
int64_t fmha_tensor_numel(const fmha_tensor *t);

/* 1 when the caller's memory of a and b shares any byte of their extents. */
int fmha_tensor_overlap(const fmha_tensor *a, const fmha_tensor *b);

/* 1 when two distinct elements of the caller's memory alias (zero or
 * interleaved strides): such a tensor cannot be written. */
int fmha_tensor_self_overlaps(const fmha_tensor *t);

/* Name of an element type we compute with ("float16", "bfloat16", "float32",
 * "int32", "float8_e4m3fn", "uint8"). */
const char *fmha_elem_name(fmha_elem elem);

/* Bytes per element of an element type we compute with. */
size_t fmha_elem_size(fmha_elem elem);

/* The view's dtype as its user knows it ("float64", "big-endian float32",
 * "int64", ...), whichever producer made it; into buf, which it returns. */
const char *fmha_tensor_dtype_name(const fmha_tensor *t, char *buf, size_t len);

/* Room for fmha_tensor_dtype_name. */
#define FMHA_DTYPE_NAME_LEN 80

/*
 * Host arrays for the CPU backend: when a stride is negative, the data is
 * misaligned, or unit_last and the last stride is not 1, point data at a
 * compact host copy (filled from the caller's memory when gather).  Device
 * views are left alone.  Returns 0 or -1 (MemoryError).
 */
int fmha_tensor_host_prepare(fmha_tensor *t, int unit_last, int gather);

/* Set every element of a host view's caller memory to *value (itemsize bytes). */
void fmha_tensor_fill_host(fmha_tensor *t, const void *value);

/* After the backend wrote t: copy a host copy back into the caller's memory. */
void fmha_tensor_host_writeback(fmha_tensor *t);

/*
 * Host arrays computed on a GPU: point data at a compact device copy on
 * device, uploaded on stream when upload.  fmha_tensor_download enqueues the
 * copy back into host memory; after the stream is synchronised,
 * fmha_tensor_host_writeback finishes it.  Return an fmha_status.
 */
fmha_status fmha_tensor_stage(fmha_tensor *t, int device, void *stream, int upload);
fmha_status fmha_tensor_download(fmha_tensor *t);

/* ---- for the producer files, which read objects into views ---- */

/* Row-major strides (in elements) of shape. */
void fmha_compact_strides(int ndim, const int64_t *shape, int64_t *strides);

/* The "at most FMHA_TENSOR_MAX_NDIM dimensions" error; returns -1. */
int fmha_tensor_raise_ndim(const fmha_tensor *t, int ndim);

#endif /* FMHA_TENSOR_H */
