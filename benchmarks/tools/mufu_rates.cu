// Special-function throughput on this GPU: results per clock per SM of the
// approximations the softmax and the softcap use (tanh, ex2 in f32 and packed
// 16-bit forms), and of the FMA-pipe exp2 (a cubic and an exponent field), each
// alone and tanh mixed with each exp2.  Independent chains, enough warps to fill
// the SM; a value counts once (a packed op gives two).
//   nvcc -O3 -arch=sm_90a -o /tmp/mufu_rates benchmarks/tools/mufu_rates.cu && /tmp/mufu_rates
#include <cstdint>
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

constexpr int CHAINS = 8, ITERS = 4096, THREADS = 512;

/* One PTX instruction of one operand, as a function (f: a float, r: a packed pair). */
#define PTX_UNARY(NAME, TYPE, REG, OP)                        \
    __device__ __forceinline__ TYPE NAME(TYPE x)              \
    {                                                         \
        TYPE y;                                               \
        asm volatile(OP " %0, %1;" : "=" REG(y) : REG(x));    \
        return y;                                             \
    }
PTX_UNARY(tanh_f32, float, "f", "tanh.approx.f32")
PTX_UNARY(ex2_f32, float, "f", "ex2.approx.ftz.f32")
PTX_UNARY(tanh_f16x2, uint32_t, "r", "tanh.approx.f16x2")
PTX_UNARY(ex2_f16x2, uint32_t, "r", "ex2.approx.f16x2")
PTX_UNARY(ex2_bf16x2, uint32_t, "r", "ex2.approx.ftz.bf16x2")

/* 2^x on the FMA pipe: round with 1.5 * 2^23, a cubic for the fraction, the exponent field. */
__device__ __forceinline__ float ex2_fma(float x)
{
    const float t = x + 12582912.f;
    const float f = x - (t - 12582912.f);
    const float p = fmaf(fmaf(fmaf(0x1.c2a188p-5f, f, 0x1.f00c18p-3f), f, 0x1.62f5fap-1f), f, 1.f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

template <int KIND> __global__ void rate(float *out, float seed)
{
    float a[CHAINS];
    uint32_t h[CHAINS];
    for (int c = 0; c < CHAINS; c++) {
        a[c] = seed * (threadIdx.x + c) * 1e-4f - 0.5f;
        __half2 v = __floats2half2_rn(a[c], -a[c]);
        h[c] = *reinterpret_cast<uint32_t *>(&v);
    }
#pragma unroll 4
    for (int i = 0; i < ITERS; i++)
#pragma unroll
        for (int c = 0; c < CHAINS; c++) {
            if (KIND == 0) a[c] = tanh_f32(a[c]);
            if (KIND == 1) h[c] = tanh_f16x2(h[c]);
            if (KIND == 2) a[c] = ex2_f32(a[c]) - 1.5f;
            if (KIND == 3) h[c] = ex2_f16x2(h[c]) ^ 0x80008000u;
            if (KIND == 4) h[c] = ex2_bf16x2(h[c]) ^ 0x80008000u;
            if (KIND == 5) a[c] = ex2_fma(a[c]) - 1.5f;
            if (KIND == 6) a[c] = ex2_f32(tanh_f32(a[c])) - 1.5f;
            if (KIND == 7) a[c] = ex2_fma(tanh_f32(a[c])) - 1.5f;
            if (KIND == 8) {
                h[c] = tanh_f16x2(h[c]);
                __half2 v = *reinterpret_cast<__half2 *>(&h[c]);
                float2 f = __half22float2(v);
                f.x = ex2_f32(f.x) - 1.5f;
                f.y = ex2_f32(f.y) - 1.5f;
                v = __floats2half2_rn(f.x, f.y);
                h[c] = *reinterpret_cast<uint32_t *>(&v);
            }
        }
    float s = 0.f;
    for (int c = 0; c < CHAINS; c++)
        s += a[c] + __half2float(reinterpret_cast<__half2 *>(&h[c])->x);
    if (s == 12345.f)
        out[threadIdx.x] = s;
}

int main()
{
    const char *names[] = {"tanh.approx.f32", "tanh.approx.f16x2", "ex2.approx.f32", "ex2.approx.f16x2",
                           "ex2.approx.bf16x2", "ex2 on FMA (cubic)", "tanh.f32 + ex2.f32",
                           "tanh.f32 + ex2 on FMA", "tanh.f16x2 + 2 ex2.f32"};
    const int values_per_op[] = {1, 2, 1, 2, 2, 1, 1, 1, 2};
    int dev = 0, sms = 0, clock_khz = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
    float *out;
    cudaMalloc(&out, THREADS * sizeof(float));
    void (*kernels[])(float *, float) = {rate<0>, rate<1>, rate<2>, rate<3>, rate<4>,
                                         rate<5>, rate<6>, rate<7>, rate<8>};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int blocks = sms * 4;
    printf("%d SMs, %.0f MHz (attribute clock; rates below assume it)\n", sms, clock_khz / 1e3);
    for (int k = 0; k < 9; k++) {
        kernels[k]<<<blocks, THREADS>>>(out, 1.f);
        cudaEventRecord(e0);
        kernels[k]<<<blocks, THREADS>>>(out, 1.f);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0.f;
        cudaEventElapsedTime(&ms, e0, e1);
        const double values = (double)blocks * THREADS * CHAINS * ITERS * values_per_op[k];
        const double per_clk_sm = values / (ms * 1e-3) / (clock_khz * 1e3) / sms;
        printf("%-26s %8.3f ms  %6.1f values/clk/SM\n", names[k], ms, per_clk_sm);
    }
    return cudaGetLastError() != cudaSuccess;
}
