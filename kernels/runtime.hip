/*
 * runtime.hip: the GPU runtime calls of fmha_native (device count and
 * properties, stream-ordered memory, copies, errors), in HIP names that
 * hip_compat.h maps to CUDA on NVIDIA.  Kernels live in the other .hip files.
 */
#include "gpu_runtime.h"
#include "hip_compat.h"
#include "launch.h"

#include <atomic>
#include <mutex>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

namespace {
thread_local char g_error[256];

/*
 * One stream-ordered memory pool per device for split scratch and staging.
 * The default pool returns its memory at every synchronisation (release
 * threshold 0), so each call would map the scratch again; ours keeps it.
 */
constexpr int MAX_DEVICES = 64;
std::mutex g_pool_lock;
hipMemPool_t g_pools[MAX_DEVICES];
}  // namespace

namespace fmha {

fmha_status record_error(const char *what, hipError_t err)
{
    if (err == hipSuccess)
        snprintf(g_error, sizeof g_error, "%s", what);
    else
        snprintf(g_error, sizeof g_error, "%s: %s", what, hipGetErrorString(err));
    return FMHA_ERR_RUNTIME;
}

fmha_status check_launch(const char *kernel)
{
    hipError_t err = hipGetLastError();
    return err == hipSuccess ? FMHA_OK : record_error(kernel, err);
}

fmha_status use_device(int device)
{
    int current = -1;
    hipError_t err = hipGetDevice(&current);
    if (err != hipSuccess)
        return record_error("hipGetDevice", err);
    if (current != device) {
        err = hipSetDevice(device);
        if (err != hipSuccess)
            return record_error("hipSetDevice", err);
    }
    return FMHA_OK;
}

namespace {
/* A device attribute, asked once per device (0 in the cache: not asked yet; an
 * attribute the runtime cannot give reads as -1). */
int cached_attribute(std::atomic<int> (&cache)[MAX_DEVICES], int device, hipDeviceAttribute_t attr)
{
    if (device < 0 || device >= MAX_DEVICES)
        return -1;
    int v = cache[device].load(std::memory_order_relaxed);
    if (v == 0) {
        if (hipDeviceGetAttribute(&v, attr, device) != hipSuccess || v <= 0) {
            (void)hipGetLastError();
            v = -1;
        }
        cache[device].store(v, std::memory_order_relaxed);
    }
    return v;
}
}  // namespace

#if FMHA_DEVICE_IS_AMD
bool overlap_launches(int) { return false; }
#else
bool overlap_launches(int device)
{
    static std::atomic<int> major[MAX_DEVICES];
    return cached_attribute(major, device, hipDeviceAttributeComputeCapabilityMajor) >= 9;
}
#endif

int multiprocessors(int device)
{
    static std::atomic<int> count[MAX_DEVICES];
    return cached_attribute(count, device, hipDeviceAttributeMultiprocessorCount);
}

#if FMHA_DEVICE_IS_AMD
#ifndef FMHA_HIP_ARCHS_BUILT
#error "the build passes FMHA_HIP_ARCHS_BUILT, the ';' list of --offload-arch targets"
#endif

fmha_status check_code_object(int device)
{
    /* Per device: 0 not checked yet, 1 built, -1 not built (properties never change). */
    static std::atomic<signed char> known[MAX_DEVICES];
    if (device < 0 || device >= MAX_DEVICES)
        return record_error("device ordinal out of range", hipSuccess);
    signed char k = known[device].load(std::memory_order_relaxed);
    hipDeviceProp_t prop;
    if (k == 0) {
        hipError_t err = hipGetDeviceProperties(&prop, device);
        if (err != hipSuccess)
            return record_error("hipGetDeviceProperties", err);
        k = fmha_hip_arch_built(prop.gcnArchName) ? 1 : -1;
        known[device].store(k, std::memory_order_relaxed);
    }
    if (k > 0)
        return FMHA_OK;
    snprintf(g_error, sizeof g_error, "no code object for this device's arch in this build "
             "(built: %s)", FMHA_HIP_ARCHS_BUILT);
    return FMHA_ERR_UNSUPPORTED;
}
#endif

}  // namespace fmha

using fmha::use_device;

static fmha_status fail(const char *what, hipError_t err) { return fmha::record_error(what, err); }

