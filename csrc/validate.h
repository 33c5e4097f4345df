/*
 * validate.h: the public contract's checks of opened tensors (validate.c).
 */
#ifndef FMHA_VALIDATE_H
#define FMHA_VALIDATE_H

#include "args.h"
#include "tensor.h"

/* The tensors of one forward call; those not given stay closed (present 0). */
typedef struct fmha_fwd_views {
    fmha_tensor q, k, v, out, lse, seqlens, k_new, v_new;
} fmha_fwd_views;

/* What validation learns from a host cache_seqlens.  Device lengths are not
 * read (a decode step stays free of syncs and can be captured in a graph):
 * known stays 0 and the plan is made from the capacity or max_seqlen_k. */
typedef struct fmha_cache_lengths {
    int known;                  /* the lengths were read on the host and may shape the plan */
    int32_t max_seqlen;         /* longest cache_seqlens entry */
    int64_t total_keys;         /* sum of cache_seqlens + appended rows over the batch */
} fmha_cache_lengths;

/*
 * Check forward's tensors against the contract (dtypes first, then shapes,
 * devices, layouts, aliasing of written tensors, max_seqlen_k's range, and
 * the cache_seqlens values of host arrays; device cache_seqlens are read on
 * stream, with a sync, only under FMHA_VALIDATE=1).  append: k_new/v_new are
 * written into k/v.  0, or -1 with TypeError/ValueError naming the argument.
 */
int fmha_validate_forward(const fmha_module_state *st, fmha_fwd_views *t,
                          fmha_device_choice device, int append, void *stream,
                          const fmha_opt_int *max_seqlen_k, fmha_cache_lengths *lengths);

/* The tensors of one combine call. */
typedef struct fmha_combine_views {
    fmha_tensor outs, lses, out, lse;
} fmha_combine_views;

/* Check combine's tensors; 0 or -1 as above. */
int fmha_validate_combine(fmha_combine_views *t);

#endif /* FMHA_VALIDATE_H */
