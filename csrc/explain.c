/*
 * explain.c: every sentence about a plan, and the explain() dict.
 *
 * Owns the explain() dict, the NotImplementedError text of an unsupported
 * problem, and the private hook _plan_for_device.  Nothing here decides
 * anything: the planner's numbers are read and put into words.
 */
#include "explain.h"
#include "fmha_config.h"

#include <stdio.h>
#include <string.h>

int fmha_dict_set(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

static const char *dtype_name(int64_t dt)
{
    switch (dt) {
    case FMHA_DTYPE_F16: return "float16";
    case FMHA_DTYPE_BF16: return "bfloat16";
    case FMHA_DTYPE_F32: return "float32";
    case FMHA_DTYPE_E4M3: return "float8_e4m3fn";
    }
    return "unknown";
}

static const char *const gate_names[FMHA_GATE_COUNT] = {"device", "arch", "dtype", "head_dim",
                                                        "alignment", "features"};

/* "window, softcap and sinks" for the FMHA_FEATURE_* bits in f ("none" for 0). */
static void feature_names(int64_t f, char *buf, size_t len)
{
    static const char *const names[] = {"window", "softcap", "sinks"};
    const char *picked[3];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (f & (1 << i))
            picked[n++] = names[i];
    if (n == 0)
        snprintf(buf, len, "none");
    else if (n == 1)
        snprintf(buf, len, "%s", picked[0]);
    else if (n == 2)
        snprintf(buf, len, "%s and %s", picked[0], picked[1]);
    else
        snprintf(buf, len, "%s, %s and %s", picked[0], picked[1], picked[2]);
}

static const char *plural(int64_t n) { return n == 1 ? "" : "s"; }

/* Why the sm90 kernel does not take p (e.g. "it does not read KV caches"); 0 and ""
 * where it is not in question (decode, not a Hopper GPU). */
static int sm90_why_text(const fmha_fwd_params *p, fmha_sm90_why reason, const fmha_target *t,
                         char *why, size_t len)
{
    switch (reason) {
    case FMHA_SM90_NOT_BUILT:
        snprintf(why, len, "this build has no sm_90a code (FMHA_CUDA_ARCHS=\"%s\")",
                 fmha_plan_cuda_archs(t));
        break;
    case FMHA_SM90_ASKED_MMA:
        snprintf(why, len, "FMHA_GPU_PREFILL_KERNEL=mma");
        break;
    case FMHA_SM90_HEAD_DIM:
        snprintf(why, len, "it has no head_dim %lld tiles", (long long)p->head_dim);
        break;
    case FMHA_SM90_KV_CACHE:
        snprintf(why, len, "it does not read KV caches");
        break;
    case FMHA_SM90_PAGED:
        snprintf(why, len, "it does not read paged KV caches (block_table)");
        break;
    case FMHA_SM90_FORCED_SPLITS:
        snprintf(why, len, "it writes no split partials for the forced num_splits");
        break;
    case FMHA_SM90_UNALIGNED:
        snprintf(why, len, "its TMA loads need q/k/v/out addresses and strides in 16-byte "
                 "multiples");
        break;
    case FMHA_SM90_SCALE:
        snprintf(why, len, "it needs a positive finite softmax_scale");
        break;
    case FMHA_SM90_GRID:
        snprintf(why, len, "batch and heads_q must be at most 65535 on its grid");
        break;
    case FMHA_SM90_PACKED:
        snprintf(why, len, "the query heads of a kv head fit one tile here, so K/V are read "
                 "once for all of them");
        break;
    case FMHA_SM90_SPLITS:
        snprintf(why, len, "on its tiles, one CTA per SM, the split rule splits the keys, "
                 "which it cannot");
        break;
    case FMHA_SM90_KV_FP8:
        snprintf(why, len, "it does not read float8_e4m3fn K/V; the tensor-core tiles widen "
                 "the codes in shared memory");
        break;
    case FMHA_SM90_OUT_DTYPE:
        snprintf(why, len, "out_dtype %s needs fp32 partials and the combine, which it "
                 "does not write", dtype_name(p->out_dtype));
        break;
    default:
        why[0] = '\0';
        return 0;
    }
    return 1;
}

/* Why the tensor-core prefill tiles run instead of the sm90 kernel, as " (...)";
 * "" where the sm90 kernel is not in question. */
static void sm90_not_used(const fmha_fwd_params *p, const fmha_plan *plan, const fmha_target *t,
                          char *buf, size_t len)
{
    char why[160];
    if (sm90_why_text(p, plan->sm90_why, t, why, sizeof why))
        snprintf(buf, len, " (not fwd_sm90: %s)", why);
    else
        buf[0] = '\0';
}

/* "64, 128, 256 (Hopper prefill only)": the head_dims the GPU kernels are built for
 * (fmha_config.h), those of the sm90 kernel alone marked. */
static void gpu_head_dims(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
#define FMHA_LIST(hd, bm, bn, warps, stages, ctas, walkers) \
    used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%d", used ? ", " : "", hd);
    FMHA_GPU_MMA_CONFIGS(FMHA_LIST)
#undef FMHA_LIST
#define FMHA_LIST(hd, bm, bn, warps, stages, ctas, walkers)                                              \
    if (fmha_plan_sm90_only_head_dim(hd))                                                                \
        used += (size_t)snprintf(buf + used, used < len ? len - used : 0, ", %d (Hopper prefill only)", hd);
    FMHA_GPU_SM90_CONFIGS(FMHA_LIST)
#undef FMHA_LIST
}

/* "only the Hopper prefill kernel has head_dim 256 tiles, and it does not read KV caches":
 * why a head_dim of the sm90 kernel alone is refused (gate item b, fmha_sm90_why). */
static void sm90_only_refusal(const fmha_fwd_params *p, const fmha_target *t, const fmha_gate_item *g,
                              char *buf, size_t len)
{
    const int n = snprintf(buf, len, "only the Hopper prefill kernel has head_dim %lld tiles, and ",
                           (long long)g->a);
    if (n < 0 || (size_t)n >= len)
        return;
    if (!sm90_why_text(p, (fmha_sm90_why)g->b, t, buf + n, len - (size_t)n))
        snprintf(buf + n, len - (size_t)n, "it runs on NVIDIA compute capability 9.x only");
}

/* What a gate item checked and found (the explain() gate's "why"). */
static void gate_why(const fmha_fwd_params *p, const fmha_plan *plan, const fmha_target *t,
                     const fmha_gate_item *g,
                     char *buf, size_t len)
{
    const fmha_device_info *dev = t->device;
    char dims[96];
    switch (g->id) {
    case FMHA_GATE_DEVICE:
        if (g->b == FMHA_DEVICE_NOT_BUILT)
            snprintf(buf, len, "this build has no GPU kernels (built with CPU only)");
        else if (g->b == FMHA_DEVICE_NONE_VISIBLE || !dev)
            snprintf(buf, len, "no GPU is visible to the runtime");
        else
            snprintf(buf, len, "%.160s (%.48s, %lld %s)", dev->name, dev->arch, (long long)g->a,
                     dev->is_amd ? "CUs" : "SMs");
        return;
    case FMHA_GATE_ARCH:
        if (dev && dev->is_amd)
            snprintf(buf, len, "%s %s the archs built (%s)", dev->arch,
                     g->met ? "is among" : "is not among", fmha_plan_hip_archs(t));
        else
            snprintf(buf, len, "compute capability %lld.%lld %s 8.0 (mma.sync m16n8k16, cp.async)",
                     (long long)g->a, (long long)g->b, g->met ? ">=" : "<");
        return;
    case FMHA_GATE_DTYPE:
        if (plan->backend == FMHA_BACKEND_CPU && g->b == FMHA_DTYPE_E4M3)
            snprintf(buf, len, "%s runs on the CPU (fp32 math; the float8_e4m3fn K/V are "
                     "dequantized to fp32)", dtype_name(g->a));
        else if (plan->backend == FMHA_BACKEND_CPU)
            snprintf(buf, len, "%s runs on the CPU (fp32 math)", dtype_name(g->a));
        else if (g->b == FMHA_DTYPE_E4M3)
            snprintf(buf, len, "%s with float8_e4m3fn K/V %s (GPU kernels: float16, bfloat16 q "
                     "with K/V of q's dtype or float8_e4m3fn)", dtype_name(g->a),
                     g->met ? "supported" : "not supported");
        else
            snprintf(buf, len, "%s %s (GPU kernels: float16, bfloat16)", dtype_name(g->a),
                     g->met ? "supported" : "not supported");
        return;
    case FMHA_GATE_HEAD_DIM:
        if (plan->backend == FMHA_BACKEND_CPU) {
            snprintf(buf, len, "head_dim %lld %s 1..%lld", (long long)g->a,
                     g->met ? "in" : "outside", (long long)g->b);
        } else {
            gpu_head_dims(dims, sizeof dims);
            if (g->met || g->b == FMHA_SM90_CHOSEN)
                snprintf(buf, len, "head_dim %lld %s {%s}", (long long)g->a, g->met ? "in" : "not in",
                         dims);
            else
                sm90_only_refusal(p, t, g, buf, len);
        }
        return;
    case FMHA_GATE_ALIGNMENT:
        if (!g->b) {
            snprintf(buf, len, "float8_e4m3fn k/v rows must start on 16-byte boundaries (pointer "
                     "and strides multiples of 16 elements) on the GPU: make them contiguous");
            return;
        }
        snprintf(buf, len, "%s", g->a ? "q/k/v rows start on 16-byte boundaries, out rows on 4-byte "
                                        "boundaries"
                                      : "some rows are not 16-byte aligned (pointer or strides not "
                                        "multiples of 8 elements): those tensors are first copied "
                                        "to aligned scratch on the GPU");
        return;
    case FMHA_GATE_FEATURES:
        feature_names(g->a, dims, sizeof dims);
        if (!g->a)
            snprintf(buf, len, "no window, softcap or sinks asked for");
        else if (g->met)
            snprintf(buf, len, "%s asked for: every GPU kernel runs %s", dims,
                     (g->a & (g->a - 1)) ? "them" : "it");
        else
            snprintf(buf, len, "%s asked for: the GPU kernels do not have %s", dims,
                     (g->a & (g->a - 1)) ? "them" : "it");
        return;
    default:
        snprintf(buf, len, "?");
    }
}

/* An unmet gate item as the requirement it breaks, e.g. "head_dim 96 is not
 * supported by the GPU kernels (they cover 64, 128)". */
static void requirement(const fmha_fwd_params *p, const fmha_plan *plan, const fmha_target *t,
                        const fmha_gate_item *g,
                        char *buf, size_t len)
{
    const fmha_device_info *dev = t->device;
    char dims[96];
    switch (g->id) {
    case FMHA_GATE_ARCH:
        if (dev && dev->is_amd)
            snprintf(buf, len, "%s is not supported: this build has AMD kernels for %s", dev->arch,
                     *fmha_plan_hip_archs(t) ? fmha_plan_hip_archs(t) : "no arch");
        else
            snprintf(buf, len, "compute capability %lld.%lld is not supported by the GPU kernels "
                     "(they need 8.0 or newer: mma.sync m16n8k16, cp.async)", (long long)g->a,
                     (long long)g->b);
        return;
    case FMHA_GATE_DTYPE:
        if (g->b == FMHA_DTYPE_E4M3)
            snprintf(buf, len, "%s q with a float8_e4m3fn KV cache is not supported by the GPU "
                     "kernels (they cover float16, bfloat16 q; the CPU backend runs it)",
                     dtype_name(g->a));
        else
            snprintf(buf, len, "%s is not supported by the GPU kernels (they cover float16, "
                     "bfloat16)", dtype_name(g->a));
        return;
    case FMHA_GATE_ALIGNMENT:
        snprintf(buf, len, "float8_e4m3fn k/v rows that do not start on 16-byte boundaries are "
                 "not supported by the GPU kernels (pointer and strides must be multiples of 16 "
                 "elements: make k and v contiguous)");
        return;
    case FMHA_GATE_HEAD_DIM:
        if (plan->backend == FMHA_BACKEND_CPU) {
            snprintf(buf, len, "head_dim %lld is not supported by the CPU backend (it covers 1..%lld)",
                     (long long)g->a, (long long)g->b);
        } else {
            gpu_head_dims(dims, sizeof dims);
            if (g->b == FMHA_SM90_CHOSEN) {
                snprintf(buf, len, "head_dim %lld is not supported by the GPU kernels (they cover %s)",
                         (long long)g->a, dims);
            } else {
                const int n = snprintf(buf, len, "head_dim %lld is not supported by the GPU kernels here: ",
                                       (long long)g->a);
                if (n >= 0 && (size_t)n < len)
                    sm90_only_refusal(p, t, g, buf + n, len - (size_t)n);
            }
        }
        return;
    case FMHA_GATE_FEATURES:
        feature_names(g->a, dims, sizeof dims);
        snprintf(buf, len, "%s %s not supported by the GPU kernels yet", dims,
                 (g->a & (g->a - 1)) ? "are" : "is");
        return;
    default:
        gate_why(p, plan, t, g, buf, len);
    }
}

/* The unmet requirements, "; "-separated. */
static void requirements(const fmha_fwd_params *p, const fmha_plan *plan, const fmha_target *t, char *buf,
                         size_t len)
{
    size_t used = 0;
    char one[256];
    buf[0] = '\0';
    for (int i = 0; i < plan->n_gate && used < len; i++) {
        if (plan->gate[i].met)
            continue;
        requirement(p, plan, t, &plan->gate[i], one, sizeof one);
        used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? "; " : "", one);
    }
}

