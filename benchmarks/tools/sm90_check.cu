/*
 * sm90_check.cu: standalone correctness and speed check of the sm_90a
 * warp-specialized prefill kernel (kernels/fwd_sm90.h), outside the library.
 *
 *   correctness  random non-zero bf16/fp16 inputs; a naive fp32 reference
 *                kernel here (one thread per (batch, row, head)); out and lse
 *                poisoned before the run and every element checked written;
 *                relative Frobenius error of out, max abs error of lse; rows
 *                that see no key must give 0 and -inf; strides TMA cannot use
 *                must be refused (FMHA_ERR_UNSUPPORTED), not run; a second run
 *                must give the same bits
 *   speed        cudaEvent time of single launches (warm-up, median of 20),
 *                TFLOP/s over the (query, key) pairs the mask lets through;
 *                these shapes are checked against the reference on a sample of rows
 *
 * Usage:
 *   sm90_check                 every case, table last
 *   sm90_check --small         one small case per kernel instance (for compute-sanitizer)
 *   sm90_check --profile "B HQ HKV SQ SK D CAUSAL bf16|fp16"
 *                              inputs, then exactly one launch (for ncu)
 *   sm90_check --time "B HQ HKV SQ SK D CAUSAL bf16|fp16 SCHED" [--time ...]
 *                              only these shapes, timed and checked on sampled rows
 * Exit status 0 when every case passes.
 */
#include "fwd_sm90.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

void fatal(); /* prints the rows finished so far, then exits */
#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t err_ = (call);                                                                \
        if (err_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            fatal();                                                                              \
        }                                                                                         \
    } while (0)

namespace {

template <typename T> __device__ float to_f(T x);
template <> __device__ float to_f(fmha_bf16 x) { return __bfloat162float(x); }
template <> __device__ float to_f(fmha_half x) { return __half2float(x); }
template <typename T> __device__ T from_f(float x);
template <> __device__ fmha_bf16 from_f(float x) { return __float2bfloat16_rn(x); }
template <> __device__ fmha_half from_f(float x) { return __float2half_rn(x); }

/* Values in +-[1/2048, 1], never zero, from a hash of the index and a seed. */
template <typename T> __global__ void fill_random(T *x, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) * 40503u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        h *= 3266489917u;
        h ^= h >> 16;
        const float mag = ((h & 2047u) + 1) / 2048.f;
        x[i] = from_f<T>((h & 4096u) ? mag : -mag);
    }
}

__global__ void fill_u16(uint16_t *x, size_t n, uint16_t v)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}
__global__ void fill_f32(float *x, size_t n, float v)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}

/* One sampled row's comparison. */
struct row_result {
    double err2, ref2;  /* sum over the row of (out - ref)^2 and ref^2 */
    float lse_err;      /* |lse - ref lse| (0 when both are -inf) */
    int bad;            /* the row saw no key but out != 0 or lse != -inf, or lse is NaN */
};

/*
 * Reference for sampled rows: thread r handles (b, h, sample), query row
 * i = sample * row_step + (b * 131 + h * 37) % row_step (clamped), computes
 * softmax(scale q.k) v in fp32 with expf, and compares with out/lse.
 */
