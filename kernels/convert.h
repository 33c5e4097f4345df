/*
 * convert.h: element conversions used by the kernels, one spelling for both
 * vendors: load_float(x) widens f16/bf16/f32 to fp32; store_as<T>(x) rounds
 * fp32 to T once, round-to-nearest-even; and the float8 e4m3fn codes of an fp8
 * KV cache (fmha.h) to and from fp32 and the 16-bit types.
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

/*
 * float8 e4m3fn: a code is s eeee mmm with exponent bias 7, no infinities, 0x7f and
 * 0xff NaN, 448 the largest finite value, and e = 0 the subnormals m * 2^-9.
 * Every code is exact in fp16, bf16 and fp32.  Where the hardware converts
 * (FMHA_HAS_E4M3_CVT, hip_compat.h) it does; else the bit fields below.
 */
constexpr uint32_t E4M3_SIGN = 0x80u, E4M3_NAN = 0x7fu, E4M3_MAX_CODE = 0x7eu;
constexpr uint32_t E4M3_SHIFT = 20;                 /* fp32 mantissa bits below e4m3's three */
constexpr uint32_t E4M3_REBIAS = (127u - 7u) << 3;  /* fp32 minus e4m3 exponent bias, above m */
constexpr uint32_t F32_ABS = 0x7fffffffu, F32_INF = 0x7f800000u;
constexpr uint32_t E4M3_MAX_BITS = 0x43e00000u;        /* 448 */
constexpr uint32_t E4M3_MIN_NORMAL_BITS = 0x3c800000u; /* 2^-6 */

/* The value of one code (the low byte of `code`). */
__device__ __forceinline__ float e4m3_to_float(uint32_t code)
{
    const uint32_t mag = code & 0x7fu;
    uint32_t bits = mag < 8u ? __float_as_uint((float)mag * 0x1p-9f) : (mag << E4M3_SHIFT) + (E4M3_REBIAS << E4M3_SHIFT);
    if (mag == E4M3_NAN)
        bits = 0x7fc00000u;
    return __uint_as_float(bits | (code & E4M3_SIGN) << 24);
}

/* fp32 to a code: round to nearest even, |x| >= 448 (infinities too) saturated to +-448,
 * NaN to NaN: the rule of the CPU backend's quantize-on-write (cpu_fwd.c f32_to_e4m3). */
__device__ __forceinline__ uint32_t float_to_e4m3(float f)
{
    const uint32_t x = __float_as_uint(f), sign = (x >> 24) & E4M3_SIGN, ax = x & F32_ABS;
    if (ax > F32_INF)
        return sign | E4M3_NAN;
    if (ax >= E4M3_MAX_BITS)
        return sign | E4M3_MAX_CODE;
    if (ax < E4M3_MIN_NORMAL_BITS) /* multiples of 2^-9: the scaled magnitude (exact, < 8) rounded */
        return sign | (uint32_t)rintf(__uint_as_float(ax) * 512.f);
    const uint32_t odd = (ax >> E4M3_SHIFT) & 1u;
    return sign | (((ax + ((1u << (E4M3_SHIFT - 1)) - 1u) + odd) >> E4M3_SHIFT) - E4M3_REBIAS);
}

/* Four codes (bytes of `codes`, the first lowest) as four T, packed two per word in the
 * same order: what a row of T holds where the row of codes held them. */
template <typename T> __device__ __forceinline__ uint2 widen_e4m3x4(uint32_t codes);
template <> __device__ __forceinline__ uint2 widen_e4m3x4<fmha_half>(uint32_t codes)
{
#if FMHA_HAS_E4M3_CVT
    return make_uint2(fmha_e4m3x2_to_half2((uint16_t)codes), fmha_e4m3x2_to_half2((uint16_t)(codes >> 16)));
#else
    uint32_t w[2];
    for (int i = 0; i < 2; i++) {
        const __half2 h = __floats2half2_rn(e4m3_to_float(codes >> (16 * i)), e4m3_to_float(codes >> (16 * i + 8)));
        w[i] = *reinterpret_cast<const uint32_t *>(&h);
    }
    return make_uint2(w[0], w[1]);
#endif
}
template <> __device__ __forceinline__ uint2 widen_e4m3x4<fmha_bf16>(uint32_t codes)
{
    uint32_t w[2];
#if FMHA_HAS_E4M3_CVT
    /* Through fp16 (exact) and fp32 (exact): the bf16 is the fp32's top half, exact too
     * (a code has four significant bits), NaN included. */
    for (int i = 0; i < 2; i++) {
        const uint32_t h = fmha_e4m3x2_to_half2((uint16_t)(codes >> (16 * i)));
        const __half2 hh = *reinterpret_cast<const __half2 *>(&h);
        const float2 f = __half22float2(hh);
        w[i] = (__float_as_uint(f.x) >> 16) | (__float_as_uint(f.y) & 0xffff0000u);
    }
#else
    for (int i = 0; i < 2; i++)
        w[i] = (__float_as_uint(e4m3_to_float(codes >> (16 * i))) >> 16) |
               (__float_as_uint(e4m3_to_float(codes >> (16 * i + 8))) & 0xffff0000u);
#endif
    return make_uint2(w[0], w[1]);
}

/* Two floats to two codes (lo in the low byte), as float_to_e4m3. */
__device__ __forceinline__ uint32_t narrow_to_e4m3x2(float lo, float hi)
{
#if FMHA_HAS_E4M3_CVT
    return fmha_floats_to_e4m3x2(lo, hi);
#else
    return float_to_e4m3(lo) | float_to_e4m3(hi) << 8;
#endif
}

}  // namespace fmha

#endif /* FMHA_CONVERT_H */