/* "name: met/NOT met (why); ..." for messages. */
static void gate_text(const fmha_fwd_params *p, const fmha_plan *plan, const fmha_target *t, char *buf,
                      size_t len)
{
    size_t used = 0;
    char why[256];
    buf[0] = '\0';
    for (int i = 0; i < plan->n_gate && used < len; i++) {
        gate_why(p, plan, t, &plan->gate[i], why, sizeof why);
        used += (size_t)snprintf(buf + used, len - used, "%s%s: %s (%s)", i ? "; " : "",
                                 gate_names[plan->gate[i].id], plan->gate[i].met ? "met" : "NOT met",
                                 why);
    }
}

static PyObject *gate_dict(const fmha_fwd_params *p, const fmha_plan *plan, const fmha_target *t)
{
    PyObject *gate = PyDict_New(), *item = NULL;
    char why[256];
    if (!gate)
        return NULL;
    for (int i = 0; i < plan->n_gate; i++) {
        gate_why(p, plan, t, &plan->gate[i], why, sizeof why);
        item = PyDict_New();
        if (!item || fmha_dict_set(item, "met", PyBool_FromLong(plan->gate[i].met)) < 0 ||
            fmha_dict_set(item, "why", PyUnicode_FromString(why)) < 0 ||
            PyDict_SetItemString(gate, gate_names[plan->gate[i].id], item) < 0)
            goto fail;
        Py_CLEAR(item);
    }
    return gate;
fail:
    Py_XDECREF(item);
    Py_DECREF(gate);
    return NULL;
}