template <typename T>
__global__ void reference_check(const fmha_fwd_params p, int64_t samples, int64_t row_step, row_result *res)
{
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t total = p.batch * p.heads_q * samples;
    if (r >= total)
        return;
    const int64_t s = r % samples, h = r / samples % p.heads_q, b = r / samples / p.heads_q;
    int64_t i = s * row_step + (b * 131 + h * 37) % row_step;
    if (i >= p.seqlen_q)
        i = p.seqlen_q - 1;
    const int64_t hk = h / (p.heads_q / p.heads_kv);
    const int D = (int)p.head_dim;
    const T *q = static_cast<const T *>(p.q) + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
    float qf[128], acc[128];
    for (int d = 0; d < D; d++) {
        qf[d] = to_f(q[d]);
        acc[d] = 0.f;
    }
    int64_t last = p.seqlen_k - 1;
    if (p.causal) {
        const int64_t lim = i + p.seqlen_k - p.seqlen_q;
        last = lim < last ? lim : last;
    }
    float m = -INFINITY, l = 0.f;
    for (int64_t j = 0; j <= last; j++) {
        const T *k = static_cast<const T *>(p.k) + b * p.k_batch_stride + j * p.k_row_stride + hk * p.k_head_stride;
        const T *v = static_cast<const T *>(p.v) + b * p.v_batch_stride + j * p.v_row_stride + hk * p.v_head_stride;
        float dot = 0.f;
        for (int d = 0; d < D; d++)
            dot += qf[d] * to_f(k[d]);
        const float sc = dot * p.softmax_scale;
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new), e = expf(sc - m_new);
        l = l * corr + e;
        for (int d = 0; d < D; d++)
            acc[d] = acc[d] * corr + e * to_f(v[d]);
        m = m_new;
    }
    const T *o = static_cast<const T *>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
    const float got_lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i * p.lse_row_stride];
    row_result out{0.0, 0.0, 0.f, 0};
    if (last < 0) {
        for (int d = 0; d < D; d++)
            out.bad |= to_f(o[d]) != 0.f;
        out.bad |= !(got_lse == -INFINITY);
    } else {
        for (int d = 0; d < D; d++) {
            const double ref = acc[d] / l, diff = (double)to_f(o[d]) - ref;
            out.err2 += diff * diff;
            out.ref2 += ref * ref;
        }
        const float ref_lse = m + logf(l);
        out.lse_err = fabsf(got_lse - ref_lse);
        out.bad |= !(out.lse_err <= 1e30f); /* NaN or inf */
    }
    res[r] = out;
}

/* Poison left behind: out elements still 0xFFFF (or NaN), lse entries still NaN,
 * and padding between heads (when the out rows are wider) that was written. */
template <typename T>
__global__ void count_poison(const fmha_fwd_params p, int64_t o_pad, unsigned long long *counts)
{
    const int64_t D = p.head_dim, row_elems = p.heads_q * (D + o_pad);
    const int64_t n = p.batch * p.seqlen_q * row_elems;
    unsigned long long unwritten = 0, pad_written = 0, lse_unwritten = 0;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = idx % (D + o_pad), h = idx / (D + o_pad) % p.heads_q;
        const int64_t i = idx / row_elems % p.seqlen_q, b = idx / row_elems / p.seqlen_q;
        const uint16_t *o = static_cast<const uint16_t *>(p.out) + b * p.o_batch_stride + i * p.o_row_stride +
                            h * p.o_head_stride + e;
        if (e < D)
            unwritten += *o == 0xFFFFu || isnan(to_f(*reinterpret_cast<const T *>(o)));
        else
            pad_written += *o != 0xFFFFu;
        if (e == 0)
            lse_unwritten += isnan(p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i * p.lse_row_stride]);
    }
    atomicAdd(&counts[0], unwritten);
    atomicAdd(&counts[1], pad_written);
    atomicAdd(&counts[2], lse_unwritten);
}

struct shape {
    int64_t b, hq, hkv, sq, sk, d;
    bool causal, bf16;
    int layout; /* 0 dense; 1 q/k/v slices of one packed qkv buffer, out and lse padded; 2 unaligned strides */
    int sched;  /* fmha::sm90::schedule */
};

struct result_row {
    std::string name;
    double err, lse_err;
    bool pass;
    double ms, tflops;
    std::string note;
};

std::string describe(const shape &s)
{
    char buf[160];
    snprintf(buf, sizeof buf, "%s %s d%lld (%lld,%lld,%lld,%lld,%lld)%s%s", s.sched ? "pp" : "il",
             s.bf16 ? "bf16" : "fp16", (long long)s.d, (long long)s.b, (long long)s.hq, (long long)s.hkv,
             (long long)s.sq, (long long)s.sk, s.causal ? " causal" : "",
             s.layout == 1 ? " packed" : s.layout == 2 ? " unaligned" : "");
    return buf;
}

/* Query-key pairs the mask lets through. */
double visible_pairs(const shape &s)
{
    if (!s.causal)
        return (double)s.sq * (double)s.sk;
    double n = 0;
    for (int64_t i = 0; i < s.sq; i++)
        n += (double)std::max<int64_t>(0, std::min<int64_t>(s.sk, i + s.sk - s.sq + 1));
    return n;
}

struct buffers {
    void *qkv = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
    float *lse = nullptr;
    size_t out_elems = 0, lse_elems = 0;
    ~buffers()
    {
        cudaFree(qkv);
        cudaFree(k);
        cudaFree(v);
        cudaFree(out);
        cudaFree(lse);
    }
};

