/*
 * plan.c: the capability gate, the kernel choice and the split heuristic.
 *
 * One function, fmha_plan_make, answers both "can this backend run the
 * problem?" (the gate, item by item, with reasons) and "with which kernel,
 * tiles and split count?".  explain() shows its answer, the backends run it.
 * Pure C: no allocation, no device calls, no reads behind the params'
 * pointers (per-batch key lengths are not known here, so the plan uses the
 * capacity seqlen_k as the upper bound unless the glue tells it the longest
 * length through seqlen_k).
 */
#include "fmha.h"
#include "fmha_config.h"

#include <float.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char *dtype_name(fmha_dtype dt)
{
    switch (dt) {
    case FMHA_DTYPE_F16: return "float16";
    case FMHA_DTYPE_BF16: return "bfloat16";
    case FMHA_DTYPE_F32: return "float32";
    }
    return "unknown";
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void gate_add(fmha_plan *plan, const char *name, int met, const char *fmt, ...)
{
    if (plan->n_gate >= FMHA_GATE_MAX)
        return;
    fmha_gate_item *item = &plan->gate[plan->n_gate++];
    item->name = name;
    item->met = met;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item->why, sizeof item->why, fmt, ap);
    va_end(ap);
    if (!met)
        plan->supported = 0;
}

int64_t fmha_num_key_blocks(const fmha_fwd_params *p, int block_n)
{
    int64_t keys = p->seqlen_k + (p->seqlens_k ? p->seqlen_new : 0);
    int64_t n = ceil_div(keys, block_n);
    return n > 0 ? n : 1;
}

/* Rows one tile covers: query rows, times the query heads of a kv head when packed. */
static int64_t tile_rows(const fmha_fwd_params *p, int pack_gqa)
{
    return pack_gqa ? p->seqlen_q * (p->heads_q / p->heads_kv) : p->seqlen_q;
}

/*
 * Where CTAs run, for the split model: `units` SMs (or CPU threads) holding
 * up to `per_unit` CTAs each; a CTA sharing its unit with r - 1 others takes
 * 1 + share_cost * (r - 1) times as long as alone.
 */
typedef struct machine {
    int64_t units, per_unit;
    double share_cost;
    double split_tie; /* a plan with more splits than the best must model below this fraction of it */
} machine;

static int64_t machine_slots(const machine *m) { return m->units * m->per_unit; }

/* Modelled time of `ctas` equal CTAs of `blocks` key blocks' work each. */
static double model_time(const machine *m, int64_t ctas, int64_t blocks)
{
    int64_t resident = ceil_div(ctas, m->units);
    resident = resident < m->per_unit ? resident : m->per_unit;
    return (double)ceil_div(ctas, machine_slots(m)) * (double)(blocks + FMHA_SPLIT_OVERHEAD_BLOCKS) *
           (1.0 + m->share_cost * (double)(resident > 1 ? resident - 1 : 0));
}

/*
 * Modelled time of `pieces` (tile, split) pieces of `blocks` key blocks each
 * when `ws` streams share every piece (block j to stream j % ws) and a CTA
 * runs `streams` streams: ceil(pieces * ws / streams) CTAs whose streams
 * each walk ceil(blocks / ws) blocks (plus `extra`, e.g. writing partials).
 */
static double model_streams(const machine *m, int64_t pieces, int64_t blocks, int64_t extra, int ws,
                            int streams)
{
    return model_time(m, ceil_div(pieces * ws, streams), ceil_div(blocks, ws) + extra);
}

/* Whether a plan of `splits` splits modelled at `cost` replaces the best so far: a
 * cheaper one does, unless it has more splits and is within m->split_tie of it. */
static int plan_beats(const machine *m, double cost, int64_t splits, double best_cost, int64_t best_splits)
{
    return cost < best_cost * (splits > best_splits ? m->split_tie : 1.0);
}

/* Share of the machine busy over the waves that `work` tiles take on `slots`. */
static double wave_efficiency(int64_t work, int64_t slots)
{
    double waves = (double)work / (double)slots;
    return waves / (double)ceil_div(work, slots);
}

