/*
 * gpu.c: the GPU backend as the host code sees it.
 *
 * Owns the per-device property cache (read once from the runtime, then served
 * from memory), the split-K scratch (stream-ordered allocations, so a call
 * never synchronises the device and works under graph capture) and the
 * public fmha_gpu_* entry points.  The runtime calls and kernels themselves
 * are in the .hip files under kernels/, reached through gpu_runtime.h.  In a CPU-only build
 * this file provides the same entry points reporting no device.
 */
#include "fmha.h"

#include <stddef.h>

#if defined(FMHA_WITH_CUDA) || defined(FMHA_WITH_HIP)

#include "gpu_runtime.h"

#include <pthread.h>
#include <stdlib.h>

/* Device property cache: filled on first use, never changes afterwards. */
static pthread_once_t g_count_once = PTHREAD_ONCE_INIT;
static int g_device_count;
static pthread_mutex_t g_info_lock = PTHREAD_MUTEX_INITIALIZER;
static fmha_device_info *g_info;   /* [g_device_count] */
static unsigned char *g_info_done; /* [g_device_count] */

static void count_devices(void)
{
    g_device_count = fmha_rt_device_count();
    if (g_device_count > 0) {
        g_info = calloc((size_t)g_device_count, sizeof *g_info);
        g_info_done = calloc((size_t)g_device_count, 1);
        if (!g_info || !g_info_done) {
            free(g_info);
            free(g_info_done);
            g_info = NULL;
            g_info_done = NULL;
            g_device_count = 0;
        }
    }
}

int fmha_gpu_compiled(void) { return 1; }

const char *fmha_gpu_platform(void) { return fmha_rt_platform(); }

int fmha_gpu_device_count(void)
{
    pthread_once(&g_count_once, count_devices);
    return g_device_count;
}

fmha_status fmha_gpu_device_info(int ordinal, const fmha_device_info **info)
{
    if (ordinal < 0 || ordinal >= fmha_gpu_device_count())
        return FMHA_ERR_NO_DEVICE;
    fmha_status st = FMHA_OK;
    pthread_mutex_lock(&g_info_lock);
    if (!g_info_done[ordinal]) {
        st = fmha_rt_query_device(ordinal, &g_info[ordinal]);
        g_info_done[ordinal] = st == FMHA_OK;
    }
    pthread_mutex_unlock(&g_info_lock);
    *info = st == FMHA_OK ? &g_info[ordinal] : NULL;
    return st;
}

const char *fmha_gpu_error_string(void) { return fmha_rt_error_string(); }

fmha_status fmha_gpu_fwd(fmha_fwd_params *p)
{
    if (p->num_splits <= 1) {
        p->o_accum = NULL;
        p->lse_accum = NULL;
        return fmha_rt_launch_fwd(p);
    }
    /* Split partials: [num_splits, batch, seqlen_q, heads_q, head_dim] and
     * [num_splits, batch, heads_q, seqlen_q], fp32, freed in stream order. */
    size_t rows = (size_t)p->num_splits * (size_t)p->batch * (size_t)p->seqlen_q *
                  (size_t)p->heads_q;
    size_t o_bytes = rows * (size_t)p->head_dim * sizeof(float);
    size_t lse_bytes = rows * sizeof(float);
    void *scratch = NULL;
    fmha_status st = fmha_rt_malloc(p->device, p->stream, o_bytes + lse_bytes, &scratch);
    if (st != FMHA_OK)
        return st;
    p->o_accum = (float *)scratch;
    p->lse_accum = (float *)((char *)scratch + o_bytes);
    st = fmha_rt_launch_fwd(p);
    fmha_status st_free = fmha_rt_free(p->device, p->stream, scratch);
    p->o_accum = NULL;
    p->lse_accum = NULL;
    return st != FMHA_OK ? st : st_free;
}

fmha_status fmha_gpu_combine(const fmha_combine_params *c) { return fmha_rt_launch_combine(c); }

fmha_status fmha_gpu_malloc(int device, void *stream, size_t bytes, void **ptr)
{
    return fmha_rt_malloc(device, stream, bytes, ptr);
}

fmha_status fmha_gpu_free(int device, void *stream, void *ptr)
{
    return fmha_rt_free(device, stream, ptr);
}

fmha_status fmha_gpu_memcpy(int device, void *stream, void *dst, const void *src, size_t bytes,
                            fmha_copy_kind kind)
{
    return fmha_rt_memcpy(device, stream, dst, src, bytes, kind);
}

fmha_status fmha_gpu_stream_sync(int device, void *stream)
{
    return fmha_rt_stream_sync(device, stream);
}

#else /* CPU-only build: a GPU backend that is absent, not broken */

int fmha_gpu_compiled(void) { return 0; }
const char *fmha_gpu_platform(void) { return "none"; }
int fmha_gpu_device_count(void) { return 0; }
const char *fmha_gpu_error_string(void) { return "fmha_native was built without a GPU backend"; }

fmha_status fmha_gpu_device_info(int ordinal, const fmha_device_info **info)
{
    (void)ordinal;
    *info = NULL;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_fwd(fmha_fwd_params *p)
{
    (void)p;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_combine(const fmha_combine_params *c)
{
    (void)c;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_malloc(int device, void *stream, size_t bytes, void **ptr)
{
    (void)device, (void)stream, (void)bytes;
    *ptr = NULL;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_free(int device, void *stream, void *ptr)
{
    (void)device, (void)stream, (void)ptr;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_memcpy(int device, void *stream, void *dst, const void *src, size_t bytes,
                            fmha_copy_kind kind)
{
    (void)device, (void)stream, (void)dst, (void)src, (void)bytes, (void)kind;
    return FMHA_ERR_NO_DEVICE;
}

fmha_status fmha_gpu_stream_sync(int device, void *stream)
{
    (void)device, (void)stream;
    return FMHA_ERR_NO_DEVICE;
}

#endif
