/*
 * convert.h: element conversions used by the kernels, one spelling for both
 * vendors: load_float(x) widens f16/bf16/f32 to fp32; store_as<T>(x) rounds
 * fp32 to T once, round-to-nearest-even.
 */
#ifndef FMHA_CONVERT_H
#define FMHA_CONVERT_H

#include "hip_compat.h"

namespace fmha {

__device__ __forceinline__ float load_float(float x) { return x; }
__device__ __forceinline__ float load_float(fmha_half x) { return __half2float(x); }
__device__ __forceinline__ float load_float(fmha_bf16 x) { return fmha_bf162float(x); }

template <typename T> __device__ __forceinline__ T store_as(float x);
template <> __device__ __forceinline__ float store_as<float>(float x) { return x; }
template <> __device__ __forceinline__ fmha_half store_as<fmha_half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ fmha_bf16 store_as<fmha_bf16>(float x) { return fmha_float2bf16(x); }

}  // namespace fmha

#endif /* FMHA_CONVERT_H */
