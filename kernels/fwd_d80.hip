/* fwd_d80.hip: the tensor-core producer for head_dim 80 (see fwd_mma_inst.h);
 * NVIDIA only (fmha_config.h). */
#if !defined(FMHA_WITH_HIP)
#define FMHA_HEAD_DIM 80
#include "fwd_mma_inst.h"
#endif
