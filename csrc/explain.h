/*
 * explain.h: the only place plans become words.
 *
 * The planner (plan.c) answers in numbers and reason codes; this file turns
 * one planned call into the dict that fmha_native.explain() returns, into
 * the NotImplementedError that forward() raises for a problem no backend
 * here runs, and serves the private hook _plan_for_device that plans for a
 * described GPU (CPU CI tests the GPU planner through it).
 */
#ifndef FMHA_EXPLAIN_H
#define FMHA_EXPLAIN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fmha.h"

/* Where a longest sequence length (max_seqlen_q / max_seqlen_k) came from. */
typedef enum fmha_len_source {
    FMHA_LEN_DENSE = 0,     /* not packed: the tensor's own row count (or a cache's capacity) */
    FMHA_LEN_GIVEN = 1,     /* the caller's max_seqlen_* */
    FMHA_LEN_COMPUTED = 2,  /* read from host cu_seqlens_* */
    FMHA_LEN_TOTAL = 3,     /* device cu_seqlens_* are not read: assumed = the total */
} fmha_len_source;

/* The serving modes of a call (a paged KV cache, packed sequences). */
typedef struct fmha_explain_serving {
    int paged;
    int64_t page_size, num_pages, max_blocks; /* paged: max_blocks per sequence */
    int varlen_q, varlen_k;                   /* cu_seqlens_q / cu_seqlens_k given */
    int64_t total_q, total_k;
    int64_t max_seqlen_q, max_seqlen_k;       /* what the plan and the grid are made for */
    fmha_len_source q_source, k_source;
} fmha_explain_serving;

/* One planned call, as the binding layer saw it. */
/* How k_scale / v_scale of an fp8 KV cache were given (issue 22). */
typedef enum fmha_scale_kind {
    FMHA_SCALE_NONE = 0,        /* not given: 1.0 */
    FMHA_SCALE_TENSOR = 1,      /* a Python number or a 0-d float32 tensor */
    FMHA_SCALE_HEAD = 2,        /* float32 [heads_kv] */
    FMHA_SCALE_BATCH_HEAD = 3,  /* float32 [batch, heads_kv] */
} fmha_scale_kind;

typedef struct fmha_explain_input {
    const fmha_fwd_params *p;       /* problem fields (batch ... seqlen_new, softmax_scale) */
    const fmha_target *target;      /* where the plan is for (CPU threads or the GPU's facts) */
    const fmha_plan *plan;          /* the plan; ignored when `empty` */
    int requested_splits;           /* the caller's num_splits (0 = heuristic) */
    int kv_cache;                   /* cache_seqlens was given */
    int inputs_on_host;             /* GPU plans: q was a host array (copied to the GPU) */
    int device_ordinal;             /* GPU plans */
    const fmha_plan *gpu_rejected;  /* GPU plan the CPU replaced (device=None), or NULL */
    const fmha_target *gpu_rejected_target; /* the target of that plan, or NULL */
    int empty;                      /* batch or seqlen_q is 0: nothing runs, no plan made */
    int length_independent;         /* device cache_seqlens: the plan never read them */
    int64_t planned_keys;           /* ... and was made for this many keys per sequence */
    fmha_explain_serving serving;   /* zero: dense, no pages */
    fmha_scale_kind k_scale_kind, v_scale_kind; /* fp8 KV cache: how the scales were given */
} fmha_explain_input;

/* d[key] = value, dropping the reference to value (the caller's new reference);
 * -1 when value is NULL (its exception stands) or the store fails. */
int fmha_dict_set(PyObject *d, const char *key, PyObject *value);

/* The explain() dict of one planned call; NULL with an exception set on failure. */
PyObject *fmha_explain_dict(const fmha_explain_input *in);

/* Set NotImplementedError for a plan whose gate is not met (always returns NULL,
 * so callers can `return fmha_explain_raise_unsupported(&in);`). */
PyObject *fmha_explain_raise_unsupported(const fmha_explain_input *in);

/*
 * _fmha_native._plan_for_device(problem: dict, device: dict, num_splits=0,
 *                               prefill_kernel="auto") -> dict
 * Plans a problem for a described GPU as if its kernels were compiled in and
 * returns the explain() dict.  Private: for tests of the planner without a GPU.
 * problem: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype
 * ("float16", "bfloat16", "float32"), causal, misaligned (q starts off a
 * 16-byte boundary), and for a KV cache cache_seqlens (list of ints) and
 * seqlen_new; paged (1: a paged cache of 16-key pages, seqlen_k its
 * capacity), varlen (1: packed queries, seqlen_q the longest) and seqlens_k
 * (with varlen: packed key lengths, list of ints); window_left, window_right
 * (-1 = unbounded), softcap (an int, 0 = off) and sinks (1: given); kv_dtype
 * ("float8_e4m3fn": an fp8 KV cache; default: dtype).
 * device: name, arch, cc (major, minor), is_amd, sm_count, warp_size,
 * l2_bytes, max_smem_per_block, max_smem_per_sm, ctas_per_sm
 * ({"prefill"|"decode": [per tile-table row]}), archs_built (the archs the
 * kernels were built for, default this build's: AMD, gcnArchName prefixes;
 * NVIDIA, FMHA_CUDA_ARCHS entries such as "80", "90a").
 * prefill_kernel: what FMHA_GPU_PREFILL_KERNEL would say ("auto", "mma", "sm90").
 */
PyObject *fmha_explain_plan_for_device(PyObject *module, PyObject *args, PyObject *kwargs);

#endif /* FMHA_EXPLAIN_H */
