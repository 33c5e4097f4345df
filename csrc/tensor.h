/*
 * tensor.h: one view of a caller's tensor, whatever exported it.
 *
 * Owns fmha_tensor (data pointer, shape, element strides, dtype, where it
 * lives, read-only flag, and what must be released), its construction from
 * the buffer protocol or DLPack, the host copies and device staging that
 * make any caller layout acceptable to the backends, and fmha_native.Tensor,
 * the small DLPack producer for device outputs of callers the Python glue
 * does not know.  Every function that can fail sets a Python exception and
 * returns -1 (or NULL); the views are released with fmha_tensor_close on every
 * path.
 */
#ifndef FMHA_TENSOR_H
#define FMHA_TENSOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "fmha.h"

/* More dimensions than any argument of ours has (combine's outs has 5). */
#define FMHA_TENSOR_MAX_NDIM 8

/* Element types a view can hold: the three of fmha_dtype, plus int32 for
 * cache_seqlens. */
typedef enum fmha_elem {
    FMHA_ELEM_F16 = FMHA_DTYPE_F16,
    FMHA_ELEM_BF16 = FMHA_DTYPE_BF16,
    FMHA_ELEM_F32 = FMHA_DTYPE_F32,
    FMHA_ELEM_I32 = 3,
} fmha_elem;

/*
 * Python names the hot paths look up on every call, interned once at module
 * init so that a lookup is a pointer-keyed dict probe rather than a new
 * string, a hash and an intern-table probe.  X(id, "text").
 */
#define FMHA_NAMES(X)                                                                  \
    X(DLPACK, "__dlpack__")                                                            \
    X(DLPACK_DEVICE, "__dlpack_device__")                                              \
    X(STREAM, "stream")                                                                \
    X(MAX_VERSION, "max_version")                                                      \
    X(DTYPE, "dtype")                                                                  \
    X(EMPTY, "empty")                                                                  \
    X(NUMPY, "numpy")                                                                  \
    X(TORCH, "torch")                                                                  \
    X(REQUIRES_GRAD, "requires_grad")                                                  \
    X(IS_CONJ, "is_conj")                                                              \
    X(LAYOUT, "layout")                                                                \
    X(IS_CPU, "is_cpu")                                                                \
    X(IS_CUDA, "is_cuda")                                                              \
    X(GET_DEVICE, "get_device")                                                        \
    /* argument names of forward/explain/combine (besides those below) */              \
    X(Q, "q")                                                                          \
    X(K, "k")                                                                          \
    X(V, "v")                                                                          \
    X(RETURN_LSE, "return_lse")                                                        \
    X(OUT, "out")                                                                      \
    X(LSE, "lse")                                                                      \
    X(CACHE_SEQLENS, "cache_seqlens")                                                  \
    X(K_NEW, "k_new")                                                                  \
    X(V_NEW, "v_new")                                                                  \
    X(OUTS, "outs")                                                                    \
    X(LSES, "lses")                                                                    \
    X(MET, "met")                                                                      \
    X(WHY, "why")                                                                      \
    /* explain() keys (besides dtype) */                                               \
    X(BACKEND, "backend")                                                              \
    X(SUPPORTED, "supported")                                                          \
    X(KERNEL, "kernel")                                                                \
    X(KERNEL_ID, "kernel_id")                                                          \
    X(NUM_SPLITS, "num_splits")                                                        \
    X(REQUESTED_SPLITS, "requested_splits")                                            \
    X(STREAM_SPLITS, "stream_splits")                                                  \
    X(KV_READ_ONCE, "kv_read_once")                                                    \
    X(BLOCK_M, "block_m")                                                              \
    X(BLOCK_N, "block_n")                                                              \
    X(PACK_GQA, "pack_gqa")                                                            \
    X(REASON, "reason")                                                                \
    X(GATE, "gate")                                                                    \
    X(BATCH, "batch")                                                                  \
    X(SEQLEN_Q, "seqlen_q")                                                            \
    X(SEQLEN_K, "seqlen_k")                                                            \
    X(HEADS_Q, "heads_q")                                                              \
    X(HEADS_KV, "heads_kv")                                                            \
    X(HEAD_DIM, "head_dim")                                                            \
    X(CAUSAL, "causal")                                                                \
    X(SOFTMAX_SCALE, "softmax_scale")                                                  \
    X(KV_CACHE, "kv_cache")                                                            \
    X(SEQLEN_NEW, "seqlen_new")                                                        \
    X(DEVICE, "device")                                                                \
    X(DEVICE_ORDINAL, "device_ordinal")                                                \
    X(ARCH, "arch")                                                                    \
    X(SM_COUNT, "sm_count")                                                            \
    X(INPUTS_ON_HOST, "inputs_on_host")                                                \
    X(CPU_THREADS, "cpu_threads")                                                      \
    X(CPU_SIMD, "cpu_simd")                                                            \
    X(GPU_REJECTED, "gpu_rejected")

