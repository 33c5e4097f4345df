/*
 * fwd_mma_inst.h: instantiates the tensor-core producer for one head_dim
 * (FMHA_HEAD_DIM, set by the including fwd_d<hd>.hip) over dtype x causal x
 * split, and defines launch_fwd_mma_d<hd>.  One translation unit per head_dim
 * keeps the parallel build fast.
 */
#include "fwd_mma.h"
#include "launch.h"

#ifndef FMHA_HEAD_DIM
#error "define FMHA_HEAD_DIM before including fwd_mma_inst.h"
#endif

#define FMHA_CAT_(a, b) a##b
#define FMHA_CAT(a, b) FMHA_CAT_(a, b)

namespace fmha {
namespace {

template <typename T, bool CAUSAL, bool SPLIT> fmha_status launch_variant(const fmha_fwd_params &p)
{
    using cfg = mma_config<FMHA_HEAD_DIM>;
    constexpr int smem = fwd_mma_smem_bytes<FMHA_HEAD_DIM>();
    auto kernel = fwd_mma_kernel<T, FMHA_HEAD_DIM, CAUSAL, SPLIT>;
    hipError_t err = hipFuncSetAttribute(reinterpret_cast<const void *>(kernel),
                                         hipFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != hipSuccess)
        return record_error("hipFuncSetAttribute(max dynamic shared memory)", err);
    int64_t rows = p.pack_gqa ? p.seqlen_q * (p.heads_q / p.heads_kv) : p.seqlen_q;
    int64_t slots = p.pack_gqa ? p.heads_kv : p.heads_q;
    int64_t ctas = (rows + cfg::block_m - 1) / cfg::block_m * slots * p.num_splits * p.batch;
    if (ctas > INT32_MAX) {
        record_error("fwd_mma grid too large (split the batch)", hipSuccess);
        return FMHA_ERR_UNSUPPORTED;
    }
    kernel<<<dim3((unsigned)ctas), dim3(cfg::warps * 32), smem, (hipStream_t)p.stream>>>(p);
    return check_launch("fwd_mma_kernel");
}

template <typename T> fmha_status launch_dtype(const fmha_fwd_params &p)
{
    bool split = p.num_splits > 1;
    if (p.causal)
        return split ? launch_variant<T, true, true>(p) : launch_variant<T, true, false>(p);
    return split ? launch_variant<T, false, true>(p) : launch_variant<T, false, false>(p);
}

}  // namespace

fmha_status FMHA_CAT(launch_fwd_mma_d, FMHA_HEAD_DIM)(const fmha_fwd_params &p)
{
    if (p.block_m != mma_config<FMHA_HEAD_DIM>::block_m ||
        p.block_n != mma_config<FMHA_HEAD_DIM>::block_n)
        return FMHA_ERR_INVALID; /* the plan and the compiled tiles disagree */
    switch (p.dtype) {
    case FMHA_DTYPE_F16: return launch_dtype<fmha_half>(p);
    case FMHA_DTYPE_BF16: return launch_dtype<fmha_bf16>(p);
    default: return FMHA_ERR_UNSUPPORTED;
    }
}

}  // namespace fmha