extern "C" {

const char *fmha_rt_platform(void) { return FMHA_PLATFORM; }

const char *fmha_rt_error_string(void) { return g_error; }

int fmha_rt_device_count(void)
{
    int n = 0;
    if (hipGetDeviceCount(&n) != hipSuccess) {
        (void)hipGetLastError(); /* no driver / no device is not an error for the caller */
        return 0;
    }
    return n;
}

fmha_status fmha_rt_query_device(int ordinal, fmha_device_info *info)
{
    hipDeviceProp_t prop;
    hipError_t err = hipGetDeviceProperties(&prop, ordinal);
    if (err != hipSuccess)
        return fail("hipGetDeviceProperties", err);
    memset(info, 0, sizeof *info);
    info->ordinal = ordinal;
    info->is_amd = FMHA_DEVICE_IS_AMD;
    info->sm_count = prop.multiProcessorCount;
    info->warp_size = prop.warpSize;
    info->l2_bytes = prop.l2CacheSize;
    snprintf(info->name, sizeof info->name, "%s", prop.name);
#if FMHA_DEVICE_IS_AMD
    /* HIP 5.x names; a workgroup's LDS limit is also its opt-in limit. */
    info->max_smem_per_block = (int)prop.sharedMemPerBlock;
    info->max_smem_per_sm = (int)prop.maxSharedMemoryPerMultiProcessor;
    snprintf(info->arch, sizeof info->arch, "%s", prop.gcnArchName);
    /* Without a code object for this arch the occupancy queries below would
     * make the HIP runtime abort; the planner refuses the device instead. */
    if (!fmha_hip_arch_built(prop.gcnArchName))
        return FMHA_OK;
#else
    info->max_smem_per_block = (int)prop.sharedMemPerBlockOptin;
    info->max_smem_per_sm = (int)prop.sharedMemPerMultiprocessor;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    snprintf(info->arch, sizeof info->arch, "sm_%d%d", prop.major, prop.minor);
#endif
    fmha_status st = use_device(ordinal);
    if (st != FMHA_OK)
        return st;
    int row = 0;
#define FMHA_OCCUPANCY(hd, bm, bn, w, s, ctas, str)                                        \
    for (int kernel = 1; row < FMHA_GPU_MAX_CONFIGS && kernel <= FMHA_GPU_KERNELS; kernel++) \
        info->ctas_per_sm[kernel - 1][row] = fmha::occupancy_fwd_mma_d##hd(kernel);          \
    row++;
    FMHA_GPU_MMA_CONFIGS(FMHA_OCCUPANCY)
#undef FMHA_OCCUPANCY
    return FMHA_OK;
}

static fmha_status device_pool(int device, hipMemPool_t *pool)
{
    if (device < 0 || device >= MAX_DEVICES)
        return fmha::record_error("device ordinal out of range for the memory pool", hipSuccess);
    std::lock_guard<std::mutex> guard(g_pool_lock);
    if (!g_pools[device]) {
        hipMemPoolProps props = {};
        props.allocType = hipMemAllocationTypePinned;
        props.location.type = hipMemLocationTypeDevice;
        props.location.id = device;
        hipError_t err = hipMemPoolCreate(&g_pools[device], &props);
        if (err != hipSuccess)
            return fail("hipMemPoolCreate", err);
        uint64_t keep = UINT64_MAX;
        err = hipMemPoolSetAttribute(g_pools[device], hipMemPoolAttrReleaseThreshold, &keep);
        if (err != hipSuccess)
            return fail("hipMemPoolSetAttribute(release threshold)", err);
    }
    *pool = g_pools[device];
    return FMHA_OK;
}

fmha_status fmha_rt_malloc(int device, void *stream, size_t bytes, void **ptr)
{
    fmha_status st = use_device(device);
    hipMemPool_t pool = nullptr;
    if (st == FMHA_OK)
        st = device_pool(device, &pool);
    if (st != FMHA_OK)
        return st;
    hipError_t err = hipMallocFromPoolAsync(ptr, bytes, pool, (hipStream_t)stream);
    if (err != hipSuccess) {
        (void)hipGetLastError();
        snprintf(g_error, sizeof g_error, "hipMallocFromPoolAsync(%zu bytes): %s", bytes,
                 hipGetErrorString(err));
        return FMHA_ERR_NOMEM;
    }
    return FMHA_OK;
}

fmha_status fmha_rt_free(int device, void *stream, void *ptr)
{
    fmha_status st = use_device(device);
    if (st != FMHA_OK)
        return st;
    hipError_t err = hipFreeAsync(ptr, (hipStream_t)stream);
    return err == hipSuccess ? FMHA_OK : fail("hipFreeAsync", err);
}

fmha_status fmha_rt_memcpy(int device, void *stream, void *dst, const void *src, size_t bytes,
                           fmha_copy_kind kind)
{
    fmha_status st = use_device(device);
    if (st != FMHA_OK)
        return st;
    hipMemcpyKind k = kind == FMHA_COPY_H2D   ? hipMemcpyHostToDevice
                      : kind == FMHA_COPY_D2H ? hipMemcpyDeviceToHost
                                              : hipMemcpyDeviceToDevice;
    hipError_t err = hipMemcpyAsync(dst, src, bytes, k, (hipStream_t)stream);
    return err == hipSuccess ? FMHA_OK : fail("hipMemcpyAsync", err);
}

fmha_status fmha_rt_stream_sync(int device, void *stream)
{
    fmha_status st = use_device(device);
    if (st != FMHA_OK)
        return st;
    hipError_t err = hipStreamSynchronize((hipStream_t)stream);
    return err == hipSuccess ? FMHA_OK : fail("hipStreamSynchronize", err);
}

}  // extern "C"
