/* fwd_d128.hip: the tensor-core producer for head_dim 128 (see fwd_mma_inst.h). */
#define FMHA_HEAD_DIM 128
#include "fwd_mma_inst.h"
