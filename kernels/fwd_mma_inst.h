/*
 * fwd_mma_inst.h: instantiates the tensor-core producer for one head_dim
 * (FMHA_HEAD_DIM, set by the including fwd_d<hd>.hip) over dtype x mask kind
 * (none, causal, window with the other model features) x split x paged K/V x
 * K/V element (the dtype, or an fp8 e4m3fn cache), and defines launch_fwd_mma_d<hd>.  One translation unit per head_dim
 * keeps the parallel build fast.
 */
#include "fwd_mma.h"
#include "launch.h"

#include <atomic>
#include <stdint.h>
#include <type_traits>

#ifndef FMHA_HEAD_DIM
#error "define FMHA_HEAD_DIM before including fwd_mma_inst.h"
#endif

#define FMHA_CAT_(a, b) a##b
#define FMHA_CAT(a, b) FMHA_CAT_(a, b)

namespace fmha {
namespace {

/* The rows of the two config tables for this head_dim (exactly one each). */
#define FMHA_PICK(hd, bm, bn, w, st, ctas, wk) \
    typename std::conditional<hd == FMHA_HEAD_DIM, tile_config<hd, bm, bn, w, st, ctas, wk>,
#define FMHA_CLOSE(hd, bm, bn, w, st, ctas, wk) >::type
using prefill_config = FMHA_GPU_MMA_CONFIGS(FMHA_PICK) void FMHA_GPU_MMA_CONFIGS(FMHA_CLOSE);
using decode_config = FMHA_GPU_DECODE_CONFIGS(FMHA_PICK) void FMHA_GPU_DECODE_CONFIGS(FMHA_CLOSE);
using decode_fp8_config = FMHA_GPU_DECODE_FP8_CONFIGS(FMHA_PICK) void FMHA_GPU_DECODE_FP8_CONFIGS(FMHA_CLOSE);
#undef FMHA_PICK
#undef FMHA_CLOSE
static_assert(!std::is_void<prefill_config>::value && !std::is_void<decode_config>::value &&
                  !std::is_void<decode_fp8_config>::value,
              "every head_dim has a prefill, a decode and an fp8 decode row in fmha_config.h");

/* Allow the kernel its dynamic shared memory (above the 48 KB default). */
template <typename Kernel> hipError_t allow_smem(Kernel kernel, int smem)
{
    return hipFuncSetAttribute(reinterpret_cast<const void *>(kernel),
                               hipFuncAttributeMaxDynamicSharedMemorySize, smem);
}

template <typename cfg> int occupancy()
{
    constexpr int smem = fwd_mma_smem_bytes<cfg>();
    auto kernel = fwd_mma_kernel<fmha_bf16, cfg, MASK_NONE, true, false, false>;
    int ctas = 0;
    if (allow_smem(kernel, smem) != hipSuccess ||
        hipOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, cfg::warps * WARP_LANES, smem) != hipSuccess) {
        (void)hipGetLastError();
        return 0;
    }
    return ctas;
}

template <typename T, typename cfg, int MASK, bool SPLIT, bool PAGED, bool KV8>
fmha_status launch_variant(const fmha_fwd_params &p)
{
    constexpr int smem = fwd_mma_smem_bytes<cfg, KV8>();
    auto kernel = fwd_mma_kernel<T, cfg, MASK, SPLIT, PAGED, KV8>;
    /* The attribute is per device: set it once for each (a bit per ordinal). */
    static std::atomic<uint64_t> smem_allowed{0};
    const uint64_t bit = p.device < 64 ? 1ull << p.device : 0;
    if (!bit || !(smem_allowed.load(std::memory_order_acquire) & bit)) {
        hipError_t err = allow_smem(kernel, smem);
        if (err != hipSuccess)
            return record_error("hipFuncSetAttribute(max dynamic shared memory)", err);
        smem_allowed.fetch_or(bit, std::memory_order_release);
    }
    /* Packed sequences: seqlen_q is the longest one; tiles past a shorter one's rows idle. */
    int64_t rows = p.pack_gqa ? p.seqlen_q * (p.heads_q / p.heads_kv) : p.seqlen_q;
    int64_t slots = p.pack_gqa ? p.heads_kv : p.heads_q;
    /* One walker per piece (tile, split, part of O), or walkers_per_split walkers sharing
     * one; a plan of device-sized chunks launches only the pieces the lengths can need
     * (fmha.h). */
    const int64_t per_tile = p.device_pieces > 0 ? fmha_device_grid_pieces(p.device_pieces, p.batch, p.num_splits)
                                                 : p.num_splits * p.batch;
    int64_t pieces = (rows + cfg::block_m - 1) / cfg::block_m * slots * per_tile * cfg::o_parts;
    int64_t ctas = (pieces * p.walkers_per_split + cfg::walkers - 1) / cfg::walkers;
    if (ctas > INT32_MAX) {
        record_error("fwd_mma grid too large (split the batch)", hipSuccess);
        return FMHA_ERR_UNSUPPORTED;
    }
    /* Overlapped with the kernel before it where possible (the producer waits for it before
     * touching memory). */
    const hipError_t err = fmha_launch(kernel, dim3((unsigned)ctas), dim3(cfg::warps * WARP_LANES), smem,
                                       (hipStream_t)p.stream, overlap_launches(p.device), p,
                                       kv_l2_policy(p.kv_read_once));
    return err == hipSuccess ? FMHA_OK : record_error("fwd_mma_kernel", err);
}

/* The plan's partials: fp32 partials for the combine (splits, or an out_dtype of its own). */
template <typename T, typename cfg, int MASK, bool PAGED, bool KV8>
fmha_status launch_split(const fmha_fwd_params &p)
{
    return p.partials ? launch_variant<T, cfg, MASK, true, PAGED, KV8>(p)
                      : launch_variant<T, cfg, MASK, false, PAGED, KV8>(p);
}

/* Any model feature (a window, a softcap, sinks) takes the window kind (fwd_mma.h mask_kind). */
template <typename T, typename cfg, bool PAGED, bool KV8> fmha_status launch_mask(const fmha_fwd_params &p)
{
    if (fmha_features(&p))
        return launch_split<T, cfg, MASK_WINDOW, PAGED, KV8>(p);
    return p.causal ? launch_split<T, cfg, MASK_CAUSAL, PAGED, KV8>(p)
                    : launch_split<T, cfg, MASK_NONE, PAGED, KV8>(p);
}

/* KV8: an fp8 e4m3fn cache (fmha.h kv_dtype), whose instances widen it (fwd_mma.h kv_ring). */
template <typename T, typename cfg, bool KV8> fmha_status launch_tiles(const fmha_fwd_params &p)
{
    if (p.block_m != cfg::block_m || p.block_n != cfg::block_n || p.walkers_per_split < 1 ||
        cfg::walkers % p.walkers_per_split != 0)
        return FMHA_ERR_INVALID; /* the plan and the compiled tiles disagree */
    /* fmha.h: pages hold a multiple of 16 keys (the paged loader reads the table per
     * 16-row group); the host glue refuses other sizes. */
    if (p.block_table && (p.page_size < 16 || p.page_size % 16 != 0))
        return FMHA_ERR_INVALID;
    /* The paged loader keeps page rows in 32 bits (fwd_mma.h paged_rows). */
    if (p.block_table && p.page_size > (int64_t)1 << 30) {
        record_error("fwd_mma: pages of more than 2^30 keys", hipSuccess);
        return FMHA_ERR_UNSUPPORTED;
    }
    return p.block_table ? launch_mask<T, cfg, true, KV8>(p) : launch_mask<T, cfg, false, KV8>(p);
}

template <typename T> fmha_status launch_dtype(const fmha_fwd_params &p)
{
    const bool fp8 = p.kv_dtype == FMHA_DTYPE_E4M3;
    switch (p.kernel) {
    case FMHA_KERNEL_GPU_DECODE:
        return fp8 ? launch_tiles<T, decode_fp8_config, true>(p) : launch_tiles<T, decode_config, false>(p);
    default:
        return fp8 ? launch_tiles<T, prefill_config, true>(p) : launch_tiles<T, prefill_config, false>(p);
    }
}

}  // namespace

int FMHA_CAT(occupancy_fwd_mma_d, FMHA_HEAD_DIM)(int kernel)
{
    switch (kernel) {
    case FMHA_KERNEL_GPU_DECODE: return occupancy<decode_config>();
    default: return occupancy<prefill_config>();
    }
}

fmha_status FMHA_CAT(launch_fwd_mma_d, FMHA_HEAD_DIM)(const fmha_fwd_params &p)
{
    switch (p.dtype) {
    case FMHA_DTYPE_F16: return launch_dtype<fmha_half>(p);
    case FMHA_DTYPE_BF16: return launch_dtype<fmha_bf16>(p);
    default: return FMHA_ERR_UNSUPPORTED;
    }
}

}  // namespace fmha
