/*
 * validate.h: the public contract's checks of opened tensors (validate.c).
 */
#ifndef FMHA_VALIDATE_H
#define FMHA_VALIDATE_H

#include "args.h"
#include "explain.h"
#include "tensor.h"

/* The tensors of one forward call; those not given stay closed (present 0). */
typedef struct fmha_fwd_views {
    fmha_tensor q, k, v, out, lse, seqlens, k_new, v_new;
    fmha_tensor block_table, cu_q, cu_k; /* cu_q / cu_k: cu_seqlens_q / cu_seqlens_k */
    fmha_tensor sinks;          /* float32 [heads_q] */
    fmha_tensor k_scale, v_scale; /* fp8 KV cache: float32 [], [heads_kv] or [batch, heads_kv] */
} fmha_fwd_views;

/*
 * The problem's shape as validation found it: which serving modes the call
 * uses and the sizes fmha.h's params are filled from (call.c).
 */
typedef struct fmha_fwd_geometry {
    int varlen_q;               /* cu_seqlens_q given: q/out/lse (and k_new/v_new) packed */
    int varlen_k;               /* cu_seqlens_k given: k/v packed */
    int paged;                  /* block_table given: k/v are pages */
    int64_t batch, heads_q, heads_kv, head_dim;
    int64_t seqlen_q;           /* dense: q.shape[1]; packed: max_seqlen_q */
    int64_t seqlen_k;           /* dense k/v: k.shape[1]; paged: the capacity; packed: max_seqlen_k */
    int64_t seqlen_new;         /* rows appended to the longest sequence (0 = no append) */
    int64_t total_q, total_k;   /* packed row counts (0 when not packed) */
    int64_t page_size, num_pages, max_blocks; /* paged */
    fmha_len_source q_source, k_source;
    int kv_fp8;                 /* k/v hold float8 e4m3fn codes (issue 22) */
} fmha_fwd_geometry;

/* What validation learns from host metadata.  Device metadata is not read
 * (a decode step stays free of syncs and can be captured in a graph): known
 * stays 0 and the plan is made from the capacity, the totals or
 * max_seqlen_q / max_seqlen_k. */
typedef struct fmha_cache_lengths {
    int known;                  /* every len_k(b) was read on the host and may shape the plan */
    int64_t max_keys;           /* longest len_k(b), appended rows included */
    int64_t total_keys;         /* sum of len_k(b) over the batch */
} fmha_cache_lengths;

/*
 * Check forward's tensors against the contract (dtypes first, then the
 * combinations of serving arguments, shapes, devices, layouts, aliasing of
 * written tensors, the ranges of max_seqlen_q / max_seqlen_k, and the values
 * of host metadata: cu_seqlens_q, cu_seqlens_k, cache_seqlens, block_table;
 * device metadata is read on stream, with one sync, only under
 * FMHA_VALIDATE=1).  append: k_new/v_new are written into k/v.  Fills
 * geometry and lengths.  0, or -1 with TypeError/ValueError naming the
 * argument.
 */
int fmha_validate_forward(const fmha_module_state *st, fmha_fwd_views *t,
                          const fmha_fwd_args *a, int append, void *stream,
                          fmha_fwd_geometry *geometry, fmha_cache_lengths *lengths);

/* The tensors of one combine call. */
typedef struct fmha_combine_views {
    fmha_tensor outs, lses, out, lse;
    fmha_tensor sinks;          /* float32 [heads] */
} fmha_combine_views;

/* Check combine's tensors; 0 or -1 as above. */
int fmha_validate_combine(fmha_combine_views *t);

#endif /* FMHA_VALIDATE_H */
