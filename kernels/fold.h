/*
 * fold.h: the two rules every merge of partial softmax states follows, shared
 * by the split-K combine (combine.hip) and the producer's merge of the
 * walkers of one split (fwd_mma.h).
 */
#ifndef FMHA_FOLD_H
#define FMHA_FOLD_H

#include "hip_compat.h"

#include <math.h>

namespace fmha {

/*
 * max that keeps NaN (fmaxf drops it): a NaN partial must poison its row.  One
 * select over values both sides need, so the compiler has no branch to sink the
 * loads of a or b into (the walkers' merge in fwd_mma.h reads all its inputs
 * first and relies on that).
 */
__device__ __forceinline__ float nan_max(float a, float b) { return a != a || b != b ? a + b : fmaxf(a, b); }

/* An empty partial (weight 0) must not multiply whatever it holds. */
__device__ __forceinline__ float weighted(float weight, float x) { return weight == 0.f ? 0.f : weight * x; }

}  // namespace fmha

#endif /* FMHA_FOLD_H */
