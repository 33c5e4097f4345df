/*
 * hip_compat.h: the HIP names fmha_native calls, and nothing more.
 *
 * The kernels and the runtime glue are written in HIP.  Under hipcc this header
 * is just <hip/hip_runtime.h>.  Under nvcc it maps each HIP name we use to its
 * CUDA twin (we do not use the HIP-on-NVIDIA headers: Debian's HIP 5.2 copy
 * does not compile against CUDA 13, whose cudaDeviceProp lost fields).  Add a
 * name here only when the code needs it.
 *
 * It also gives the two 16-bit float types one spelling on both vendors
 * (fmha_half, fmha_bf16) and the warp width as a compile-time constant.
 */
#ifndef FMHA_HIP_COMPAT_H
#define FMHA_HIP_COMPAT_H

#include <stdint.h>

#if defined(__HIPCC__) || defined(FMHA_WITH_HIP)

#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>

typedef __half fmha_half;
#define FMHA_PLATFORM "hip"
#define FMHA_DEVICE_IS_AMD 1

/*
 * bfloat16: HIP 5.7+ has CUDA's __hip_bfloat16 (hip_bf16.h, without the _rn
 * spelling of the conversion, which rounds to nearest even anyway); older HIP
 * (Debian's 5.2) has only hip_bfloat16, whose float constructor rounds to
 * nearest even.  fmha_float2bf16 / fmha_bf162float spell both.
 */
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
typedef __hip_bfloat16 fmha_bf16;
__host__ __device__ inline fmha_bf16 fmha_float2bf16(float x) { return __float2bfloat16(x); }
__host__ __device__ inline float fmha_bf162float(fmha_bf16 x) { return __bfloat162float(x); }
#else
#include <hip/hip_bfloat16.h>
typedef hip_bfloat16 fmha_bf16;
__host__ __device__ inline fmha_bf16 fmha_float2bf16(float x) { return hip_bfloat16(x); }
__host__ __device__ inline float fmha_bf162float(fmha_bf16 x) { return static_cast<float>(x); }
#endif

#else /* NVIDIA: CUDA behind the HIP names */

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef __half fmha_half;
typedef __nv_bfloat16 fmha_bf16;
#define FMHA_PLATFORM "cuda"
#define FMHA_DEVICE_IS_AMD 0

typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaDeviceProp hipDeviceProp_t;
#define hipSuccess cudaSuccess
#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceAttributeComputeCapabilityMajor cudaDevAttrComputeCapabilityMajor
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipDeviceAttribute_t cudaDeviceAttr
typedef cudaMemPool_t hipMemPool_t;
typedef cudaMemPoolProps hipMemPoolProps;
#define hipMemPoolCreate cudaMemPoolCreate
#define hipMemPoolSetAttribute cudaMemPoolSetAttribute
#define hipMemPoolAttrReleaseThreshold cudaMemPoolAttrReleaseThreshold
#define hipMemAllocationTypePinned cudaMemAllocationTypePinned
#define hipMemLocationTypeDevice cudaMemLocationTypeDevice
#define hipMallocFromPoolAsync cudaMallocFromPoolAsync
#define hipFreeAsync cudaFreeAsync
#define hipMemcpyAsync cudaMemcpyAsync
typedef cudaMemcpyKind hipMemcpyKind;
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipStreamSynchronize cudaStreamSynchronize
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize

#define fmha_float2bf16 __float2bfloat16_rn
#define fmha_bf162float __bfloat162float

#endif

/*
 * Programmatic dependent launch (NVIDIA sm_90+).  A kernel launched with
 * fmha_launch(..., overlap = true) may start while the kernel before it in the stream
 * is still running; before it reads what that kernel wrote it calls
 * fmha_wait_prior_grid(), which returns once the prior grid has finished and
 * its writes are visible.  The prior kernel calls fmha_trigger_dependents()
 * when its CTAs are past their main work, so the dependent's CTAs are placed
 * while the last ones drain instead of after.  Elsewhere (AMD, older NVIDIA)
 * these are a plain launch and no-ops.
 */
__device__ __forceinline__ void fmha_wait_prior_grid()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/*
 * A global load served by L2, never by the SM's L1: a dependent kernel that
 * reads lines before fmha_wait_prior_grid() (combine.hip warms its code that
 * way) reads them again after it with this, so no stale L1 copy can answer.
 */
template <typename T> __device__ __forceinline__ T load_l2(const T *p)
{
#if defined(__CUDA_ARCH__)
    return __ldcg(p);
#else
    return *p;
#endif
}
__device__ __forceinline__ void fmha_trigger_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Launch `kernel`, overlapped as above when `overlap`; returns the launch error. */
template <typename... Params, typename... Args>
hipError_t fmha_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, hipStream_t stream,
                       bool overlap, Args... args)
{
#if !(defined(__HIPCC__) || defined(FMHA_WITH_HIP))
    if (overlap) {
        cudaLaunchAttribute attr[1] = {};
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config = {};
        config.gridDim = grid;
        config.blockDim = block;
        config.dynamicSmemBytes = smem;
        config.stream = stream;
        config.attrs = attr;
        config.numAttrs = 1;
        return cudaLaunchKernelEx(&config, kernel, args...);
    }
#else
    (void)overlap;
#endif
    kernel<<<grid, block, smem, stream>>>(args...);
    return hipGetLastError();
}

/*
 * q = a / b and r = a % b for a >= 0, b > 0, in 32 bits whenever both fit (every
 * realistic index): a 64-bit division by a run-time divisor is a software routine
 * several times longer, and the kernels' prologues run a chain of them before
 * their first load.
 */
struct fmha_qr {
    int64_t q, r;
};
__device__ __forceinline__ fmha_qr fmha_divide(int64_t a, int64_t b)
{
    if ((uint64_t)a <= 0xffffffffu && (uint64_t)b <= 0xffffffffu) {
        const uint32_t q = (uint32_t)a / (uint32_t)b;
        return {(int64_t)q, a - (int64_t)q * b};
    }
    return {a / b, a % b};
}

/*
 * float8 e4m3fn conversions in hardware (NVIDIA sm_89+: cvt with e4m3x2), where
 * FMHA_HAS_E4M3_CVT is 1; convert.h has the portable spelling for the rest.
 *   fmha_e4m3x2_to_half2(c)    the two codes in the low and high byte of c as the
 *                              low and high half of an f16x2 (exact; NaN stays NaN)
 *   fmha_floats_to_e4m3x2(lo, hi)  round to nearest even, saturated to +-448, NaN
 *                              kept: lo in the low byte
 */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FMHA_HAS_E4M3_CVT 1
__device__ __forceinline__ uint32_t fmha_e4m3x2_to_half2(uint16_t c)
{
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(c));
    return h;
}
__device__ __forceinline__ uint16_t fmha_floats_to_e4m3x2(float lo, float hi)
{
    uint16_t c;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(c) : "f"(hi), "f"(lo));
    return c;
}
#else
#define FMHA_HAS_E4M3_CVT 0
#endif

/* Lanes per warp (wavefront): 32 on NVIDIA and RDNA, 64 on CDNA. */
#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE)
#define FMHA_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#elif defined(__HIPCC__) || defined(FMHA_WITH_HIP)
#define FMHA_WARP_SIZE 64
#else
#define FMHA_WARP_SIZE 32
#endif

#endif /* FMHA_HIP_COMPAT_H */