/* The mask kind and the features in a kernel's name: ",causal", or ",window" (a window
 * bounding some side) then ",softcap" and ",sinks" as asked (fwd_mma.h and fwd_sm90.h
 * run the features in their window kind). */
static void mask_text(const fmha_fwd_params *p, char *buf, size_t len)
{
    const int f = fmha_features(p);
    snprintf(buf, len, "%s%s%s", (f & FMHA_FEATURE_WINDOW) ? ",window" : p->causal ? ",causal" : "",
             (f & FMHA_FEATURE_SOFTCAP) ? ",softcap" : "", (f & FMHA_FEATURE_SINKS) ? ",sinks" : "");
}

/* The kernel's name, e.g. "fwd_decode<bfloat16,d128,pack_gqa>+merge+combine" or
 * "fwd_sm90<bfloat16,d128,causal,pingpong>"; "" unsupported. */
static void kernel_name(const fmha_fwd_params *p, const fmha_plan *plan, char *buf, size_t len)
{
    char mask[48];
    mask_text(p, mask, sizeof mask);
    if (!plan->supported)
        snprintf(buf, len, "%s", "");
    else if (plan->backend == FMHA_BACKEND_CPU)
        snprintf(buf, len, "cpu_tiled<%s,%s>", dtype_name(p->dtype), fmha_cpu_kernel_name(p));
    else if (plan->kernel_id == FMHA_KERNEL_GPU_SM90)
        snprintf(buf, len, "fwd_sm90<%s,d%lld%s,%s>", dtype_name(p->dtype), (long long)p->head_dim,
                 mask, plan->schedule == FMHA_SM90_PINGPONG ? "pingpong" : "interleaved");
    else
        snprintf(buf, len, "fwd_%s<%s,d%lld%s%s%s>%s%s",
                 plan->kernel_id == FMHA_KERNEL_GPU_DECODE ? "decode" : "mma", dtype_name(p->dtype),
                 (long long)p->head_dim, fmha_kv_dtype(p) == FMHA_DTYPE_E4M3 ? ",kv=float8_e4m3fn" : "",
                 mask, plan->pack_gqa ? ",pack_gqa" : "", plan->walkers_per_split > 1 ? "+merge" : "",
                 plan->partials ? "+combine" : "");
}

/* Why this split count. */
static void split_text(const fmha_plan *plan, char *buf, size_t len)
{
    const fmha_split_why *w = &plan->split;
    const int s = plan->num_splits, ws = plan->walkers_per_split;
    char walkers[32];
    switch (w->rule) {
    case FMHA_SPLITS_FORCED:
        snprintf(buf, len, "num_splits=%d forced (clamped to %lld key blocks)", w->requested,
                 (long long)w->key_blocks);
        return;
    case FMHA_SPLITS_ONE_PASS:
        snprintf(buf, len, "one pass over %lld key blocks (this kernel writes no split partials)",
                 (long long)w->key_blocks);
        return;
    case FMHA_SPLITS_RAGGED:
        if (!w->total_blocks) {
            /* lengths on the device (plan.c: plan_unseen_lengths) */
            snprintf(buf, len, "lengths not read on the host, up to %lld key blocks: chunks of %lld "
                     "key blocks on %d walker%s, up to %d per entry, so short entries leave the "
                     "SMs to long ones (the plan host lengths would get at the capacity)",
                     (long long)w->key_blocks, (long long)w->chunk, ws, plural(ws), s);
            return;
        }
        snprintf(buf, len, "ragged batch, %lld key blocks in all, longest %lld: chunks of %lld key "
                 "blocks on %d walker%s, up to %d per entry", (long long)w->total_blocks,
                 (long long)w->key_blocks, (long long)w->chunk, ws, plural(ws), s);
        return;
    case FMHA_SPLITS_DEVICE:
        /* lengths on the device, chunks sized there (plan.c: plan_unseen_lengths) */
        snprintf(buf, len, "lengths not read on the host, up to %lld key blocks: the kernels size "
                 "the chunks from the lengths they find, about %lld pieces per tile over the batch "
                 "of at least %d key blocks (%lld at full length), on %d walker%s, up to %d per "
                 "entry, on a grid of only the pieces those lengths need, so short entries leave "
                 "the SMs to long ones (at the capacity: the chunks host lengths would get)",
                 (long long)w->key_blocks, (long long)w->pieces, w->min_chunk, (long long)w->chunk, ws,
                 plural(ws), s);
        return;
    case FMHA_SPLITS_HEURISTIC:
        snprintf(walkers, sizeof walkers, ", %d walker%s each", ws, plural(ws));
        snprintf(buf, len, "%lld tiles x %lld key blocks on %lld slots: %d split%s of ~%lld key "
                 "blocks%s, in %lld wave%s (machine %.0f%% busy)", (long long)w->tiles,
                 (long long)w->key_blocks, (long long)w->slots, s, plural(s),
                 (long long)((w->key_blocks + s - 1) / s),
                 plan->backend == FMHA_BACKEND_GPU ? walkers : "", (long long)w->waves,
                 plural(w->waves), 100.0 * w->busy);
        return;
    }
    snprintf(buf, len, "?");
}

