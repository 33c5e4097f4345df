/*
 * fold.h: the rules every merge of partial softmax states follows, shared
 * by the split-K combine (combine.hip) and the producer's merge of the
 * walkers of one split (fwd_mma.h), and the fold of an attention sink into a
 * merged row, which both apply once, after their merge.
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

/*
 * A sink logit joins a finished row's denominator (fmha.h): with lse = log sum_j e^{s_j}
 * (natural units) and `inv` the factor its O takes, lse becomes log(e^lse + e^sink) and
 * inv takes e^(lse_old - lse_new).  A row that saw no key (lse = -inf, O = 0) gets
 * lse = sink; a sink of -inf changes nothing; NaN in either stays NaN.  Epilogue code:
 * the accurate exp and log.
 */
__device__ __forceinline__ void fold_sink(float &lse, float &inv, float sink)
{
    const float top = fmaxf(lse, sink); /* NaN: the exp below makes everything NaN */
    if (top == -INFINITY)
        return;
    const float total = top + logf(expf(lse - top) + expf(sink - top));
    inv *= expf(lse - total);
    lse = total;
}

}  // namespace fmha

#endif /* FMHA_FOLD_H */
