/* fwd_sm90_d80.hip: the Hopper prefill kernel's instances for head_dim 80 (fwd_sm90.h),
 * apart so that the head dims compile in parallel; NVIDIA only. */
#include "fwd_sm90.h"
#if !FMHA_DEVICE_IS_AMD
namespace fmha {
namespace sm90 {
FMHA_SM90_INSTANCES(, 80)
}  // namespace sm90
}  // namespace fmha
#endif
