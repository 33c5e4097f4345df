/*
 * explain.c: every sentence about a plan, and the explain() dict.
 *
 * Owns the explain() dict, the NotImplementedError text of an unsupported
 * problem, and the private hook _plan_for_device.  Nothing here decides
 * anything: the planner's numbers are read and put into words.
 */
#include "explain.h"

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

static PyObject *gate_dict(const fmha_plan *plan)
{
    PyObject *gate = PyDict_New(), *item = NULL;
    if (!gate)
        return NULL;
    for (int i = 0; i < plan->n_gate; i++) {
        item = PyDict_New();
        if (!item || fmha_dict_set(item, "met", PyBool_FromLong(plan->gate[i].met)) < 0 ||
            fmha_dict_set(item, "why", PyUnicode_FromString(plan->gate[i].why)) < 0 ||
            PyDict_SetItemString(gate, plan->gate[i].name, item) < 0)
            goto fail;
        Py_CLEAR(item);
    }
    return gate;
fail:
    Py_XDECREF(item);
    Py_DECREF(gate);
    return NULL;
}

/* "name: met/NOT met (why); ..." for messages. */
static void gate_text(const fmha_plan *plan, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < plan->n_gate && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s: %s (%s)", i ? "; " : "",
                                 plan->gate[i].name, plan->gate[i].met ? "met" : "NOT met",
                                 plan->gate[i].why);
}