/*
 * Split count s for `tiles` equal tiles of `key_blocks` key blocks each, and
 * how many of a CTA's `streams` streams share each split (*ws; 1 when the
 * CTA has one stream).  Time is modelled (model_streams) as
 *
 *   waves(tiles * s * ws / streams) * (ceil(key_blocks / s / ws) + FMHA_SPLIT_OVERHEAD_BLOCKS
 *                                      + partial_cost if s > 1)
 *
 * times the slow-down of CTAs that share an SM (each CTA pays a pipeline fill
 * and an epilogue worth a few key blocks, a split CTA also writes fp32
 * partials that the combine reads back, and the last wave of a ragged grid
 * leaves SMs idle).  A split plan must beat the best unsplit one by
 * FMHA_SPLIT_MIN_GAIN (the model leaves out the partials' traffic and the
 * combine); a plan with more splits than the best so far must also model
 * below m->split_tie times its time (memory-bound decode tiles: a near tie
 * goes to fewer partials and a smaller combine); among equals the most
 * streams per split and then the fewest splits win.
 * The constants were fit with benchmarks/sweep_splits.py.
 */
static int choose_splits(int64_t tiles, const machine *m, int streams, int64_t key_blocks,
                         int64_t partial_cost, int *ws_out, char *why, size_t why_len)
{
    int64_t limit = key_blocks / FMHA_MIN_BLOCKS_PER_SPLIT;
    limit = limit < FMHA_MAX_HEURISTIC_SPLITS ? limit : FMHA_MAX_HEURISTIC_SPLITS;
    limit = limit > 1 ? limit : 1;

    int chosen = 1, chosen_ws = 1;
    double best_cost = DBL_MAX;
    for (int ws = streams; ws >= 1; ws /= 2)
        for (int64_t s = 1; s <= limit; s++) {
            if (ws > 1 && ceil_div(key_blocks, s) < ws)
                break; /* a stream with no block */
            double cost = model_streams(m, tiles * s, ceil_div(key_blocks, s), s > 1 ? partial_cost : 0,
                                        ws, streams);
            if (s > 1)
                cost /= FMHA_SPLIT_MIN_GAIN;
            if (plan_beats(m, cost, s, best_cost, chosen)) {
                best_cost = cost;
                chosen = (int)s;
                chosen_ws = ws;
            }
        }
    *ws_out = chosen_ws;
    const int64_t slots = machine_slots(m), ctas = ceil_div(tiles * chosen * chosen_ws, streams);
    snprintf(why, why_len, "%lld tiles x %lld key blocks on %lld slots: %d split%s of ~%lld "
             "key blocks, %d stream%s each, in %lld wave%s (machine %.0f%% busy)", (long long)tiles,
             (long long)key_blocks, (long long)slots, chosen, chosen > 1 ? "s" : "",
             (long long)ceil_div(key_blocks, chosen), chosen_ws, chosen_ws > 1 ? "s" : "",
             (long long)ceil_div(ctas, slots), ceil_div(ctas, slots) > 1 ? "s" : "",
             100.0 * wave_efficiency(ctas, slots));
    return chosen;
}

/* Key blocks' worth of time a split CTA spends on its fp32 partials (written,
 * then read by the combine): block_m rows of fp32 against block_n rows of K
 * and V in 16 bits, about 2 * block_m / block_n. */
static int64_t split_partial_cost(int block_m, int block_n)
{
    return ceil_div(2 * (int64_t)block_m, block_n);
}

/*
 * The split count: the caller's, clamped to the key blocks there are, or the
 * heuristic's.  A forced count runs each split on one stream (*ws = 1), so a
 * row's result does not depend on the rest of the batch (DESIGN.md).
 */
static int plan_splits(int requested, int64_t tiles, const machine *m, int streams,
                       int64_t key_blocks, int block_m, int block_n, int *ws, char *why,
                       size_t why_len)
{
    if (requested > 0) {
        snprintf(why, why_len, "num_splits=%d forced (clamped to %lld key blocks)", requested,
                 (long long)key_blocks);
        *ws = 1;
        return requested > key_blocks ? (int)key_blocks : requested;
    }
    return choose_splits(tiles, m, streams, key_blocks, split_partial_cost(block_m, block_n), ws,
                         why, why_len);
}

