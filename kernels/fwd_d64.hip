/* fwd_d64.hip: the tensor-core producer for head_dim 64 (see fwd_mma_inst.h). */
#define FMHA_HEAD_DIM 64
#include "fwd_mma_inst.h"
