/* fwd_d96.hip: the tensor-core producer for head_dim 96 (see fwd_mma_inst.h);
 * NVIDIA only (fmha_config.h). */
#if !defined(FMHA_WITH_HIP)
#define FMHA_HEAD_DIM 96
#include "fwd_mma_inst.h"
#endif