/* Allocate and fill the tensors of s, and the params that describe them. */
fmha_fwd_params make_problem(const shape &s, buffers &buf, int64_t &o_pad)
{
    fmha_fwd_params p;
    memset(&p, 0, sizeof p);
    p.batch = s.b;
    p.seqlen_q = s.sq;
    p.seqlen_k = s.sk;
    p.heads_q = s.hq;
    p.heads_kv = s.hkv;
    p.head_dim = s.d;
    p.dtype = s.bf16 ? FMHA_DTYPE_BF16 : FMHA_DTYPE_F16;
    p.causal = s.causal;
    p.softmax_scale = 1.f / sqrtf((float)s.d);
    p.scale_log2 = p.softmax_scale * 1.4426950408889634f;
    p.num_splits = 1;
    const int64_t D = s.d;
    auto alloc16 = [](void **ptr, size_t elems) { CK(cudaMalloc(ptr, std::max<size_t>(elems, 1) * 2)); };
    auto fill = [&](void *ptr, size_t n, uint32_t seed) {
        if (s.bf16)
            fill_random<<<1024, 256>>>(static_cast<fmha_bf16 *>(ptr), n, seed);
        else
            fill_random<<<1024, 256>>>(static_cast<fmha_half *>(ptr), n, seed);
        CK(cudaGetLastError());
    };
    o_pad = 0;
    int64_t lse_pad = 0;
    if (s.layout == 1) {
        /* [b, s, 3, h, d] with h = hq = hkv: q, k, v are slices of one buffer */
        const int64_t S = std::max(s.sq, s.sk), row = 3 * s.hq * D;
        alloc16(&buf.qkv, (size_t)(s.b * S * row));
        fill(buf.qkv, (size_t)(s.b * S * row), 1234u);
        char *base = static_cast<char *>(buf.qkv);
        p.q = base;
        p.k = base + 2 * s.hq * D;
        p.v = base + 2 * 2 * s.hq * D;
        p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = S * row;
        p.q_row_stride = p.k_row_stride = p.v_row_stride = row;
        p.q_head_stride = p.k_head_stride = p.v_head_stride = D;
        o_pad = 64;
        lse_pad = 3;
    } else {
        /* layout 2: each head padded by 4 elements (8 bytes): rows not 16-byte multiples */
        const int64_t hs = s.layout == 2 ? D + 4 : D;
        alloc16(&buf.qkv, (size_t)(s.b * s.sq * s.hq * hs));
        alloc16(&buf.k, (size_t)(s.b * s.sk * s.hkv * hs));
        alloc16(&buf.v, (size_t)(s.b * s.sk * s.hkv * hs));
        fill(buf.qkv, (size_t)(s.b * s.sq * s.hq * hs), 1234u);
        fill(buf.k, (size_t)(s.b * s.sk * s.hkv * hs), 5678u);
        fill(buf.v, (size_t)(s.b * s.sk * s.hkv * hs), 9012u);
        p.q = buf.qkv;
        p.k = buf.k;
        p.v = buf.v;
        p.q_batch_stride = s.sq * s.hq * hs;
        p.q_row_stride = s.hq * hs;
        p.q_head_stride = hs;
        p.k_batch_stride = p.v_batch_stride = s.sk * s.hkv * hs;
        p.k_row_stride = p.v_row_stride = s.hkv * hs;
        p.k_head_stride = p.v_head_stride = hs;
    }
    const int64_t ohs = D + o_pad;
    buf.out_elems = (size_t)(s.b * s.sq * s.hq * ohs);
    alloc16(&buf.out, buf.out_elems);
    p.out = buf.out;
    p.o_batch_stride = s.sq * s.hq * ohs;
    p.o_row_stride = s.hq * ohs;
    p.o_head_stride = ohs;
    buf.lse_elems = (size_t)(s.b * s.hq * (s.sq + lse_pad));
    CK(cudaMalloc(&buf.lse, std::max<size_t>(buf.lse_elems, 1) * sizeof(float)));
    p.lse = buf.lse;
    p.lse_batch_stride = s.hq * (s.sq + lse_pad);
    p.lse_head_stride = s.sq + lse_pad;
    p.lse_row_stride = 1;
    p.stream = nullptr;
    p.device = 0;
    return p;
}