/* The numbers behind the split count, for tools (benchmarks read tiles and slots). */
static PyObject *split_dict(const fmha_plan *plan)
{
    static const char *const rules[] = {"forced", "heuristic", "ragged", "device", "one_pass"};
    const fmha_split_why *w = &plan->split;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (fmha_dict_set(d, "rule", PyUnicode_FromString(rules[w->rule])) < 0 ||
        fmha_dict_set(d, "tiles", PyLong_FromLongLong(w->tiles)) < 0 ||
        fmha_dict_set(d, "key_blocks", PyLong_FromLongLong(w->key_blocks)) < 0 ||
        (w->all_key_blocks > 0 &&
         fmha_dict_set(d, "all_key_blocks", PyLong_FromLongLong(w->all_key_blocks)) < 0) ||
        fmha_dict_set(d, "units", PyLong_FromLongLong(w->units)) < 0 ||
        fmha_dict_set(d, "slots", PyLong_FromLongLong(w->slots)) < 0 ||
        (w->rule == FMHA_SPLITS_HEURISTIC &&
         (fmha_dict_set(d, "waves", PyLong_FromLongLong(w->waves)) < 0 ||
          fmha_dict_set(d, "busy", PyFloat_FromDouble(w->busy)) < 0)) ||
        (w->rule == FMHA_SPLITS_RAGGED &&
         (fmha_dict_set(d, "total_blocks", PyLong_FromLongLong(w->total_blocks)) < 0 ||
          fmha_dict_set(d, "chunk", PyLong_FromLongLong(w->chunk)) < 0)) ||
        (w->rule == FMHA_SPLITS_DEVICE &&
         (fmha_dict_set(d, "total_blocks", PyLong_FromLongLong(0)) < 0 ||
          fmha_dict_set(d, "chunk", PyLong_FromLongLong(w->chunk)) < 0 ||
          fmha_dict_set(d, "pieces", PyLong_FromLongLong(w->pieces)) < 0 ||
          fmha_dict_set(d, "min_chunk", PyLong_FromLongLong(w->min_chunk)) < 0))) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}


/* Why this kernel, tiles and split count (or what the problem needs that is missing). */
static void plan_reason(const fmha_fwd_params *p, const fmha_plan *plan, const fmha_target *t,
                        char *buf, size_t len)
{
    char why[512], not_sm90[224];
    if (!plan->supported) {
        requirements(p, plan, t, buf, len);
        return;
    }
    split_text(plan, why, sizeof why);
    char window[200] = "";
    const fmha_split_why *w = &plan->split;
    if (w->all_key_blocks > w->key_blocks)
        snprintf(window, sizeof window, "; the window leaves a tile at most %lld of %lld key "
                 "blocks (it skips at least %lld; splits count the visible ones)",
                 (long long)w->key_blocks, (long long)w->all_key_blocks,
                 (long long)(w->all_key_blocks - w->key_blocks));
    if (plan->backend == FMHA_BACKEND_CPU) {
        snprintf(buf, len, "CPU: %dx%d tiles on %lld threads; %s%s", plan->block_m, plan->block_n,
                 (long long)plan->split.units, why, window);
    } else if (plan->kernel_id == FMHA_KERNEL_GPU_SM90) {
        snprintf(buf, len, "Hopper prefill%s: warp-specialized TMA + wgmma tiles %dx%d (a producer "
                 "warp, %d consumer warp groups %s), one CTA per SM; %s%s",
                 t->prefill == FMHA_PREFILL_SM90 ? " (FMHA_GPU_PREFILL_KERNEL=sm90)" : "",
                 plan->block_m, plan->block_n, plan->block_m / 64,
                 plan->schedule == FMHA_SM90_PINGPONG ? "in ping-pong" : "interleaved", why, window);
    } else {
        sm90_not_used(p, plan, t, not_sm90, sizeof not_sm90);
        char widen[160] = "";
        if (p->out_dtype != p->dtype)
            snprintf(widen, sizeof widen, "; out_dtype %s: the producers write fp32 partials and "
                     "the combine writes out in %s, even with one split",
                     dtype_name(p->out_dtype), dtype_name(p->out_dtype));
        char features[96] = "";
        if (fmha_features(p)) {
            feature_names(fmha_features(p), features, sizeof features);
            snprintf(features + strlen(features), sizeof features - strlen(features), " in them");
        }
        char parts[160] = "";
        const int o_parts = FMHA_GPU_O_PARTS(p->head_dim);
        if (o_parts > 1)
            snprintf(parts, sizeof parts, ", O in %d column parts of %lld (each part's tile computes "
                     "S over all %lld features)", o_parts, (long long)(p->head_dim / o_parts),
                     (long long)p->head_dim);
        snprintf(buf, len, "%s tensor-core tiles %dx%d%s%s%s%s%s; %s%s%s%s",
                 plan->kernel_id == FMHA_KERNEL_GPU_DECODE ? "decode (few rows per kv head)" : "prefill",
                 plan->block_m, plan->block_n, plan->pack_gqa ? ", query heads of a kv head packed" : "",
                 parts, features[0] ? ", " : "", features, not_sm90, why, window,
                 plan->kv_read_once ? "; K/V small next to L2: read with evict-first" : "", widen);
    }
}

PyObject *fmha_explain_raise_unsupported(const fmha_explain_input *in)
{
    const fmha_plan *plan = in->plan;
    const int gpu = plan->backend == FMHA_BACKEND_GPU;
    char need[768], gate[1024];
    requirements(in->p, plan, in->target, need, sizeof need);
    gate_text(in->p, plan, in->target, gate, sizeof gate);
    const char *hint = !gpu ? ""
                       : in->inputs_on_host ? "; device=\"cpu\" runs it"
                                            : "; the CPU backend runs it: pass host arrays with "
                                              "device=\"cpu\"";
    PyErr_Format(PyExc_NotImplementedError, "%s%s. %s gate: %s.", need, hint, gpu ? "GPU" : "CPU",
                 gate);
    return NULL;
}

static const char *len_source_name(fmha_len_source s)
{
    switch (s) {
    case FMHA_LEN_GIVEN: return "given";
    case FMHA_LEN_COMPUTED: return "computed";
    case FMHA_LEN_TOTAL: return "total";
    case FMHA_LEN_DENSE: break;
    }
    return "dense";
}

/* How the longest packed sequence was found, e.g. "the longest 7 (computed
 * from cu_seqlens_q)". */
static void longest_text(const char *which, int64_t longest, fmha_len_source s, char *buf,
                         size_t len)
{
    switch (s) {
    case FMHA_LEN_GIVEN:
        snprintf(buf, len, "the longest %lld (max_seqlen_%s)", (long long)longest, which);
        return;
    case FMHA_LEN_COMPUTED:
        snprintf(buf, len, "the longest %lld (computed from cu_seqlens_%s)", (long long)longest,
                 which);
        return;
    default:
        snprintf(buf, len, "the longest assumed = total_%s = %lld (cu_seqlens_%s on the device "
                 "is not read on the host; max_seqlen_%s narrows the grid)", which,
                 (long long)longest, which, which);
        return;
    }
}