PyObject *fmha_explain_raise_unsupported(const fmha_explain_input *in)
{
    const fmha_plan *plan = in->plan;
    char gate[1024];
    gate_text(plan, gate, sizeof gate);
    const char *hint = "";
    if (plan->backend == FMHA_BACKEND_GPU) {
        if (!in->inputs_on_host)
            hint = " The CPU backend runs it: pass host arrays with device=\"cpu\".";
        else if (!strstr(plan->reason, "device=\"cpu\""))
            hint = " device=\"cpu\" runs it on the CPU backend.";
    }
    PyErr_Format(PyExc_NotImplementedError, "the %s backend cannot run this problem: %s [gate: "
                 "%s].%s", plan->backend == FMHA_BACKEND_GPU ? "GPU" : "CPU", plan->reason,
                 gate, hint);
    return NULL;
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
    const char *kernel = in->empty ? "none" : plan->kernel;
    char reason[1024];
    if (in->empty)
        snprintf(reason, sizeof reason, "empty problem (batch or seqlen_q is 0): nothing runs");
    else if (in->gpu_rejected)
        snprintf(reason, sizeof reason, "the GPU gate is not met (%s); running on the CPU: %s",
                 in->gpu_rejected->reason, plan->reason);
    else
        snprintf(reason, sizeof reason, "%s", plan->reason);
    if (fmha_dict_set(d, "backend", PyUnicode_FromString(gpu ? "gpu" : "cpu")) < 0 ||
        fmha_dict_set(d, "supported", PyBool_FromLong(in->empty || in->plan_ok)) < 0 ||
        fmha_dict_set(d, "kernel", PyUnicode_FromString(kernel)) < 0 ||
        fmha_dict_set(d, "kernel_id", PyLong_FromLong(in->empty ? 0 : plan->kernel_id)) < 0 ||
        fmha_dict_set(d, "num_splits", PyLong_FromLong(in->empty ? 1 : plan->num_splits)) < 0 ||
        fmha_dict_set(d, "requested_splits", PyLong_FromLong(in->requested_splits)) < 0 ||
        fmha_dict_set(d, "walkers_per_split", PyLong_FromLong(in->empty ? 1 : plan->stream_splits)) < 0 ||
        fmha_dict_set(d, "kv_read_once", PyBool_FromLong(!in->empty && plan->kv_read_once)) < 0 ||
        fmha_dict_set(d, "block_m", PyLong_FromLong(in->empty ? 0 : plan->block_m)) < 0 ||
        fmha_dict_set(d, "block_n", PyLong_FromLong(in->empty ? 0 : plan->block_n)) < 0 ||
        fmha_dict_set(d, "pack_gqa", PyBool_FromLong(!in->empty && plan->pack_gqa)) < 0 ||
        fmha_dict_set(d, "reason", PyUnicode_FromString(reason)) < 0 ||
        fmha_dict_set(d, "gate", in->empty ? PyDict_New() : gate_dict(plan)) < 0 ||
        fmha_dict_set(d, "batch", PyLong_FromLongLong(p->batch)) < 0 ||
        fmha_dict_set(d, "seqlen_q", PyLong_FromLongLong(p->seqlen_q)) < 0 ||
        fmha_dict_set(d, "seqlen_k", PyLong_FromLongLong(p->seqlen_k)) < 0 ||
        fmha_dict_set(d, "heads_q", PyLong_FromLongLong(p->heads_q)) < 0 ||
        fmha_dict_set(d, "heads_kv", PyLong_FromLongLong(p->heads_kv)) < 0 ||
        fmha_dict_set(d, "head_dim", PyLong_FromLongLong(p->head_dim)) < 0 ||
        fmha_dict_set(d, "dtype", PyUnicode_FromString(in->dtype_name)) < 0 ||
        fmha_dict_set(d, "causal", PyBool_FromLong(p->causal)) < 0 ||
        fmha_dict_set(d, "softmax_scale", PyFloat_FromDouble(p->softmax_scale)) < 0 ||
        fmha_dict_set(d, "kv_cache", PyBool_FromLong(in->kv_cache)) < 0 ||
        fmha_dict_set(d, "seqlen_new", PyLong_FromLongLong(p->seqlen_new)) < 0)
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
    if (in->gpu_rejected &&
        fmha_dict_set(d, "gpu_rejected", Py_BuildValue("{s:s,s:s,s:N}", "kernel", in->gpu_rejected->kernel,
                                             "reason", in->gpu_rejected->reason, "gate",
                                             gate_dict(in->gpu_rejected))) < 0)
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
    static char *kwlist[] = {"problem", "device", "num_splits", NULL};
    PyObject *prob, *dev;
    int num_splits = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!|i:_plan_for_device", kwlist, &PyDict_Type,
                                     &prob, &PyDict_Type, &dev, &num_splits))
        return NULL;
    if (num_splits < 0 || num_splits > FMHA_MAX_SPLITS)
        return PyErr_Format(PyExc_ValueError, "num_splits must be in 0..%d, got %d",
                            FMHA_MAX_SPLITS, num_splits);

    const int64_t big = (int64_t)1 << 40;
    fmha_fwd_params p;
    memset(&p, 0, sizeof p);
    int64_t causal = 0, misaligned = 0;
    char dtype[32];
    if (get_int(prob, "problem", "batch", 1, big, -1, &p.batch) < 0 ||
        get_int(prob, "problem", "seqlen_q", 1, big, -1, &p.seqlen_q) < 0 ||
        get_int(prob, "problem", "seqlen_k", 0, big, -1, &p.seqlen_k) < 0 ||
        get_int(prob, "problem", "heads_q", 1, 1 << 20, -1, &p.heads_q) < 0 ||
        get_int(prob, "problem", "heads_kv", 1, 1 << 20, p.heads_q, &p.heads_kv) < 0 ||
        get_int(prob, "problem", "head_dim", 1, 1 << 20, -1, &p.head_dim) < 0 ||
        get_int(prob, "problem", "causal", 0, 1, 0, &causal) < 0 ||
        get_int(prob, "problem", "misaligned", 0, 1, 0, &misaligned) < 0 ||
        get_int(prob, "problem", "seqlen_new", 0, big, 0, &p.seqlen_new) < 0 ||
        get_str(prob, "dtype", "float16", dtype, sizeof dtype) < 0 || dtype_from_name(dtype, &p.dtype) < 0)
        return NULL;
    if (p.heads_q % p.heads_kv != 0)
        return PyErr_Format(PyExc_ValueError, "heads_q (%lld) must be a multiple of heads_kv (%lld)",
                            (long long)p.heads_q, (long long)p.heads_kv);
    p.causal = (int)causal;
    p.softmax_scale = 1.0f;
    if (misaligned)
        p.q = (const void *)(uintptr_t)2; /* a q that starts 2 bytes past a 16-byte boundary */
    static const int32_t present = 0;  /* the planner reads only whether seqlens_k is set */
    PyObject *lens = PyDict_GetItemString(prob, "cache_seqlens");
    if (lens) {
        PyObject *seq = PySequence_Fast(lens, "problem['cache_seqlens'] must be a list of int");
        if (!seq)
            return NULL;
        if (PySequence_Fast_GET_SIZE(seq) != p.batch) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "problem['cache_seqlens'] needs batch=%lld entries",
                                (long long)p.batch);
        }
        int64_t longest = 0, total = 0;
        for (Py_ssize_t i = 0; i < p.batch; i++) {
            long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if ((x == -1 && PyErr_Occurred()) || x < 0 || x + p.seqlen_new > p.seqlen_k) {
                Py_DECREF(seq);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "problem['cache_seqlens'] entries must be in "
                                                      "0..seqlen_k - seqlen_new");
                return NULL;
            }
            longest = x > longest ? x : longest;
            total += x + p.seqlen_new;
        }
        Py_DECREF(seq);
        p.seqlens_k = &present;
        p.seqlen_k = longest; /* as the binding layer plans: the longest length */
        p.total_keys = total;
    } else if (p.seqlen_new) {
        return PyErr_Format(PyExc_ValueError, "problem['seqlen_new'] needs cache_seqlens");
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
    target.hip_archs_built = archs_given ? archs : NULL;
    fmha_plan plan;
    fmha_status status = fmha_plan_make(&p, &target, num_splits, &plan);
    fmha_explain_input in = {
        .p = &p, .target = &target, .plan = &plan, .plan_ok = status == FMHA_OK,
        .requested_splits = num_splits, .dtype_name = dtype, .kv_cache = lens != NULL,
        .inputs_on_host = 0, .device_ordinal = 0,
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
