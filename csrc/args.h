/*
 * args.h: the arguments of forward/explain and combine, parsed (args.c).
 *
 * Each entry point has one static spec: its argument names in order, how
 * many lead (required, by position or keyword; the rest are keyword-only),
 * and per argument a converter and where its value goes.  The parsed values
 * are plain C (flags, numbers, a device choice, a stream) plus borrowed
 * references to the tensor arguments.
 */
#ifndef FMHA_ARGS_H
#define FMHA_ARGS_H

#include "module.h"

/* device= */
typedef enum fmha_device_choice {
    FMHA_DEVICE_AUTO = 0,       /* None: where the inputs are; host arrays go to a GPU if any */
    FMHA_DEVICE_CPU = 1,
    FMHA_DEVICE_GPU = 2,
} fmha_device_choice;

/* softmax_scale= (None: 1/sqrt(head_dim)) */
typedef struct fmha_opt_scale {
    int given;
    double value;
} fmha_opt_scale;

/* stream= (None: the default stream) */
typedef struct fmha_opt_stream {
    int given;
    void *handle;
} fmha_opt_stream;

/* max_seqlen_q= / max_seqlen_k= (None: not given); their ranges need the
 * tensors' shapes and are checked in validate.c. */
typedef struct fmha_opt_int {
    int given;
    long long value;
} fmha_opt_int;

/* window= (None: unbounded both ways); values >= -1 (checked here), and
 * with causal a right bound of 0 or -1 (validate.c). */
typedef struct fmha_opt_window {
    int given;
    long long left, right;
} fmha_opt_window;

/* kv_dtype= (issue 22): None, k/v's own dtype; "e4m3fn" (or "float8_e4m3fn"): k/v hold
 * float8 e4m3fn codes, as float8_e4m3fn or uint8 arrays. */
typedef enum fmha_kv_choice {
    FMHA_KV_AUTO = 0,
    FMHA_KV_E4M3FN = 1,
} fmha_kv_choice;

/* k_scale= / v_scale= of an fp8 KV cache: None (1.0), a Python number (per tensor:
 * positive and finite in float32, checked here), or an array (validate.c). */
typedef struct fmha_opt_kv_scale {
    int given;                  /* 0: None; 1: a number (value); 2: an array (obj) */
    double value;
    PyObject *obj;              /* borrowed; Py_None unless an array */
} fmha_opt_kv_scale;

/* forward(q, k, v, *, causal, softmax_scale, num_splits, return_lse, out,
 * lse, device, stream, cache_seqlens, k_new, v_new, max_seqlen_k,
 * block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, window, softcap,
 * sinks, out_dtype, kv_dtype, k_scale, v_scale); explain takes the same.
 * Tensor arguments not given are Py_None. */
typedef struct fmha_fwd_args {
    PyObject *q, *k, *v;
    int causal;
    fmha_opt_scale scale;
    int num_splits;             /* 0 = heuristic */
    int return_lse;
    PyObject *out, *lse;
    fmha_device_choice device;
    fmha_opt_stream stream;
    PyObject *cache_seqlens, *k_new, *v_new;
    fmha_opt_int max_seqlen_k;  /* longest key sequence: plan hint for device lengths */
    PyObject *block_table;      /* paged KV cache */
    PyObject *cu_seqlens_q, *cu_seqlens_k; /* packed (varlen) sequences */
    fmha_opt_int max_seqlen_q;  /* longest query sequence of a packed batch */
    fmha_opt_window window;     /* sliding window (left, right) */
    double softcap;             /* >= 0, finite in float32; 0 = off */
    PyObject *sinks;            /* float32 [heads_q] attention-sink logits */
    int out_f32;                /* out_dtype=float32 given (0: None, out like q or out='s) */
    fmha_kv_choice kv_dtype;    /* fp8 KV cache (issue 22) */
    fmha_opt_kv_scale k_scale, v_scale;
} fmha_fwd_args;

/* combine(outs, lses, *, out, lse, stream, sinks) */
typedef struct fmha_combine_args {
    PyObject *outs, *lses;
    PyObject *out, *lse;
    fmha_opt_stream stream;
    PyObject *sinks;            /* float32 [heads], folded in after the merge */
} fmha_combine_args;

/* Parse a METH_FASTCALL | METH_KEYWORDS call of forward (fname "forward" or
 * "explain") / combine, with the rules and messages of
 * PyArg_ParseTupleAndKeywords.  0, or -1 with TypeError/ValueError set. */
int fmha_parse_forward(const fmha_module_state *st, const char *fname, PyObject *const *args,
                       Py_ssize_t nargs, PyObject *kwnames, fmha_fwd_args *a);
int fmha_parse_combine(const fmha_module_state *st, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames, fmha_combine_args *a);

#endif /* FMHA_ARGS_H */