/* The paged and packed parts of a call, as sentences appended to reason. */
static void serving_text(const fmha_explain_serving *sv, char *buf, size_t len)
{
    size_t used = 0;
    char longest[192];
    buf[0] = '\0';
    if (sv->paged)
        used += (size_t)snprintf(buf, len, "; paged KV cache: %lld page%s of %lld keys, up to "
                                 "%lld per sequence (capacity %lld keys)",
                                 (long long)sv->num_pages, plural(sv->num_pages),
                                 (long long)sv->page_size, (long long)sv->max_blocks,
                                 (long long)(sv->max_blocks * sv->page_size));
    if (sv->varlen_q && used < len) {
        longest_text("q", sv->max_seqlen_q, sv->q_source, longest, sizeof longest);
        used += (size_t)snprintf(buf + used, len - used, "; packed queries: %lld rows, %s",
                                 (long long)sv->total_q, longest);
    }
    if (sv->varlen_k && used < len) {
        longest_text("k", sv->max_seqlen_k, sv->k_source, longest, sizeof longest);
        snprintf(buf + used, len - used, "; packed keys: %lld rows, %s", (long long)sv->total_k,
                 longest);
    }
}

/* The serving fields of the explain() dict. */
static int serving_dict(PyObject *d, const fmha_explain_serving *sv)
{
    if (fmha_dict_set(d, "paged", PyBool_FromLong(sv->paged)) < 0 ||
        fmha_dict_set(d, "varlen", PyBool_FromLong(sv->varlen_q)) < 0)
        return -1;
    if (sv->paged &&
        (fmha_dict_set(d, "page_size", PyLong_FromLongLong(sv->page_size)) < 0 ||
         fmha_dict_set(d, "num_pages", PyLong_FromLongLong(sv->num_pages)) < 0 ||
         fmha_dict_set(d, "max_blocks_per_seq", PyLong_FromLongLong(sv->max_blocks)) < 0))
        return -1;
    if (sv->varlen_q &&
        (fmha_dict_set(d, "total_q", PyLong_FromLongLong(sv->total_q)) < 0 ||
         fmha_dict_set(d, "max_seqlen_q", PyLong_FromLongLong(sv->max_seqlen_q)) < 0 ||
         fmha_dict_set(d, "max_seqlen_q_source",
                       PyUnicode_FromString(len_source_name(sv->q_source))) < 0 ||
         fmha_dict_set(d, "packed_kv", PyBool_FromLong(sv->varlen_k)) < 0))
        return -1;
    if (sv->varlen_k &&
        (fmha_dict_set(d, "total_k", PyLong_FromLongLong(sv->total_k)) < 0 ||
         fmha_dict_set(d, "max_seqlen_k", PyLong_FromLongLong(sv->max_seqlen_k)) < 0 ||
         fmha_dict_set(d, "max_seqlen_k_source",
                       PyUnicode_FromString(len_source_name(sv->k_source))) < 0))
        return -1;
    return 0;
}

/* window ((left, right) with causal's right bound applied, or None), softcap, sinks. */
static int features_dict(PyObject *d, const fmha_fwd_params *p)
{
    const int windowed = fmha_features(p) & FMHA_FEATURE_WINDOW;
    PyObject *window = windowed ? Py_BuildValue("(LL)", (long long)p->window_left,
                                                (long long)fmha_window_right(p))
                                : (Py_INCREF(Py_None), Py_None);
    if (fmha_dict_set(d, "window", window) < 0 ||
        fmha_dict_set(d, "softcap", PyFloat_FromDouble(p->softcap)) < 0 ||
        fmha_dict_set(d, "sinks", PyBool_FromLong(p->sinks != NULL)) < 0)
        return -1;
    return 0;
}

/* explain()'s words for an fmha_scale_kind. */
static const char *scale_kind_name(fmha_scale_kind kind)
{
    switch (kind) {
    case FMHA_SCALE_NONE: break;
    case FMHA_SCALE_TENSOR: return "per-tensor";
    case FMHA_SCALE_HEAD: return "per-kv-head";
    case FMHA_SCALE_BATCH_HEAD: return "per-sequence-and-kv-head";
    }
    return "none";
}

/* The KV cache's element type and, for fp8, the granularity of k_scale / v_scale. */
static int kv_dtype_dict(PyObject *d, const fmha_explain_input *in)
{
    const fmha_fwd_params *p = in->p;
    const int fp8 = fmha_kv_dtype(p) == FMHA_DTYPE_E4M3;
    if (fmha_dict_set(d, "kv_dtype", PyUnicode_FromString(dtype_name(fmha_kv_dtype(p)))) < 0 ||
        fmha_dict_set(d, "k_scale", PyUnicode_FromString(scale_kind_name(
                                        fp8 ? in->k_scale_kind : FMHA_SCALE_NONE))) < 0 ||
        fmha_dict_set(d, "v_scale", PyUnicode_FromString(scale_kind_name(
                                        fp8 ? in->v_scale_kind : FMHA_SCALE_NONE))) < 0)
        return -1;
    return 0;
}

/* "; K/V float8_e4m3fn (...)" for the reason of an fp8 KV cache, else "". */
static void kv_dtype_text(const fmha_explain_input *in, char *buf, size_t len)
{
    buf[0] = '\0';
    if (fmha_kv_dtype(in->p) != FMHA_DTYPE_E4M3)
        return;
    const fmha_scale_kind kinds[2] = {in->k_scale_kind, in->v_scale_kind};
    const char *words[2];
    for (int i = 0; i < 2; i++)
        words[i] = kinds[i] == FMHA_SCALE_NONE ? "not given (1.0)" : scale_kind_name(kinds[i]);
    snprintf(buf, len, "; K/V float8_e4m3fn, k_scale %s, v_scale %s (K's factor folded into "
             "the softmax scale, V's into the output; appended rows quantized on write)",
             words[0], words[1]);
}

