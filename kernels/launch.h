/*
 * launch.h: what the kernel translation units share with each other (not with
 * the C host code, which sees gpu_runtime.h): the clamp of packed sequence
 * bounds and an fp8 cache's factors, which the producer, the append and the
 * combine apply alike, the
 * per-head_dim producer launchers instantiated in fwd_d*.hip, the combine
 * launcher, and the error recording of runtime.hip.
 */
#ifndef FMHA_LAUNCH_H
#define FMHA_LAUNCH_H

#include "fmha.h"
#include "fmha_config.h"
#include "hip_compat.h"

namespace fmha {

/*
 * Rows [start, start + len) of sequence b in a packed tensor of `total` rows, from
 * cu_seqlens (device memory, never checked on the host), clamped as fmha.h says:
 * start = clamp(cu[b], 0, total), end = clamp(cu[b+1], start, min(total, start +
 * longest)); `bad` when that is not (cu[b], cu[b+1]) (the sequence's rows come out NaN,
 * nothing is appended for it).  Every kernel that reads cu_seqlens goes through this.
 */
struct packed_span {
    int64_t start, len;
    bool bad;
};
__device__ __forceinline__ packed_span packed_span_of(const int32_t *cu, int64_t b, int64_t total, int64_t longest)
{
    const int64_t lo = cu[b], hi = cu[b + 1];
    const int64_t start = lo < 0 ? 0 : lo > total ? total : lo;
    const int64_t cap = start + longest < total ? start + longest : total;
    const int64_t end = hi < start ? start : hi > cap ? cap : hi;
    return {start, end - start, start != lo || end != hi};
}

/* The dequantization factor of an fp8 cache's kv head h in sequence b (fmha.h), which
 * the producer and the append's quantize-on-write apply alike. */
__device__ __forceinline__ float kv_factor(float scale, const float *scales, int64_t batch_stride,
                                           int64_t head_stride, int64_t b, int64_t h)
{
    return scales ? scale * scales[b * batch_stride + h * head_stride] : scale;
}

/* Record a failed runtime call for fmha_rt_error_string(); returns FMHA_ERR_RUNTIME. */
fmha_status record_error(const char *what, hipError_t err);

/* Make `device` current for the calls that follow. */
fmha_status use_device(int device);

/* Before a launch: FMHA_OK, or FMHA_ERR_UNSUPPORTED when this build has no
 * code object for the device (on AMD: its gcnArchName is not among
 * FMHA_HIP_ARCHS_BUILT), where launching would make the HIP runtime abort. */
#if FMHA_DEVICE_IS_AMD
fmha_status check_code_object(int device);
#else
inline fmha_status check_code_object(int) { return FMHA_OK; } /* the planner gates sm_80+ */
#endif

/* After a launch: FMHA_OK, or the launch error recorded. */
fmha_status check_launch(const char *kernel);

/* One producer launcher per FMHA_GPU_MMA_CONFIGS row, defined in fwd_d<hd>.hip,
 * and the occupancy (resident CTAs per SM) of the tiles of a GPU kernel id. */
#define FMHA_DECLARE_LAUNCHER(hd, bm, bn, w, st, ctas, wk)                      \
    fmha_status launch_fwd_mma_d##hd(const fmha_fwd_params &p);      \
    int occupancy_fwd_mma_d##hd(int kernel);
FMHA_GPU_MMA_CONFIGS(FMHA_DECLARE_LAUNCHER)
#undef FMHA_DECLARE_LAUNCHER

/* combine.hip: merge split partials into out/lse.  after_producer: the
 * partials come from the kernel just enqueued, which calls
 * fmha_trigger_dependents (then the launch may overlap its tail). */
fmha_status launch_combine(const fmha_combine_params &c, bool after_producer);

/* Whether launches on `device` overlap the kernel before them: a device with
 * programmatic dependent launch (NVIDIA sm_90+). */
bool overlap_launches(int device);

/* The device's multiprocessors (compute units on AMD); -1 when the runtime cannot say. */
int multiprocessors(int device);

}  // namespace fmha

#endif /* FMHA_LAUNCH_H */
