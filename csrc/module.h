/*
 * module.h: what every binding file reads from the module (module.c).
 *
 * Owns the per-module state of the extension (multi-phase init): the
 * FmhaError class, the fmha_native.Tensor type, the interned names the hot
 * paths look up on every call, the constant keyword tuples of the calls we
 * make into producers, and the torch entry points of the fast path (torch.c).
 * Also owns the one mapping of an fmha_status to a Python exception.
 */
#ifndef FMHA_MODULE_H
#define FMHA_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fmha.h"

/*
 * Python names looked up on every call, interned once at module init so that
 * a lookup is a pointer-keyed dict probe rather than a new string, a hash and
 * an intern-table probe.  X(id, "text").
 */
#define FMHA_NAMES(X)                                                                  \
    /* DLPack consumer (dlpack_in.c) */                                                \
    X(DLPACK, "__dlpack__")                                                            \
    X(DLPACK_DEVICE, "__dlpack_device__")                                              \
    X(STREAM, "stream")                                                                \
    X(MAX_VERSION, "max_version")                                                      \
    /* torch fast path (torch.c) */                                                    \
    X(TORCH, "torch")                                                                  \
    X(REQUIRES_GRAD, "requires_grad")                                                  \
    X(IS_CONJ, "is_conj")                                                              \
    X(LAYOUT, "layout")                                                                \
    X(IS_CPU, "is_cpu")                                                                \
    X(IS_CUDA, "is_cuda")                                                              \
    X(GET_DEVICE, "get_device")                                                        \
    /* argument names of forward/explain/combine (args.c) */                           \
    X(Q, "q")                                                                          \
    X(K, "k")                                                                          \
    X(V, "v")                                                                          \
    X(CAUSAL, "causal")                                                                \
    X(SOFTMAX_SCALE, "softmax_scale")                                                  \
    X(NUM_SPLITS, "num_splits")                                                        \
    X(RETURN_LSE, "return_lse")                                                        \
    X(OUT, "out")                                                                      \
    X(LSE, "lse")                                                                      \
    X(DEVICE, "device")                                                                \
    X(CACHE_SEQLENS, "cache_seqlens")                                                  \
    X(K_NEW, "k_new")                                                                  \
    X(V_NEW, "v_new")                                                                  \
    X(MAX_SEQLEN_K, "max_seqlen_k")                                                    \
    X(BLOCK_TABLE, "block_table")                                                      \
    X(CU_SEQLENS_Q, "cu_seqlens_q")                                                    \
    X(CU_SEQLENS_K, "cu_seqlens_k")                                                    \
    X(MAX_SEQLEN_Q, "max_seqlen_q")                                                    \
    X(WINDOW, "window")                                                                \
    X(SOFTCAP, "softcap")                                                              \
    X(SINKS, "sinks")                                                                  \
    X(OUT_DTYPE, "out_dtype")                                                          \
    X(KV_DTYPE, "kv_dtype")                                                            \
    X(K_SCALE, "k_scale")                                                              \
    X(V_SCALE, "v_scale")                                                              \
    X(OUTS, "outs")                                                                    \
    X(LSES, "lses")

typedef enum fmha_name {
#define FMHA_NAME_ENUM(id, text) FMHA_NAME_##id,
    FMHA_NAMES(FMHA_NAME_ENUM)
#undef FMHA_NAME_ENUM
    FMHA_NAME_COUNT
} fmha_name;

/*
 * torch entry points for the DLPack fast path of exact torch.Tensor inputs
 * (torch.c), resolved the first time such a tensor is seen.
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

/* Per-module state: what the binding files raise, create or look up. */
typedef struct fmha_module_state {
    PyObject *error;            /* fmha_native.FmhaError (RuntimeError) */
    PyTypeObject *tensor_type;  /* fmha_native.Tensor (dlpack_out.c) */
    PyObject *names[FMHA_NAME_COUNT]; /* interned FMHA_NAMES */
    PyObject *dlpack_version;   /* (FMHA_DLPACK_MAJOR_VERSION, FMHA_DLPACK_MINOR_VERSION) */
    PyObject *kw_stream_version; /* ("stream", "max_version"): __dlpack__ keyword names */
    PyObject *kw_version;       /* ("max_version",) */
    PyObject *kw_stream;        /* ("stream",) */
    fmha_torch_hooks torch;
} fmha_module_state;

/* Raise the exception that status means (FMHA_OK raises nothing and returns
 * 0); what names the operation.  Returns -1 otherwise. */
int fmha_raise_status(const fmha_module_state *st, fmha_status status, const char *what);

#endif /* FMHA_MODULE_H */