PyObject *fmha_explain_dict(const fmha_explain_input *in)
{
    const fmha_fwd_params *p = in->p;
    const fmha_plan *plan = in->plan;
    const fmha_target *t = in->target;
    const int gpu = t->backend == FMHA_BACKEND_GPU;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    char kernel[160], reason[2400], own[768], rejected[768], serving[640];
    if (in->empty) {
        snprintf(kernel, sizeof kernel, "none");
        snprintf(reason, sizeof reason, "empty problem (batch or %s is 0): nothing runs",
                 in->serving.varlen_q ? "total_q" : "seqlen_q");
    } else {
        kernel_name(p, plan, kernel, sizeof kernel);
        plan_reason(p, plan, t, own, sizeof own);
        if (in->gpu_rejected) {
            plan_reason(p, in->gpu_rejected, in->gpu_rejected_target, rejected, sizeof rejected);
            snprintf(reason, sizeof reason, "the GPU gate is not met (%s); running on the CPU: %s",
                     rejected, own);
        } else {
            snprintf(reason, sizeof reason, "%s", own);
        }
        if (in->length_independent) {
            size_t used = strlen(reason);
            snprintf(reason + used, sizeof reason - used, "; length-independent plan: "
                     "cache_seqlens on the device are not read on the host, so the plan is "
                     "made for %lld keys per sequence (%s) and the kernels stop at each "
                     "sequence's length", (long long)in->planned_keys,
                     in->planned_keys == p->seqlen_k ? "the cache capacity" : "max_seqlen_k");
        }
        serving_text(&in->serving, serving, sizeof serving);
        size_t used = strlen(reason);
        snprintf(reason + used, sizeof reason - used, "%s", serving);
        kv_dtype_text(in, serving, sizeof serving);
        used = strlen(reason);
        snprintf(reason + used, sizeof reason - used, "%s", serving);
    }
    if (fmha_dict_set(d, "backend", PyUnicode_FromString(gpu ? "gpu" : "cpu")) < 0 ||
        fmha_dict_set(d, "supported", PyBool_FromLong(in->empty || plan->supported)) < 0 ||
        fmha_dict_set(d, "kernel", PyUnicode_FromString(kernel)) < 0 ||
        fmha_dict_set(d, "kernel_id", PyLong_FromLong(in->empty ? 0 : plan->kernel_id)) < 0 ||
        fmha_dict_set(d, "num_splits", PyLong_FromLong(in->empty ? 1 : plan->num_splits)) < 0 ||
        fmha_dict_set(d, "requested_splits", PyLong_FromLong(in->requested_splits)) < 0 ||
        fmha_dict_set(d, "walkers_per_split",
                      PyLong_FromLong(in->empty ? 1 : plan->walkers_per_split)) < 0 ||
        fmha_dict_set(d, "kv_read_once", PyBool_FromLong(!in->empty && plan->kv_read_once)) < 0 ||
        fmha_dict_set(d, "block_m", PyLong_FromLong(in->empty ? 0 : plan->block_m)) < 0 ||
        fmha_dict_set(d, "block_n", PyLong_FromLong(in->empty ? 0 : plan->block_n)) < 0 ||
        fmha_dict_set(d, "pack_gqa", PyBool_FromLong(!in->empty && plan->pack_gqa)) < 0 ||
        fmha_dict_set(d, "reason", PyUnicode_FromString(reason)) < 0 ||
        fmha_dict_set(d, "gate", in->empty ? PyDict_New() : gate_dict(p, plan, t)) < 0 ||
        fmha_dict_set(d, "batch", PyLong_FromLongLong(p->batch)) < 0 ||
        fmha_dict_set(d, "seqlen_q", PyLong_FromLongLong(p->seqlen_q)) < 0 ||
        fmha_dict_set(d, "seqlen_k", PyLong_FromLongLong(p->seqlen_k)) < 0 ||
        fmha_dict_set(d, "heads_q", PyLong_FromLongLong(p->heads_q)) < 0 ||
        fmha_dict_set(d, "heads_kv", PyLong_FromLongLong(p->heads_kv)) < 0 ||
        fmha_dict_set(d, "head_dim", PyLong_FromLongLong(p->head_dim)) < 0 ||
        fmha_dict_set(d, "dtype", PyUnicode_FromString(dtype_name(p->dtype))) < 0 ||
        fmha_dict_set(d, "out_dtype", PyUnicode_FromString(dtype_name(p->out_dtype))) < 0 ||
        fmha_dict_set(d, "partials", PyBool_FromLong(!in->empty && plan->partials)) < 0 ||
        fmha_dict_set(d, "causal", PyBool_FromLong(p->causal)) < 0 ||
        fmha_dict_set(d, "softmax_scale", PyFloat_FromDouble(p->softmax_scale)) < 0 ||
        fmha_dict_set(d, "kv_cache", PyBool_FromLong(in->kv_cache)) < 0 ||
        fmha_dict_set(d, "seqlen_new", PyLong_FromLongLong(p->seqlen_new)) < 0 ||
        fmha_dict_set(d, "length_independent", PyBool_FromLong(in->length_independent)) < 0 ||
        serving_dict(d, &in->serving) < 0 || features_dict(d, p) < 0 ||
        kv_dtype_dict(d, in) < 0)
        goto fail;
    if (gpu && t->device) {
        if (fmha_dict_set(d, "device", PyUnicode_FromString(t->device->name)) < 0 ||
            fmha_dict_set(d, "device_ordinal", PyLong_FromLong(in->device_ordinal)) < 0 ||
            fmha_dict_set(d, "arch", PyUnicode_FromString(t->device->arch)) < 0 ||
            fmha_dict_set(d, "sm_count", PyLong_FromLong(t->device->sm_count)) < 0 ||
            fmha_dict_set(d, "inputs_on_host", PyBool_FromLong(in->inputs_on_host)) < 0)
            goto fail;
    } else {
        if (fmha_dict_set(d, "device", PyUnicode_FromString("cpu")) < 0 ||
            fmha_dict_set(d, "cpu_threads", PyLong_FromLong(t->num_threads)) < 0 ||
            fmha_dict_set(d, "cpu_simd", PyUnicode_FromString(fmha_cpu_simd_name())) < 0)
            goto fail;
    }
    if (!in->empty && plan->supported && fmha_dict_set(d, "split", split_dict(plan)) < 0)
        goto fail;
    if (in->gpu_rejected &&
        fmha_dict_set(d, "gpu_rejected",
                      Py_BuildValue("{s:s,s:s,s:N}", "kernel", "", "reason", rejected, "gate",
                                    gate_dict(in->p, in->gpu_rejected, in->gpu_rejected_target))) < 0)
        goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* ---- _plan_for_device: the planner on a described GPU ---- */

/* d[key] as an int64 in [lo, hi]; `dflt` when absent (required when dflt < lo). */
static int get_int(PyObject *d, const char *what, const char *key, int64_t lo, int64_t hi,
                   int64_t dflt, int64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (!v) {
        if (dflt < lo) {
            PyErr_Format(PyExc_ValueError, "%s needs the key '%s'", what, key);
            return -1;
        }
        *out = dflt;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "%s['%s'] must be in %lld..%lld, got %lld", what, key,
                     (long long)lo, (long long)hi, x);
        return -1;
    }
    *out = x;
    return 0;
}

/* problem[key], a list of `batch` ints in [0, hi]: their maximum and sum. */
static int length_list(PyObject *list, const char *key, int64_t batch, int64_t hi, int64_t *longest,
                       int64_t *total)
{
    char msg[64];
    snprintf(msg, sizeof msg, "problem['%s'] must be a list of int", key);
    PyObject *seq = PySequence_Fast(list, msg);
    if (!seq)
        return -1;
    if (PySequence_Fast_GET_SIZE(seq) != batch) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "problem['%s'] needs batch=%lld entries", key, (long long)batch);
        return -1;
    }
    *longest = *total = 0;
    for (Py_ssize_t i = 0; i < batch; i++) {
        long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((x == -1 && PyErr_Occurred()) || x < 0 || x > hi) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "problem['%s'] entries must be in 0..%lld", key,
                             (long long)hi);
            return -1;
        }
        *longest = x > *longest ? x : *longest;
        *total += x;
    }
    Py_DECREF(seq);
    return 0;
}

/* d[key] as a string copied into buf; `dflt` when absent. */
static int get_str(PyObject *d, const char *key, const char *dflt, char *buf, size_t len)
{
    PyObject *v = PyDict_GetItemString(d, key);
    const char *s = dflt;
    if (v) {
        s = PyUnicode_AsUTF8(v);
        if (!s)
            return -1;
    }
    snprintf(buf, len, "%s", s);
    return 0;
}