static void plan_cpu(const fmha_fwd_params *p, const fmha_target *t, int requested,
                     fmha_plan *plan)
{
    plan->backend = FMHA_BACKEND_CPU;
    gate_add(plan, "dtype", 1, "%s runs on the CPU (fp32 math)", dtype_name(p->dtype));
    int hd_ok = p->head_dim >= 1 && p->head_dim <= FMHA_CPU_MAX_HEAD_DIM;
    gate_add(plan, "head_dim", hd_ok, "head_dim %lld %s 1..%d", (long long)p->head_dim,
             hd_ok ? "in" : "outside", FMHA_CPU_MAX_HEAD_DIM);
    plan->kernel_id = FMHA_KERNEL_CPU_TILED;
    plan->block_m = FMHA_CPU_BLOCK_M;
    plan->block_n = FMHA_CPU_BLOCK_N;
    /* The CPU tiles always interleave the query heads of a kv head into rows. */
    plan->pack_gqa = p->heads_q > p->heads_kv;
    snprintf(plan->kernel, sizeof plan->kernel, "cpu_tiled<%s,%s>", dtype_name(p->dtype),
             fmha_cpu_simd_name());

    int64_t key_blocks = fmha_num_key_blocks(p, plan->block_n);
    int threads = t->num_threads > 0 ? t->num_threads : 1;
    char why[224];
    int64_t tiles = p->batch * p->heads_kv * ceil_div(tile_rows(p, 1), plan->block_m);
    const machine cpu = {threads, 1, 0.0, 1.0};
    plan->num_splits = plan_splits(requested, tiles, &cpu, 1, key_blocks, plan->block_m,
                                   plan->block_n, &plan->stream_splits, why, sizeof why);
    snprintf(plan->reason, sizeof plan->reason, "CPU: %dx%d tiles on %d threads; %s",
             plan->block_m, plan->block_n, threads, why);
}

/* A row of the GPU tile tables. */
typedef struct gpu_tiles {
    int block_m, block_n, warps, stages, streams;
} gpu_tiles;

/* The GPU kernels are instantiated for the head_dims of these tables; the
 * row index also indexes fmha_device_info.ctas_per_sm. */
static int gpu_mma_config(int64_t head_dim, gpu_tiles *t, int *row)
{
    int r = 0;
#define FMHA_MATCH(hd, bm, bn, w, st, ctas, str) \
    if (head_dim == (hd)) { *t = (gpu_tiles){bm, bn, w, st, str}; *row = r; return 1; } r++; (void)(ctas);
    FMHA_GPU_MMA_CONFIGS(FMHA_MATCH)
#undef FMHA_MATCH
    return 0;
}

/* The decode tiles for head_dim (every head_dim of the prefill table has a row). */
static int gpu_decode_config(int64_t head_dim, gpu_tiles *t)
{
#define FMHA_MATCH(hd, bm, bn, w, st, ctas, str) \
    if (head_dim == (hd)) { *t = (gpu_tiles){bm, bn, w, st, str}; return 1; }
    FMHA_GPU_DECODE_CONFIGS(FMHA_MATCH)
#undef FMHA_MATCH
    return 0;
}

static void gpu_head_dims(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
#define FMHA_LIST(hd, bm, bn, warps, stages, ctas, streams) \
    used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%d", used ? ", " : "", hd);
    FMHA_GPU_MMA_CONFIGS(FMHA_LIST)
#undef FMHA_LIST
}

int fmha_rows_aligned(const void *data, int64_t batch_stride, int64_t row_stride,
                      int64_t head_stride, int64_t head_dim, int64_t align_elems, int64_t elem_bytes)
{
    if (!data)
        return 1; /* not placed yet (explain, outputs still to allocate): allocated aligned */
    return (uintptr_t)data % (uintptr_t)(align_elems * elem_bytes) == 0 &&
           batch_stride % align_elems == 0 && row_stride % align_elems == 0 &&
           head_stride % align_elems == 0 && head_dim % align_elems == 0;
}

/*
 * The GPU kernels copy q/k/v rows in 16-byte chunks (cp.async) and store out
 * in pairs of elements; gpu.c stages tensors that are not aligned so into
 * aligned copies.  Whether that happens is worth showing in explain().
 */
