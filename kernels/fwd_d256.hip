/* fwd_d256.hip: the tensor-core producer for head_dim 256 (see fwd_mma_inst.h), O in two
 * column parts (fmha_config.h FMHA_GPU_O_PARTS); NVIDIA only. */
#if !defined(FMHA_WITH_HIP)
#define FMHA_HEAD_DIM 256
#include "fwd_mma_inst.h"
#endif