/* device["ctas_per_sm"][kind] -> info->ctas_per_sm[kernel - 1][row] */
static int get_ctas(PyObject *dev, fmha_device_info *info)
{
    PyObject *ctas = PyDict_GetItemString(dev, "ctas_per_sm");
    if (!ctas)
        return 0;
    if (!PyDict_Check(ctas)) {
        PyErr_SetString(PyExc_TypeError, "device['ctas_per_sm'] must be a dict");
        return -1;
    }
    static const char *const kinds[FMHA_GPU_KERNELS] = {"prefill", "decode"};
    for (int k = 0; k < FMHA_GPU_KERNELS; k++) {
        PyObject *rows = PyDict_GetItemString(ctas, kinds[k]);
        if (!rows)
            continue;
        PyObject *seq = PySequence_Fast(rows, "device['ctas_per_sm'] values must be lists");
        if (!seq)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t r = 0; r < n && r < FMHA_GPU_MAX_CONFIGS; r++) {
            long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, r));
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            info->ctas_per_sm[k][r] = x > 0 && x < 1024 ? (int)x : 0;
        }
        Py_DECREF(seq);
    }
    return 0;
}

/* device["archs_built"] (list of str) joined by ';' into buf. */
static int get_archs(PyObject *dev, char *buf, size_t len, int *given)
{
    PyObject *archs = PyDict_GetItemString(dev, "archs_built");
    *given = archs != NULL;
    buf[0] = '\0';
    if (!archs)
        return 0;
    PyObject *seq = PySequence_Fast(archs, "device['archs_built'] must be a list of str");
    if (!seq)
        return -1;
    size_t used = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!s) {
            Py_DECREF(seq);
            return -1;
        }
        used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%s", i ? ";" : "", s);
    }
    Py_DECREF(seq);
    return 0;
}

static int dtype_from_name(const char *name, fmha_dtype *dt)
{
    static const struct { const char *name; fmha_dtype dt; } names[] = {
        {"float16", FMHA_DTYPE_F16}, {"bfloat16", FMHA_DTYPE_BF16}, {"float32", FMHA_DTYPE_F32}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *dt = names[i].dt;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "problem['dtype'] must be float16, bfloat16 or float32, got %s",
                 name);
    return -1;
}