static int gpu_rows_aligned(const fmha_fwd_params *p)
{
    const int64_t chunk = 8, pair = 2, elem = 2; /* 16 bytes, 4 bytes of 16-bit elements */
    int ok = fmha_rows_aligned(p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride,
                               p->head_dim, chunk, elem) &&
             fmha_rows_aligned(p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride,
                               p->head_dim, chunk, elem) &&
             fmha_rows_aligned(p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride,
                               p->head_dim, chunk, elem) &&
             fmha_rows_aligned(p->out, p->o_batch_stride, p->o_row_stride, p->o_head_stride,
                               p->head_dim, pair, elem);
    if (p->k_new)
        ok = ok && fmha_rows_aligned(p->k_new, p->knew_batch_stride, p->knew_row_stride,
                                     p->knew_head_stride, p->head_dim, chunk, elem) &&
             fmha_rows_aligned(p->v_new, p->vnew_batch_stride, p->vnew_row_stride,
                               p->vnew_head_stride, p->head_dim, chunk, elem);
    return ok;
}

/*
 * A ragged batch (per-entry key lengths): cutting every entry into the same
 * number of splits lets the longest entry's pieces set the time.  Instead all
 * entries are cut into chunks of the same size, c key blocks, so an entry of
 * n blocks has ceil(n / c) non-empty splits; c is chosen with the same time
 * model as choose_splits, on the batch's total key blocks.  Only for the
 * heuristic: with a forced num_splits a row's result must not depend on the
 * other batch entries, and the chunk size would.
 */
static void plan_ragged(const fmha_fwd_params *p, int64_t tiles_per_entry, const machine *m,
                        int64_t max_blocks, const gpu_tiles *t, fmha_plan *plan, char *why,
                        size_t why_len)
{
    const int64_t total_blocks = ceil_div(p->total_keys, t->block_n);
    const int64_t partial = split_partial_cost(t->block_m, t->block_n);
    int64_t limit = max_blocks / FMHA_MIN_BLOCKS_PER_SPLIT;
    limit = limit < FMHA_MAX_HEURISTIC_SPLITS ? limit : FMHA_MAX_HEURISTIC_SPLITS;
    int64_t best_s = 1;
    int best_ws = 1;
    double best_cost = DBL_MAX;
    for (int ws = t->streams; ws >= 1; ws /= 2)
        for (int64_t s = 1; s <= (limit > 1 ? limit : 1); s++) {
            const int64_t chunk = ceil_div(max_blocks, s);
            if (ws > 1 && chunk < ws)
                break;
            /* each entry's last chunk is on average half full */
            const int64_t pieces = tiles_per_entry * (ceil_div(total_blocks, chunk) + p->batch / 2);
            const double cost = model_streams(m, pieces, chunk, s > 1 ? partial : 0, ws, t->streams);
            if (plan_beats(m, cost, s, best_cost, best_s)) {
                best_cost = cost;
                best_s = s;
                best_ws = ws;
            }
        }
    const int64_t chunk = ceil_div(max_blocks, best_s);
    plan->num_splits = (int)best_s;
    plan->split_blocks = best_s > 1 ? (int)chunk : 0;
    plan->stream_splits = best_ws;
    snprintf(why, why_len, "ragged batch, %lld key blocks in all, longest %lld: chunks of %lld "
             "key blocks on %d stream%s, up to %lld per entry", (long long)total_blocks,
             (long long)max_blocks, (long long)chunk, best_ws, best_ws > 1 ? "s" : "", (long long)best_s);
}

/* Resident CTAs per SM of the tensor-core kernel: measured by the runtime
 * (registers and shared memory) when known, else as its shared memory allows. */
static int gpu_ctas_per_sm(const fmha_device_info *dev, int kernel, int row, int64_t head_dim,
                           const gpu_tiles *t)
{
    if (row < FMHA_GPU_MAX_CONFIGS && dev->ctas_per_sm[kernel - 1][row] > 0)
        return dev->ctas_per_sm[kernel - 1][row];
    /* Per stream: Q tile + `stages` K and V tiles, 2-byte elements. */
    int64_t smem = (int64_t)t->streams * (t->block_m + 2 * t->stages * t->block_n) * head_dim * 2;
    int64_t per_sm = dev->max_smem_per_sm > 0 ? dev->max_smem_per_sm : dev->max_smem_per_block;
    int ctas = smem > 0 ? (int)(per_sm / smem) : 1;
    return ctas < 1 ? 1 : ctas;
}

