/* fwd_d192.hip: the tensor-core producer for head_dim 192 (see fwd_mma_inst.h);
 * NVIDIA only (fmha_config.h). */
#if !defined(FMHA_WITH_HIP)
#define FMHA_HEAD_DIM 192
#include "fwd_mma_inst.h"
#endif