void poison(const buffers &buf)
{
    fill_u16<<<1024, 256>>>(static_cast<uint16_t *>(buf.out), buf.out_elems, 0xFFFFu);
    CK(cudaGetLastError());
    fill_f32<<<1024, 256>>>(buf.lse, buf.lse_elems, NAN);
    CK(cudaGetLastError());
}

/* Sampled-row reference comparison; the worst figures go into row. */
void check_against_reference(const shape &s, const fmha_fwd_params &p, int64_t o_pad, int64_t max_rows,
                             result_row &row)
{
    const int64_t row_step = std::max<int64_t>(1, s.b * s.hq * s.sq / max_rows);
    const int64_t samples = (s.sq + row_step - 1) / row_step, total = s.b * s.hq * samples;
    row_result *d_res;
    CK(cudaMalloc(&d_res, total * sizeof(row_result)));
    const int threads = 128;
    if (s.bf16)
        reference_check<fmha_bf16><<<(unsigned)((total + threads - 1) / threads), threads>>>(p, samples, row_step, d_res);
    else
        reference_check<fmha_half><<<(unsigned)((total + threads - 1) / threads), threads>>>(p, samples, row_step, d_res);
    CK(cudaGetLastError());
    unsigned long long *d_counts;
    CK(cudaMalloc(&d_counts, 3 * sizeof(unsigned long long)));
    CK(cudaMemset(d_counts, 0, 3 * sizeof(unsigned long long)));
    if (s.bf16)
        count_poison<fmha_bf16><<<2048, 256>>>(p, o_pad, d_counts);
    else
        count_poison<fmha_half><<<2048, 256>>>(p, o_pad, d_counts);
    CK(cudaGetLastError());
    std::vector<row_result> res(total);
    unsigned long long counts[3];
    CK(cudaMemcpy(res.data(), d_res, total * sizeof(row_result), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(counts, d_counts, sizeof counts, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_res));
    CK(cudaFree(d_counts));
    double err2 = 0, ref2 = 0;
    float lse_err = 0;
    long bad = 0;
    for (const row_result &r : res) {
        err2 += r.err2;
        ref2 += r.ref2;
        lse_err = std::max(lse_err, r.lse_err);
        bad += r.bad;
    }
    row.err = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    row.lse_err = lse_err;
    const double tol = s.bf16 ? 1e-2 : 2e-3;
    row.pass = row.err <= tol && row.lse_err <= 1e-2 && bad == 0 && counts[0] == 0 && counts[1] == 0 && counts[2] == 0;
    char note[200];
    snprintf(note, sizeof note, "%s%lld rows checked", row_step > 1 ? "sampled: " : "", (long long)total);
    row.note = note;
    if (bad || counts[0] || counts[1] || counts[2]) {
        snprintf(note, sizeof note, "; BAD empty rows %ld, out unwritten %llu, pad written %llu, lse unwritten %llu", bad,
                 counts[0], counts[1], counts[2]);
        row.note += note;
    }
}

bool run_launch(const fmha_fwd_params &p, int sched, fmha_status *status)
{
    cudaError_t err;
    *status = fmha::fmha_sm90_prefill_launch(p, &err, sched);
    if (*status == FMHA_ERR_RUNTIME) {
        fprintf(stderr, "launch failed: %s\n", cudaGetErrorString(err));
        fatal();
    }
    return *status == FMHA_OK;
}

result_row run_case(const shape &s, int timed_runs, int64_t max_rows)
{
    result_row row{describe(s), NAN, NAN, false, NAN, NAN, ""};
    buffers buf;
    int64_t o_pad;
    const fmha_fwd_params p = make_problem(s, buf, o_pad);
    poison(buf);
    fmha_status st;
    if (!run_launch(p, s.sched, &st)) {
        /* unaligned layouts must be refused; anything else refused is a failure */
        row.pass = s.layout == 2 && st == FMHA_ERR_UNSUPPORTED;
        row.note = st == FMHA_ERR_UNSUPPORTED ? "refused (FMHA_ERR_UNSUPPORTED)" : "status " + std::to_string((int)st);
        return row;
    }
    if (s.layout == 2) {
        row.note = "ran, but TMA cannot address these strides: should have been refused";
        return row;
    }
    CK(cudaDeviceSynchronize());
    check_against_reference(s, p, o_pad, max_rows, row);
    if (timed_runs == 0) {
        /* Determinism: a second run gives the same bits. */
        std::vector<uint16_t> first(buf.out_elems), second(buf.out_elems);
        std::vector<float> lse1(buf.lse_elems), lse2(buf.lse_elems);
        CK(cudaMemcpy(first.data(), buf.out, buf.out_elems * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse1.data(), buf.lse, buf.lse_elems * 4, cudaMemcpyDeviceToHost));
        run_launch(p, s.sched, &st);
        CK(cudaMemcpy(second.data(), buf.out, buf.out_elems * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse2.data(), buf.lse, buf.lse_elems * 4, cudaMemcpyDeviceToHost));
        if (memcmp(first.data(), second.data(), buf.out_elems * 2) != 0 ||
            memcmp(lse1.data(), lse2.data(), buf.lse_elems * 4) != 0) {
            row.pass = false;
            row.note += "; NOT deterministic";
        }
    }
    if (timed_runs > 0) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        for (int i = 0; i < 3; i++)
            run_launch(p, s.sched, &st);
        std::vector<float> ms;
        for (int i = 0; i < timed_runs; i++) {
            CK(cudaEventRecord(a));
            run_launch(p, s.sched, &st);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float t;
            CK(cudaEventElapsedTime(&t, a, b));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        row.ms = ms[ms.size() / 2];
        row.tflops = 4.0 * s.b * s.hq * visible_pairs(s) * s.d / (row.ms * 1e-3) / 1e12;
        CK(cudaEventDestroy(a));
        CK(cudaEventDestroy(b));
    }
    return row;
}

void print_instances()
{
    struct inst {
        const char *name;
        const void *fn;
    } list[] = {
        {"bf16 d64", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 64, false, 0>},
        {"bf16 d64 causal", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 64, true, 0>},
        {"bf16 d128", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, false, 0>},
        {"bf16 d128 causal", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, true, 0>},
        {"bf16 d128 pingpong", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, false, 1>},
        {"fp16 d64 pingpong", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_half, 64, false, 1>},
    };
    for (const inst &k : list) {
        cudaFuncAttributes a;
        CK(cudaFuncGetAttributes(&a, k.fn));
        printf("kernel %-18s regs %3d  local %zu B  binary sm_%d\n", k.name, a.numRegs, a.localSizeBytes,
               a.binaryVersion);
    }
}

bool parse_shape(const char *text, shape &s)
{
    long long b, hq, hkv, sq, sk, d;
    int causal, sched = 0;
    char dt[16];
    const int n = sscanf(text, "%lld %lld %lld %lld %lld %lld %d %15s %d", &b, &hq, &hkv, &sq, &sk, &d, &causal, dt, &sched);
    if (n < 8)
        return false;
    s = shape{b, hq, hkv, sq, sk, d, causal != 0, strcmp(dt, "fp16") != 0, 0, sched};
    return true;
}

std::vector<result_row> g_rows;

void print_header()
{
    printf("%-56s %10s %9s %5s %9s %8s  %s\n", "case (il interleaved, pp ping-pong)", "out err", "lse err", "", "ms",
           "TFLOP/s", "note");
}

void print_row(const result_row &r)
{
    char timing[32] = "        -        -";
    if (!std::isnan(r.ms))
        snprintf(timing, sizeof timing, "%9.3f %8.1f", r.ms, r.tflops);
    printf("%-56s %10.2e %9.2e %5s %s  %s\n", r.name.c_str(), r.err, r.lse_err, r.pass ? "PASS" : "FAIL", timing,
           r.note.c_str());
    fflush(stdout);
}

/* The result table (last thing printed); returns the failed count. */
int print_table()
{
    int failed = 0;
    printf("\n");
    print_header();
    for (const result_row &r : g_rows) {
        failed += !r.pass;
        print_row(r);
    }
    printf("%d of %zu cases passed\n", (int)(g_rows.size() - failed), g_rows.size());
    fflush(stdout);
    return failed;
}

}  // namespace