typedef enum fmha_name {
#define FMHA_NAME_ENUM(id, text) FMHA_NAME_##id,
    FMHA_NAMES(FMHA_NAME_ENUM)
#undef FMHA_NAME_ENUM
    FMHA_NAME_COUNT
} fmha_name;

/*
 * torch entry points for the DLPack fast path of exact torch.Tensor inputs
 * (tensor.c, torch_fast_capsule), resolved the first time such a tensor is seen.
 * torch.Tensor.__dlpack__ and __dlpack_device__ are Python functions costing
 * microseconds each (tens on CUDA, where __dlpack__ also builds stream
 * objects); the fast path performs their checks in C and calls the exporter
 * they end in.  state: 0 not resolved yet, 1 usable, -1 unusable (an entry
 * point is missing: every torch tensor takes the generic DLPack path).
 */
typedef struct fmha_torch_hooks {
    int state;
    PyObject *tensor_type;        /* torch.Tensor */
    PyObject *strided;            /* torch.strided */
    PyObject *to_dlpack;          /* torch._C._to_dlpack_versioned, what __dlpack__ calls */
    PyObject *has_torch_function; /* torch._C._has_torch_function_unary */
    PyObject *current_device;     /* torch.cuda.current_device (NULL: no CUDA fast path) */
    PyObject *current_stream;     /* torch._C._cuda_getCurrentRawStream (NULL: likewise) */
} fmha_torch_hooks;

/* Per-module state (multi-phase init): what both module.c and tensor.c raise,
 * create or look up. */
typedef struct fmha_module_state {
    PyObject *error;            /* fmha_native.FmhaError (RuntimeError) */
    PyTypeObject *tensor_type;  /* fmha_native.Tensor */
    PyObject *names[FMHA_NAME_COUNT]; /* interned FMHA_NAMES */
    PyObject *dlpack_version;   /* (FMHA_DLPACK_MAJOR_VERSION, FMHA_DLPACK_MINOR_VERSION) */
    PyObject *kw_stream_version; /* ("stream", "max_version"): __dlpack__ keyword names */
    PyObject *kw_version;       /* ("max_version",) */
    PyObject *kw_stream;        /* ("stream",) */
    PyObject *kw_dtype;         /* ("dtype",): numpy.empty's keyword */
    fmha_torch_hooks torch;
} fmha_module_state;

/* Fill the names and constant tuples of st (module init); 0 or -1. */
int fmha_state_init(fmha_module_state *st);

/* GC support for what fmha_state_init and the torch hooks hold. */
int fmha_state_traverse(fmha_module_state *st, visitproc visit, void *arg);
void fmha_state_clear(fmha_module_state *st);

/* Raise the exception that status means (FMHA_OK raises nothing and returns
 * 0); what names the operation.  Returns -1 otherwise. */
int fmha_raise_status(const fmha_module_state *st, fmha_status status, const char *what);

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
    fmha_module_state *state;   /* this module's state, or NULL (generic paths only) */
    int torch_device;           /* CUDA ordinal whose current device and stream were
                                   found to match this call; -1 = none checked */
} fmha_open_ctx;

/* A context for one call on stream. */
void fmha_open_ctx_init(fmha_open_ctx *ctx, fmha_module_state *state, void *stream);

typedef struct fmha_tensor {
    const char *name;           /* the argument's name, for messages */
    fmha_elem elem;
    size_t itemsize;
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
    int from_buffer;            /* 1: from the buffer protocol (a NumPy-like host array) */

    /* ---- ownership (released by fmha_tensor_close) ---- */
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
 * View obj: buffer protocol first (NumPy, incl. ml_dtypes bfloat16), else
 * DLPack (exact torch.Tensor through the torch fast path when it applies),
 * else TypeError naming the argument.  ctx->state must be set.  Checks only what the view
 * itself needs: a supported dtype and device, at most FMHA_TENSOR_MAX_NDIM
 * dimensions, strides that are whole elements, and writability under
 * FMHA_OPEN_WRITE.  Returns 0, or -1 with an exception set and t released.
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

/* 1 when the caller's memory is compact row-major. */
int fmha_tensor_is_compact(const fmha_tensor *t);

/* Name of the element type ("float16", "bfloat16", "float32", "int32"). */
const char *fmha_elem_name(fmha_elem elem);

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

/* ---- fmha_native.Tensor: device memory we allocated, exported by DLPack ---- */

extern PyType_Spec fmha_device_tensor_spec;

/*
 * A new uninitialised fmha_native.Tensor of compact shape on GPU device,
 * allocated in stream order on stream.  NULL with an exception on failure.
 */
PyObject *fmha_device_tensor_new(const fmha_module_state *st, int device, void *stream,
                                 int ndim, const int64_t *shape, fmha_elem elem);

/* After a launch on stream wrote t: when t is a fmha_native.Tensor, later
 * consumers on other streams must wait for stream. */
void fmha_tensor_mark_written(fmha_tensor *t, void *stream);

#endif /* FMHA_TENSOR_H */