#ifndef FMHA_HIP_ARCHS_BUILT
#define FMHA_HIP_ARCHS_BUILT "" /* not a HIP build: no AMD code objects */
#endif

/*
 * Launching without a code object would make the HIP runtime abort, so both
 * the gate here and the launcher (kernels/runtime.hip) ask this first.
 */
static int arch_in_list(const char *arch, const char *list)
{
    size_t len = strcspn(arch, ":");
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ";");
        if (n == len && strncmp(p, arch, len) == 0)
            return 1;
        p += n + (p[n] == ';');
    }
    return 0;
}

int fmha_hip_arch_built(const char *arch) { return arch_in_list(arch, FMHA_HIP_ARCHS_BUILT); }

static void plan_gpu(const fmha_fwd_params *p, const fmha_target *t, int requested,
                     fmha_plan *plan)
{
    const fmha_device_info *dev = t->device;
    plan->backend = FMHA_BACKEND_GPU;

    if (!t->gpu_compiled)
        gate_add(plan, "device", 0, "this build has no GPU kernels (built with CPU only)");
    else if (!dev)
        gate_add(plan, "device", 0, "no GPU is visible to the runtime");
    else
        gate_add(plan, "device", 1, "%s (%s, %d SMs)", dev->name, dev->arch, dev->sm_count);

    if (dev && !dev->is_amd) {
        int ok = dev->cc_major >= 8;
        gate_add(plan, "arch", ok, "compute capability %d.%d %s 8.0 (mma.sync m16n8k16, cp.async)",
                 dev->cc_major, dev->cc_minor, ok ? ">=" : "<");
    } else if (dev) {
        const char *built = t->hip_archs_built ? t->hip_archs_built : FMHA_HIP_ARCHS_BUILT;
        int ok = arch_in_list(dev->arch, built);
        gate_add(plan, "arch", ok, "%s %s the archs built (%s)", dev->arch,
                 ok ? "is among" : "is not among", built);
    }

    int dt_ok = p->dtype == FMHA_DTYPE_F16 || p->dtype == FMHA_DTYPE_BF16;
    gate_add(plan, "dtype", dt_ok, "%s %s (GPU kernels: float16, bfloat16)",
             dtype_name(p->dtype), dt_ok ? "supported" : "not supported");

    gpu_tiles tiles_mma = {0, 0, 0, 0, 1};
    int config_row = 0;
    int hd_ok = gpu_mma_config(p->head_dim, &tiles_mma, &config_row);
    char dims[64];
    gpu_head_dims(dims, sizeof dims);
    gate_add(plan, "head_dim", hd_ok, "head_dim %lld %s {%s}", (long long)p->head_dim,
             hd_ok ? "in" : "not in", dims);

    int aligned = gpu_rows_aligned(p);
    gate_add(plan, "alignment", 1, aligned
             ? "q/k/v rows start on 16-byte boundaries, out rows on 4-byte boundaries"
             : "some rows are not 16-byte aligned (pointer or strides not multiples of 8 "
               "elements): those tensors are first copied to aligned scratch on the GPU");

    if (!plan->supported) {
        snprintf(plan->reason, sizeof plan->reason,
                 "the GPU kernels do not cover this problem (see gate); GPU kernels support "
                 "float16/bfloat16 with head_dim in {%s} on %s; device=\"cpu\" runs it", dims,
                 dev && dev->is_amd ? "AMD " FMHA_HIP_ARCHS_BUILT : "sm_80 or newer");
        return;
    }

    /*
     * Few query rows per kv head (decode, speculative decoding): pack the query
     * heads sharing a kv head into one tile so each K/V byte is read once.
     */
    int64_t group = p->heads_q / p->heads_kv;
    gpu_tiles tiles = tiles_mma;
    const int64_t packed_rows = p->seqlen_q * group;
    int kernel = packed_rows <= FMHA_GPU_DECODE_MAX_ROWS && gpu_decode_config(p->head_dim, &tiles)
                     ? FMHA_KERNEL_GPU_DECODE
                     : FMHA_KERNEL_GPU_MMA;
    plan->kernel_id = kernel;
    plan->pack_gqa = group > 1 && p->seqlen_q * group <= tiles.block_m;
    plan->block_m = tiles.block_m;
    plan->block_n = tiles.block_n;
    const int lengths_known = p->seqlens_k && p->total_keys > 0; /* host cache_seqlens */
    if (kernel == FMHA_KERNEL_GPU_DECODE && !dev->is_amd && dev->l2_bytes > 0) {
        /* K and V bytes the tiles read: the real lengths when known, else the capacity */
        double keys = lengths_known ? (double)p->total_keys : (double)p->batch * (double)p->seqlen_k;
        double kv_bytes = keys * (double)p->heads_kv * (double)p->head_dim * 2.0 /* K, V */ * 2.0 /* bytes */;
        plan->kv_read_once = kv_bytes <= FMHA_GPU_READ_ONCE_L2 * (double)dev->l2_bytes;
    }

    int64_t key_blocks = fmha_num_key_blocks(p, tiles.block_n);
    int64_t row_tiles = ceil_div(tile_rows(p, plan->pack_gqa), tiles.block_m);
    int64_t n_tiles = p->batch * (plan->pack_gqa ? p->heads_kv : p->heads_q) * row_tiles;
    const machine gpu = {dev->sm_count, gpu_ctas_per_sm(dev, kernel, config_row, p->head_dim, &tiles),
                         kernel == FMHA_KERNEL_GPU_MMA ? FMHA_GPU_MMA_SHARE_COST : 0.0,
                         kernel == FMHA_KERNEL_GPU_DECODE ? FMHA_GPU_DECODE_SPLIT_TIE : 1.0};
    char why[224];
    if (requested == 0 && lengths_known && p->batch > 1)
        plan_ragged(p, n_tiles / p->batch, &gpu, key_blocks, &tiles, plan, why, sizeof why);
    else
        plan->num_splits = plan_splits(requested, n_tiles, &gpu, tiles.streams, key_blocks,
                                       tiles.block_m, tiles.block_n, &plan->stream_splits, why,
                                       sizeof why);
    snprintf(plan->kernel, sizeof plan->kernel, "fwd_%s<%s,d%lld%s%s>%s%s",
             kernel == FMHA_KERNEL_GPU_DECODE ? "decode" : "mma",
             dtype_name(p->dtype), (long long)p->head_dim, p->causal ? ",causal" : "",
             plan->pack_gqa ? ",pack_gqa" : "", plan->stream_splits > 1 ? "+merge" : "",
             plan->num_splits > 1 ? "+combine" : "");
    snprintf(plan->reason, sizeof plan->reason, "%s tensor-core tiles %dx%d%s; %s%s",
             kernel == FMHA_KERNEL_GPU_DECODE ? "decode (few rows per kv head)" : "prefill",
             tiles.block_m, tiles.block_n, plan->pack_gqa ? ", query heads of a kv head packed" : "", why,
             plan->kv_read_once ? "; K/V small next to L2: read with evict-first" : "");
}

fmha_status fmha_plan_make(const fmha_fwd_params *p, const fmha_target *t, int requested_splits,
                           fmha_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->supported = 1;
    plan->num_splits = 1;
    plan->stream_splits = 1;
    if (t->backend == FMHA_BACKEND_CPU)
        plan_cpu(p, t, requested_splits, plan);
    else
        plan_gpu(p, t, requested_splits, plan);
    return plan->supported ? FMHA_OK : FMHA_ERR_UNSUPPORTED;
}

void fmha_plan_apply(const fmha_plan *plan, fmha_fwd_params *p)
{
    p->split_blocks = plan->split_blocks;
    p->stream_splits = plan->stream_splits > 0 ? plan->stream_splits : 1;
    p->kv_read_once = plan->kv_read_once;
    p->num_splits = plan->num_splits;
    p->block_m = plan->block_m;
    p->block_n = plan->block_n;
    p->pack_gqa = plan->pack_gqa;
    p->kernel = plan->kernel_id;
}