void fatal()
{
    printf("\nstopped by a CUDA error (see stderr); rows finished before it:\n");
    print_table();
    exit(2);
}

int main(int argc, char **argv)
{
    bool small = false;
    const char *profile = nullptr;
    std::vector<const char *> timed_shapes;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small"))
            small = true;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
            profile = argv[++i];
        else if (!strcmp(argv[i], "--time") && i + 1 < argc)
            timed_shapes.push_back(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--small] [--profile SHAPE] [--time SHAPE]...\n"
                            "  SHAPE: \"B HQ HKV SQ SK D CAUSAL bf16|fp16 [SCHED]\"\n", argv[0]);
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (cc %d.%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    if (prop.major != 9) {
        printf("not a cc 9.x device: nothing to check\n");
        return 2;
    }
    if (!fmha_tensor_map_encoder()) {
        printf("the driver has no cuTensorMapEncodeTiled: every launch will be refused\n");
        return 2;
    }

    if (profile) {
        shape s;
        if (!parse_shape(profile, s)) {
            fprintf(stderr, "bad --profile shape\n");
            return 2;
        }
        buffers buf;
        int64_t o_pad;
        const fmha_fwd_params p = make_problem(s, buf, o_pad);
        fmha_status st;
        if (!run_launch(p, s.sched, &st)) {
            fprintf(stderr, "refused: status %d\n", (int)st);
            return 1;
        }
        CK(cudaDeviceSynchronize());
        printf("profiled one launch of %s\n", describe(s).c_str());
        return 0;
    }

    print_instances();
    if (!timed_shapes.empty()) {
        /* only these shapes: timed and checked on sampled rows */
        print_header();
        for (const char *text : timed_shapes) {
            shape s;
            if (!parse_shape(text, s)) {
                fprintf(stderr, "bad --time shape: %s\n", text);
                return 2;
            }
            g_rows.push_back(run_case(s, 20, 4096));
            print_row(g_rows.back());
        }
        return print_table() ? 1 : 0;
    }
    /* Both schedules, the default (interleaved) first: if the other one fails
     * the launch, the rows finished so far are still printed. */
    std::vector<shape> cases;
    for (int sched : {fmha::sm90::INTERLEAVED, fmha::sm90::PINGPONG}) {
        for (int bf16 = 1; bf16 >= 0; bf16--)
            for (int64_t d : {64, 128}) {
                const bool bf = bf16 != 0;
                auto add = [&](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, bool causal, int layout) {
                    cases.push_back({b, hq, hkv, sq, sk, d, causal, bf, layout, sched});
                };
                if (small) {
                    add(2, 4, 1, 129, 131, true, 0);
                    add(2, 4, 2, 130, 127, false, 0);
                    continue;
                }
                add(2, 4, 4, 1, 1, false, 0);
                add(2, 4, 1, 17, 17, true, 0);
                add(2, 8, 1, 127, 129, false, 0);
                add(2, 8, 2, 129, 127, true, 0);     /* Sq > Sk, causal */
                add(2, 4, 4, 1003, 1003, true, 0);
                add(2, 4, 4, 1003, 1003, false, 0);
                add(2, 8, 8, 129, 1003, true, 0);    /* Sq < Sk, causal */
                add(2, 4, 2, 1003, 17, true, 0);     /* most rows see no key */
                add(2, 2, 2, 17, 1003, false, 0);
                add(2, 16, 2, 257, 385, true, 0);    /* GQA 8 */
                add(2, 4, 4, 300, 517, true, 1);     /* packed qkv, padded out and lse */
                add(2, 4, 4, 64, 64, false, 2);      /* must be refused */
            }
        if (!small) {
            cases.push_back({8, 16, 16, 8192, 8192, 64, false, true, 0, sched});
            cases.push_back({8, 16, 16, 8192, 8192, 64, true, true, 0, sched});
            cases.push_back({2, 64, 64, 8192, 8192, 128, false, true, 0, sched});
            cases.push_back({2, 64, 64, 8192, 8192, 128, false, false, 0, sched});
            cases.push_back({16, 64, 8, 8192, 8192, 128, true, true, 0, sched});
            cases.push_back({4, 32, 32, 2048, 2048, 128, true, true, 0, sched});
        }
    }
    /* Rows as they finish (a hang or a fault still leaves them), then the whole table. */
    print_header();
    for (const shape &s : cases) {
        /* the speed shapes (2048 keys and more) are timed and checked on sampled rows */
        const bool timed = s.sk >= 2048;
        g_rows.push_back(run_case(s, timed ? 20 : 0, timed ? 4096 : 1 << 30));
        print_row(g_rows.back());
    }
    const int failed = print_table();
    return failed ? 1 : 0;
}