PyObject *fmha_explain_plan_for_device(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"problem", "device", "num_splits", "prefill_kernel", NULL};
    PyObject *prob, *dev;
    int num_splits = 0;
    const char *prefill = "auto";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!|is:_plan_for_device", kwlist, &PyDict_Type,
                                     &prob, &PyDict_Type, &dev, &num_splits, &prefill))
        return NULL;
    if (num_splits < 0 || num_splits > FMHA_MAX_SPLITS)
        return PyErr_Format(PyExc_ValueError, "num_splits must be in 0..%d, got %d",
                            FMHA_MAX_SPLITS, num_splits);
    fmha_prefill_choice choice = FMHA_PREFILL_AUTO;
    if (strcmp(prefill, "mma") == 0)
        choice = FMHA_PREFILL_MMA;
    else if (strcmp(prefill, "sm90") == 0)
        choice = FMHA_PREFILL_SM90;
    else if (strcmp(prefill, "auto") != 0)
        return PyErr_Format(PyExc_ValueError, "prefill_kernel must be 'auto', 'mma' or 'sm90', "
                            "got '%s'", prefill);

    const int64_t big = (int64_t)1 << 40;
    fmha_fwd_params p;
    memset(&p, 0, sizeof p);
    int64_t causal = 0, misaligned = 0, softcap = 0, sinks = 0;
    char dtype[32], out_dtype[32];
    p.window_left = p.window_right = -1;
    if (get_int(prob, "problem", "batch", 1, big, -1, &p.batch) < 0 ||
        get_int(prob, "problem", "seqlen_q", 1, big, -1, &p.seqlen_q) < 0 ||
        get_int(prob, "problem", "seqlen_k", 0, big, -1, &p.seqlen_k) < 0 ||
        get_int(prob, "problem", "heads_q", 1, 1 << 20, -1, &p.heads_q) < 0 ||
        get_int(prob, "problem", "heads_kv", 1, 1 << 20, p.heads_q, &p.heads_kv) < 0 ||
        get_int(prob, "problem", "head_dim", 1, 1 << 20, -1, &p.head_dim) < 0 ||
        get_int(prob, "problem", "causal", 0, 1, 0, &causal) < 0 ||
        get_int(prob, "problem", "misaligned", 0, 1, 0, &misaligned) < 0 ||
        get_int(prob, "problem", "seqlen_new", 0, big, 0, &p.seqlen_new) < 0 ||
        get_int(prob, "problem", "window_left", -1, big, -1, &p.window_left) < 0 ||
        get_int(prob, "problem", "window_right", -1, big, -1, &p.window_right) < 0 ||
        get_int(prob, "problem", "softcap", 0, 1 << 20, 0, &softcap) < 0 ||
        get_int(prob, "problem", "sinks", 0, 1, 0, &sinks) < 0 ||
        get_str(prob, "dtype", "float16", dtype, sizeof dtype) < 0 || dtype_from_name(dtype, &p.dtype) < 0 ||
        get_str(prob, "out_dtype", dtype, out_dtype, sizeof out_dtype) < 0 ||
        dtype_from_name(out_dtype, &p.out_dtype) < 0)
        return NULL;
    if (p.out_dtype != p.dtype && p.out_dtype != FMHA_DTYPE_F32)
        return PyErr_Format(PyExc_ValueError, "problem['out_dtype'] must be the dtype "
                            "(%s) or float32, got %s", dtype, out_dtype);
    /* kv_dtype: "float8_e4m3fn" plans an fp8 KV cache; absent, k/v have dtype. */
    char kv_dtype[32];
    if (get_str(prob, "kv_dtype", dtype, kv_dtype, sizeof kv_dtype) < 0)
        return NULL;
    if (strcmp(kv_dtype, "float8_e4m3fn") == 0)
        p.kv_dtype = FMHA_DTYPE_E4M3;
    else if (strcmp(kv_dtype, dtype) != 0)
        return PyErr_Format(PyExc_ValueError, "problem['kv_dtype'] must be float8_e4m3fn or "
                            "problem['dtype'], got %s", kv_dtype);
    if (p.heads_q % p.heads_kv != 0)
        return PyErr_Format(PyExc_ValueError, "heads_q (%lld) must be a multiple of heads_kv (%lld)",
                            (long long)p.heads_q, (long long)p.heads_kv);
    p.causal = (int)causal;
    p.softcap = (float)softcap;
    static const float sink_present = 0.0f; /* the planner reads only whether sinks are set */
    p.sinks = sinks ? &sink_present : NULL;
    p.softmax_scale = 1.0f;
    p.scale_log2 = 1.4426950408889634f; /* softmax_scale * log2(e), as the host glue fills it */
    if (misaligned)
        p.q = (const void *)(uintptr_t)2; /* a q that starts 2 bytes past a 16-byte boundary */
    static const int32_t present = 0;  /* the planner reads only whether seqlens_k is set */
    PyObject *lens = PyDict_GetItemString(prob, "cache_seqlens");
    int64_t device_lengths = 0;
    if (get_int(prob, "problem", "device_lengths", 0, 1, 0, &device_lengths) < 0)
        return NULL;
    if (device_lengths && lens)
        return PyErr_Format(PyExc_ValueError, "problem['device_lengths'] describes cache_seqlens "
                            "on the device: give it without cache_seqlens");
    if (device_lengths) {
        /* as the glue plans device lengths: present, not read; seqlen_k is the capacity
         * (or max_seqlen_k) and the total is not known */
        p.seqlens_k = &present;
        if (p.seqlen_new > p.seqlen_k)
            return PyErr_Format(PyExc_ValueError, "problem['seqlen_new'] must be at most seqlen_k");
        p.seqlen_k -= p.seqlen_new;
    } else if (lens) {
        int64_t longest = 0, total = 0;
        if (length_list(lens, "cache_seqlens", p.batch, p.seqlen_k - p.seqlen_new, &longest,
                        &total) < 0)
            return NULL;
        total += p.batch * p.seqlen_new;
        p.seqlens_k = &present;
        p.seqlen_k = longest; /* as the binding layer plans: the longest length */
        p.total_keys = total;
    } else if (p.seqlen_new && !device_lengths) {
        return PyErr_Format(PyExc_ValueError, "problem['seqlen_new'] needs cache_seqlens");
    }
    /* Serving modes: only their presence reaches the planner (plus, for packed
     * keys given as lengths, the longest and the sum, as the glue passes them). */
    int64_t paged = 0, varlen = 0;
    if (get_int(prob, "problem", "paged", 0, 1, 0, &paged) < 0 ||
        get_int(prob, "problem", "varlen", 0, 1, 0, &varlen) < 0)
        return NULL;
    fmha_explain_serving serving;
    memset(&serving, 0, sizeof serving);
    if (paged) {
        if (p.seqlen_k % 16 != 0)
            return PyErr_Format(PyExc_ValueError, "problem['paged'] plans pages of 16 keys: "
                                "seqlen_k (the capacity) must be a multiple of 16");
        p.block_table = &present;
        p.page_size = 16;
        serving.paged = 1;
        serving.page_size = 16;
        serving.max_blocks = p.seqlen_k / 16;
        serving.num_pages = p.batch * serving.max_blocks;
        p.num_pages = serving.num_pages;
    }
    PyObject *klens = PyDict_GetItemString(prob, "seqlens_k");
    if (klens && (!varlen || lens || paged))
        return PyErr_Format(PyExc_ValueError, "problem['seqlens_k'] (packed key lengths) needs "
                            "varlen and no cache_seqlens or paged");
    if (varlen) {
        p.cu_seqlens_q = &present;
        p.total_q = p.batch * p.seqlen_q;
        serving.varlen_q = 1;
        serving.total_q = p.total_q;
        serving.max_seqlen_q = p.seqlen_q;
        serving.q_source = FMHA_LEN_GIVEN;
    }
    if (klens) {
        int64_t longest = 0, total = 0;
        if (length_list(klens, "seqlens_k", p.batch, big, &longest, &total) < 0)
            return NULL;
        p.cu_seqlens_k = &present;
        p.seqlen_k = longest;
        p.total_k = total;
        p.total_keys = total;
        serving.varlen_k = 1;
        serving.total_k = total;
        serving.max_seqlen_k = longest;
        serving.k_source = FMHA_LEN_COMPUTED;
    }

    fmha_device_info info;
    memset(&info, 0, sizeof info);
    int64_t is_amd = 0, cc_major = 0, cc_minor = 0, l2 = 0;
    int64_t sm = 0, warp = 0, smem_block = 0, smem_sm = 0;
    char archs[256];
    int archs_given = 0;
    PyObject *cc = PyDict_GetItemString(dev, "cc");
    if (cc && !PyArg_ParseTuple(cc, "LL;device['cc'] must be (major, minor)", &cc_major, &cc_minor))
        return NULL;
    if (get_int(dev, "device", "is_amd", 0, 1, 0, &is_amd) < 0 ||
        get_int(dev, "device", "sm_count", 1, 1 << 20, -1, &sm) < 0 ||
        get_int(dev, "device", "warp_size", 1, 1024, is_amd ? 64 : 32, &warp) < 0 ||
        get_int(dev, "device", "l2_bytes", 0, big, 0, &l2) < 0 ||
        get_int(dev, "device", "max_smem_per_block", 0, 1 << 30, 0, &smem_block) < 0 ||
        get_int(dev, "device", "max_smem_per_sm", 0, 1 << 30, 0, &smem_sm) < 0 ||
        get_str(dev, "name", "described GPU", info.name, sizeof info.name) < 0 ||
        get_str(dev, "arch", "", info.arch, sizeof info.arch) < 0 || get_ctas(dev, &info) < 0 ||
        get_archs(dev, archs, sizeof archs, &archs_given) < 0)
        return NULL;
    info.is_amd = (int)is_amd;
    info.cc_major = (int)cc_major;
    info.cc_minor = (int)cc_minor;
    info.sm_count = (int)sm;
    info.warp_size = (int)warp;
    info.l2_bytes = l2;
    info.max_smem_per_block = (int)smem_block;
    info.max_smem_per_sm = (int)smem_sm;

    fmha_target target;
    memset(&target, 0, sizeof target);
    target.backend = FMHA_BACKEND_GPU;
    target.device = &info;
    target.gpu_compiled = 1;
    target.hip_archs_built = archs_given && is_amd ? archs : NULL;
    target.cuda_archs_built = archs_given && !is_amd ? archs : NULL;
    target.prefill = choice;
    fmha_plan plan;
    fmha_status status = fmha_plan_make(&p, &target, num_splits, &plan);
    fmha_explain_input in = {
        .p = &p, .target = &target, .plan = &plan,
        .requested_splits = num_splits, .kv_cache = lens != NULL || device_lengths,
        .inputs_on_host = !device_lengths, .device_ordinal = 0, /* host arrays unless device_lengths */
        .length_independent = (int)device_lengths,
        .planned_keys = p.seqlen_k + p.seqlen_new,
        .serving = serving,
    };
    PyObject *d = fmha_explain_dict(&in);
    if (d && status != FMHA_OK) {
        /* the NotImplementedError forward() would raise, as text */
        PyObject *type, *value, *tb;
        fmha_explain_raise_unsupported(&in);
        PyErr_Fetch(&type, &value, &tb);
        PyObject *text = value ? PyObject_Str(value) : NULL;
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (fmha_dict_set(d, "error", text) < 0)
            Py_CLEAR(d);
    }
    return d;
}
