/*
 * gpu_runtime.h: what the GPU objects (the .hip files under kernels/, built by nvcc or hipcc)
 * export to the C host code.  gpu.c is the only includer: it wraps these in the
 * public fmha_gpu_* API, caches device properties and owns the split scratch.
 * Every function sets the current device itself and reports runtime failures
 * as FMHA_ERR_RUNTIME with the text in fmha_rt_error_string().
 */
#ifndef FMHA_GPU_RUNTIME_H
#define FMHA_GPU_RUNTIME_H

#include "fmha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kernels/runtime.hip */
const char *fmha_rt_platform(void);
int fmha_rt_device_count(void);
fmha_status fmha_rt_query_device(int ordinal, fmha_device_info *info);
fmha_status fmha_rt_malloc(int device, void *stream, size_t bytes, void **ptr);
fmha_status fmha_rt_free(int device, void *stream, void *ptr);
fmha_status fmha_rt_memcpy(int device, void *stream, void *dst, const void *src, size_t bytes,
                           fmha_copy_kind kind);
fmha_status fmha_rt_stream_sync(int device, void *stream);
const char *fmha_rt_error_string(void);

/* kernels/launch.hip: copy a [batch, rows, heads, head_dim] tensor of 16-bit
 * elements between two strided layouts (head_dim stride 1 on both sides). */
typedef struct fmha_rows_view {
    void *data;
    int64_t batch_stride, row_stride, head_stride;
} fmha_rows_view;
fmha_status fmha_rt_copy_rows(int device, void *stream, int64_t batch, int64_t rows,
                              int64_t heads, int64_t head_dim, fmha_rows_view src,
                              fmha_rows_view dst);

/* kernels/launch.hip: producer kernels (+ the combine when p->num_splits > 1,
 * reading p->o_accum / p->lse_accum, which the caller allocated) */
fmha_status fmha_rt_launch_fwd(const fmha_fwd_params *p);
fmha_status fmha_rt_launch_combine(const fmha_combine_params *c);

#ifdef __cplusplus
}
#endif

#endif /* FMHA_GPU_RUNTIME_H */
