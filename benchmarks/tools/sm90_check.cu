/*
 * sm90_check.cu: standalone correctness and speed check of the sm_90a
 * warp-specialized prefill kernel (kernels/fwd_sm90.h), outside the library.
 *
 *   correctness  random non-zero bf16/fp16 inputs; a naive fp32 reference
 *                kernel here (one thread per (batch, row, head)), with the
 *                window, softcap and sinks of fmha.h; out and lse
 *                poisoned before the run and every element checked written;
 *                relative Frobenius error of out, max abs error of lse; rows
 *                that see no key must give 0 and -inf (the sink with sinks); strides TMA cannot use
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
 *   sm90_check --time "B HQ HKV SQ SK D CAUSAL bf16|fp16 SCHED [window=L,R] [softcap=C] [sinks]"
 *                              [--time ...]: only these shapes, timed and checked on sampled rows
 *   sm90_check --feature-speed the feature timings of issue 21: a 4096-key window at 131072
 *                              keys against dense 4096 keys with the same rows, and softcap /
 *                              sinks against plain at (4, 32, 32, 8192, 8192, 128); ratios last
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
    /* keys [first, last] (fmha.h): the row sits at key position i + seqlen_k - seqlen_q */
    const int64_t pos = i + p.seqlen_k - p.seqlen_q, right = p.causal ? 0 : p.window_right;
    int64_t last = p.seqlen_k - 1, first = 0;
    if (right >= 0 && pos + right < last)
        last = pos + right;
    if (p.window_left >= 0 && pos - p.window_left > first)
        first = pos - p.window_left;
    float m = -INFINITY, l = 0.f;
    for (int64_t j = first; j <= last; j++) {
        const T *k = static_cast<const T *>(p.k) + b * p.k_batch_stride + j * p.k_row_stride + hk * p.k_head_stride;
        const T *v = static_cast<const T *>(p.v) + b * p.v_batch_stride + j * p.v_row_stride + hk * p.v_head_stride;
        float dot = 0.f;
        for (int d = 0; d < D; d++)
            dot += qf[d] * to_f(k[d]);
        float sc = dot * p.softmax_scale;
        if (p.softcap > 0.f)
            sc = p.softcap * tanhf(sc / p.softcap);
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
    const float sink = p.sinks ? p.sinks[h] : -INFINITY;
    if (last < first) {
        for (int d = 0; d < D; d++)
            out.bad |= to_f(o[d]) != 0.f;
        out.bad |= !(got_lse == sink);
    } else {
        /* a sink joins the denominator only */
        float keep = 1.f;
        if (p.sinks) {
            const float mx = fmaxf(m, sink);
            keep = expf(m - mx);
            l = l * keep + expf(sink - mx);
            m = mx;
        }
        for (int d = 0; d < D; d++) {
            const double ref = acc[d] * keep / l, diff = (double)to_f(o[d]) - ref;
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
    int64_t win_left = -1, win_right = -1; /* fmha.h's window; -1 unbounded */
    float softcap = 0.f;
    bool sinks = false; /* per-head sink logits (sink_of) */
    float scale = 0.f;  /* softmax_scale; 0 = 1 / sqrt(d) */
};

/* The sink of head h: on both sides of typical row maxima, one far above them. */
float sink_of(int64_t h) { return h % 5 == 4 ? 12.f : -2.f + 0.75f * (float)(h % 5); }

struct result_row {
    std::string name;
    double err, lse_err;
    bool pass;
    double ms, tflops;
    std::string note;
};

std::string describe(const shape &s)
{
    char buf[200], extra[80] = "";
    int n = 0;
    if (s.win_left >= 0 || s.win_right >= 0)
        n += snprintf(extra + n, sizeof extra - n, " win(%lld,%lld)", (long long)s.win_left, (long long)s.win_right);
    if (s.softcap > 0.f)
        n += snprintf(extra + n, sizeof extra - n, " cap%g", s.softcap);
    if (s.sinks)
        n += snprintf(extra + n, sizeof extra - n, " sinks");
    if (s.scale > 0.f)
        snprintf(extra + n, sizeof extra - n, " scale%g", s.scale);
    snprintf(buf, sizeof buf, "%s %s d%lld (%lld,%lld,%lld,%lld,%lld)%s%s%s", s.sched ? "pp" : "il",
             s.bf16 ? "bf16" : "fp16", (long long)s.d, (long long)s.b, (long long)s.hq, (long long)s.hkv,
             (long long)s.sq, (long long)s.sk, s.causal ? " causal" : "",
             s.layout == 1 ? " packed" : s.layout == 2 ? " unaligned" : "", extra);
    return buf;
}

/* Query-key pairs the mask lets through. */
double visible_pairs(const shape &s)
{
    const int64_t right = s.causal ? 0 : s.win_right;
    if (right < 0 && s.win_left < 0)
        return (double)s.sq * (double)s.sk;
    double n = 0;
    for (int64_t i = 0; i < s.sq; i++) {
        const int64_t pos = i + s.sk - s.sq;
        const int64_t last = right < 0 ? s.sk - 1 : std::min<int64_t>(s.sk - 1, pos + right);
        const int64_t first = s.win_left < 0 ? 0 : std::max<int64_t>(0, pos - s.win_left);
        n += (double)std::max<int64_t>(0, last - first + 1);
    }
    return n;
}

struct buffers {
    void *qkv = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
    float *lse = nullptr, *sinks = nullptr;
    size_t out_elems = 0, lse_elems = 0;
    ~buffers()
    {
        cudaFree(qkv);
        cudaFree(k);
        cudaFree(v);
        cudaFree(out);
        cudaFree(lse);
        cudaFree(sinks);
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
    p.softmax_scale = s.scale > 0.f ? s.scale : 1.f / sqrtf((float)s.d);
    p.scale_log2 = p.softmax_scale * 1.4426950408889634f;
    p.num_splits = 1;
    p.window_left = s.win_left;
    p.window_right = s.win_right;
    p.softcap = s.softcap;
    if (s.sinks) {
        std::vector<float> host(s.hq);
        for (int64_t h = 0; h < s.hq; h++)
            host[h] = sink_of(h);
        CK(cudaMalloc(&buf.sinks, s.hq * sizeof(float)));
        CK(cudaMemcpy(buf.sinks, host.data(), s.hq * sizeof(float), cudaMemcpyHostToDevice));
        p.sinks = buf.sinks;
    }
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
    using namespace fmha::sm90;
    struct inst {
        const char *name;
        const void *fn;
    } list[] = {
        {"bf16 d64", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 64, MASK_NONE, 0, 0>},
        {"bf16 d64 causal", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 64, MASK_CAUSAL, 0, 0>},
        {"bf16 d128", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, MASK_NONE, 0, 0>},
        {"bf16 d128 causal", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, MASK_CAUSAL, 0, 0>},
        {"bf16 d128 pingpong", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, MASK_NONE, 0, 1>},
        {"fp16 d64 pingpong", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_half, 64, MASK_NONE, 0, 1>},
        {"bf16 d128 window pp", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, MASK_WINDOW, 0, 1>},
        {"bf16 d128 cap+sink pp", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 128, MASK_CAUSAL, 3, 1>},
        {"bf16 d64 win+cap+sink", (const void *)fmha::sm90::fwd_sm90_kernel<fmha_bf16, 64, MASK_WINDOW, 3, 0>},
    };
    for (const inst &k : list) {
        cudaFuncAttributes a;
        CK(cudaFuncGetAttributes(&a, k.fn));
        printf("kernel %-22s regs %3d  local %zu B  binary sm_%d\n", k.name, a.numRegs, a.localSizeBytes,
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
    /* optional features after the shape */
    long long left, right;
    if (const char *w = strstr(text, "window=")) {
        if (sscanf(w, "window=%lld,%lld", &left, &right) != 2)
            return false;
        s.win_left = left;
        s.win_right = right;
    }
    if (const char *c = strstr(text, "softcap=")) {
        if (sscanf(c, "softcap=%f", &s.softcap) != 1)
            return false;
    }
    if (const char *c = strstr(text, "scale=")) {
        if (sscanf(c, "scale=%f", &s.scale) != 1)
            return false;
    }
    s.sinks = strstr(text, "sinks") != nullptr;
    return true;
}

std::vector<result_row> g_rows;

/* The largest relative and absolute error of tanh_fast against tanhf (to within fp32) over
 * 2^24 points of [-10, 10], the sign flips included. */
__global__ void tanh_error(float *worst)
{
    float rel = 0.f, abs_err = 0.f;
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < (1 << 24); i += (int)(gridDim.x * blockDim.x)) {
        const float x = -10.f + 20.f * ((float)i + 0.5f) / (float)(1 << 24);
#if FMHA_HAS_WGMMA
        const float got = fmha::tanh_fast(x);
#else
        const float got = NAN;
#endif
        const float ref = (float)tanh((double)x), err = fabsf(got - ref);
        abs_err = fmaxf(abs_err, err);
        if (ref != 0.f)
            rel = fmaxf(rel, err / fabsf(ref));
    }
    atomicMax(reinterpret_cast<int *>(&worst[0]), __float_as_int(rel)); /* non-negative floats order as ints */
    atomicMax(reinterpret_cast<int *>(&worst[1]), __float_as_int(abs_err));
}

void print_tanh_error()
{
    float *d;
    CK(cudaMalloc(&d, 2 * sizeof(float)));
    CK(cudaMemset(d, 0, 2 * sizeof(float)));
    tanh_error<<<264, 256>>>(d);
    CK(cudaGetLastError());
    float w[2];
    CK(cudaMemcpy(w, d, sizeof w, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    printf("tanh.approx (softcap) over [-10, 10]: max relative error %.3g (2^%.2f), max absolute error %.3g\n",
           w[0], log2(w[0]), w[1]);
}

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
    bool small = false, feature_speed = false;
    const char *profile = nullptr;
    std::vector<const char *> timed_shapes;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small"))
            small = true;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
            profile = argv[++i];
        else if (!strcmp(argv[i], "--time") && i + 1 < argc)
            timed_shapes.push_back(argv[++i]);
        else if (!strcmp(argv[i], "--feature-speed"))
            feature_speed = true;
        else {
            fprintf(stderr, "usage: %s [--small] [--feature-speed] [--profile SHAPE] [--time SHAPE]...\n"
                            "  SHAPE: \"B HQ HKV SQ SK D CAUSAL bf16|fp16 [SCHED] [window=L,R] [softcap=C] "
                            "[scale=S] [sinks]\"\n", argv[0]);
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
    print_tanh_error();
    /* issue 21's targets: a window within 10% of a dense call over as many keys per row,
     * softcap and sinks within 5% of plain; each pair is compared in the last lines */
    static const char *const feature_shapes[][2] = {
        {"1 16 16 131072 4096 128 0 bf16 1", "1 16 16 131072 131072 128 1 bf16 1 window=4096,-1"},
        {"4 32 32 8192 8192 128 0 bf16 1", "4 32 32 8192 8192 128 0 bf16 1 softcap=50"},
        {"4 32 32 8192 8192 128 0 bf16 1", "4 32 32 8192 8192 128 0 bf16 1 sinks"},
        {"4 32 32 8192 8192 128 0 bf16 1", "4 32 32 8192 8192 128 0 bf16 1 softcap=50 sinks"},
        {"4 32 32 8192 8192 128 1 bf16 1", "4 32 32 8192 8192 128 1 bf16 1 softcap=50 sinks"},
    };
    if (feature_speed) {
        for (const auto &pair : feature_shapes)
            for (const char *text : pair)
                timed_shapes.push_back(text);
    }
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
        const int failed = print_table();
        if (feature_speed) {
            /* the pairs are the last rows, base then feature */
            const size_t n_pairs = sizeof feature_shapes / sizeof feature_shapes[0];
            for (size_t i = g_rows.size() - 2 * n_pairs; i + 1 < g_rows.size(); i += 2)
                printf("%s\n  vs %s: time x%.3f\n", g_rows[i + 1].name.c_str(), g_rows[i].name.c_str(),
                       g_rows[i + 1].ms / g_rows[i].ms);
        }
        return failed ? 1 : 0;
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
                /* window, softcap, sinks: the case, then its features */
                auto feat = [&](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, bool causal, int64_t left,
                                int64_t right, float cap, bool sinks, float scale) {
                    shape c{b, hq, hkv, sq, sk, d, causal, bf, 0, sched};
                    c.win_left = left;
                    c.win_right = right;
                    c.softcap = cap;
                    c.sinks = sinks;
                    c.scale = scale;
                    cases.push_back(c);
                };
                if (small) {
                    add(2, 4, 1, 129, 131, true, 0);
                    add(2, 4, 2, 130, 127, false, 0);
                    feat(2, 4, 2, 200, 300, false, 70, 9, 2.f, true, 0.5f);
                    continue;
                }
                feat(2, 4, 4, 1003, 1003, true, 100, -1, 0, false, 0);   /* causal window under a block */
                feat(2, 4, 4, 300, 517, false, 0, 0, 0, false, 0);      /* left = right = 0: the diagonal */
                feat(2, 8, 2, 1003, 1003, false, 37, 5, 0, false, 0);   /* GQA 4, both sides */
                feat(2, 4, 4, 517, 300, false, -1, 64, 0, false, 0);    /* Sq > Sk, right side only */
                feat(2, 4, 4, 129, 1003, false, 200, -1, 0, false, 0);  /* left side only: first rows heaviest */
                feat(2, 4, 4, 1003, 17, false, 10, 10, 0, false, 0);    /* most rows see no key */
                feat(2, 4, 4, 300, 300, false, 5000, 5000, 0, false, 0); /* bounds past the sequence */
                feat(2, 4, 4, 517, 517, true, -1, -1, 5.f, false, 1.5f); /* softcap with scores past the cap */
                feat(2, 8, 8, 1003, 17, true, -1, -1, 0, true, 0);      /* sinks; rows with no key give the sink */
                feat(2, 16, 2, 257, 385, true, 150, 20, 3.f, true, 0.4f); /* all together, GQA 8 */
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
