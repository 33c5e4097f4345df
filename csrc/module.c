/*
 * module.c: the CPython extension _fmha_native (imported by fmha_native as _C).
 *
 * Owns the module itself: its definition and multi-phase init (the NumPy C
 * API is loaded here), the module state (module.h) and its GC support, the
 * mapping of fmha_status to exceptions, the method table with its
 * docstrings, and info().  The entry points live in call.c, which takes a
 * call down the layers: args.c, tensor.c and the producer files,
 * validate.c, plan.c, the backends (cpu_fwd.c, gpu.c) and explain.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "call.h"
#include "dlpack.h"
#include "dlpack_out.h"
#include "explain.h"
#include "fmha.h"
#include "host_array.h"
#include "module.h"

#if PY_VERSION_HEX < 0x030A0000
/* Python 3.9 (pyproject's floor) lacks the reference-keeping variant. */
static int PyModule_AddObjectRef(PyObject *module, const char *name, PyObject *value)
{
    Py_XINCREF(value);
    if (PyModule_AddObject(module, name, value) < 0) {
        Py_XDECREF(value);
        return -1;
    }
    return 0;
}
#endif

static fmha_module_state *module_state(PyObject *module)
{
    return (fmha_module_state *)PyModule_GetState(module);
}

/* ------------------------------------------------------------------------ */
/* Module state                                                              */
/* ------------------------------------------------------------------------ */

int fmha_raise_status(const fmha_module_state *st, fmha_status status, const char *what)
{
    switch (status) {
    case FMHA_OK:
        return 0;
    case FMHA_ERR_NOMEM:
        PyErr_Format(PyExc_MemoryError, "%s: out of memory", what);
        break;
    case FMHA_ERR_RUNTIME:
        PyErr_Format(st->error, "%s: GPU runtime error: %s", what, fmha_gpu_error_string());
        break;
    case FMHA_ERR_UNSUPPORTED:
        PyErr_Format(PyExc_NotImplementedError, "%s: not supported by this backend", what);
        break;
    case FMHA_ERR_NO_DEVICE:
        PyErr_Format(st->error, "%s: no GPU is available: %s", what, fmha_gpu_error_string());
        break;
    case FMHA_ERR_INVALID:
    default:
        PyErr_Format(st->error, "%s: internal error: the backend rejected the parameters "
                     "(status %d)", what, (int)status);
        break;
    }
    return -1;
}

static int state_init(fmha_module_state *st)
{
    static const char *const texts[FMHA_NAME_COUNT] = {
#define FMHA_NAME_TEXT(id, text) text,
        FMHA_NAMES(FMHA_NAME_TEXT)
#undef FMHA_NAME_TEXT
    };
    for (int i = 0; i < FMHA_NAME_COUNT; i++)
        if (!(st->names[i] = PyUnicode_InternFromString(texts[i])))
            return -1;
    st->dlpack_version = Py_BuildValue("(ii)", FMHA_DLPACK_MAJOR_VERSION,
                                       FMHA_DLPACK_MINOR_VERSION);
    st->kw_stream_version = PyTuple_Pack(2, st->names[FMHA_NAME_STREAM],
                                         st->names[FMHA_NAME_MAX_VERSION]);
    st->kw_version = PyTuple_Pack(1, st->names[FMHA_NAME_MAX_VERSION]);
    st->kw_stream = PyTuple_Pack(1, st->names[FMHA_NAME_STREAM]);
    if (!st->dlpack_version || !st->kw_stream_version || !st->kw_version || !st->kw_stream)
        return -1;
    return 0;
}

/* Every object reference the state holds besides names[] (traverse and clear). */
#define FMHA_STATE_REFS(X)                                                                 \
    X(error) X(tensor_type) X(dlpack_version) X(kw_stream_version) X(kw_version)           \
    X(kw_stream) X(torch.tensor_type) X(torch.strided) X(torch.to_dlpack)     \
    X(torch.has_torch_function) X(torch.current_device) X(torch.current_stream)

static int state_traverse(fmha_module_state *st, visitproc visit, void *arg)
{
    for (int i = 0; i < FMHA_NAME_COUNT; i++)
        Py_VISIT(st->names[i]);
#define FMHA_VISIT(member) Py_VISIT(st->member);
    FMHA_STATE_REFS(FMHA_VISIT)
#undef FMHA_VISIT
    return 0;
}

static void state_clear(fmha_module_state *st)
{
    for (int i = 0; i < FMHA_NAME_COUNT; i++)
        Py_CLEAR(st->names[i]);
#define FMHA_CLEAR(member) Py_CLEAR(st->member);
    FMHA_STATE_REFS(FMHA_CLEAR)
#undef FMHA_CLEAR
    st->torch.state = 0;
}

/* ------------------------------------------------------------------------ */
/* info                                                                      */
/* ------------------------------------------------------------------------ */

static PyObject *device_dict(const fmha_device_info *info)
{
    return Py_BuildValue("{s:i,s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:L,s:i,s:i}", "ordinal", info->ordinal,
                         "name", info->name, "arch", info->arch, "platform",
                         info->is_amd ? "hip" : "cuda", "cc_major", info->cc_major, "cc_minor",
                         info->cc_minor, "sm_count", info->sm_count, "warp_size",
                         info->warp_size, "l2_bytes", (long long)info->l2_bytes,
                         "max_smem_per_block", info->max_smem_per_block, "max_smem_per_sm", info->max_smem_per_sm);
}

static PyObject *fmha_info(PyObject *module, PyObject *unused)
{
    (void)unused;
    const fmha_module_state *st = module_state(module);
    PyObject *d = NULL, *backends = NULL, *devices = NULL, *dev = NULL;
    d = PyDict_New();
    backends = PyList_New(0);
    devices = PyList_New(0);
    if (!d || !backends || !devices)
        goto fail;
    PyObject *cpu_name = PyUnicode_FromString("cpu");
    if (!cpu_name || PyList_Append(backends, cpu_name) < 0) {
        Py_XDECREF(cpu_name);
        goto fail;
    }
    Py_DECREF(cpu_name);
    if (fmha_gpu_compiled()) {
        PyObject *gpu_name = PyUnicode_FromString(fmha_gpu_platform());
        if (!gpu_name || PyList_Append(backends, gpu_name) < 0) {
            Py_XDECREF(gpu_name);
            goto fail;
        }
        Py_DECREF(gpu_name);
    }
    int count = fmha_gpu_device_count();
    for (int i = 0; i < count; i++) {
        const fmha_device_info *info = NULL;
        fmha_status status = fmha_gpu_device_info(i, &info);
        if (fmha_raise_status(st, status, "reading the GPU's properties") < 0)
            goto fail;
        dev = device_dict(info);
        if (!dev || PyList_Append(devices, dev) < 0)
            goto fail;
        Py_CLEAR(dev);
    }
    if (fmha_dict_set(d, "version", PyUnicode_FromString(FMHA_VERSION)) < 0 ||
        PyDict_SetItemString(d, "backends", backends) < 0 ||
        PyDict_SetItemString(d, "devices", devices) < 0 ||
        fmha_dict_set(d, "gpu_platform", PyUnicode_FromString(fmha_gpu_platform())) < 0 ||
        fmha_dict_set(d, "cpu_threads", PyLong_FromLong(fmha_cpu_num_threads())) < 0 ||
        fmha_dict_set(d, "cpu_simd", PyUnicode_FromString(fmha_cpu_simd_name())) < 0 ||
        fmha_dict_set(d, "max_splits", PyLong_FromLong(FMHA_MAX_SPLITS)) < 0)
        goto fail;
    Py_DECREF(backends);
    Py_DECREF(devices);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(backends);
    Py_XDECREF(devices);
    Py_XDECREF(dev);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Module                                                                    */
/* ------------------------------------------------------------------------ */

PyDoc_STRVAR(forward_doc,
"forward(q, k, v, *, causal=False, softmax_scale=None, num_splits=0, return_lse=True,\n"
"        out=None, lse=None, device=None, stream=None, cache_seqlens=None, k_new=None,\n"
"        v_new=None, max_seqlen_k=None, block_table=None, cu_seqlens_q=None,\n"
"        cu_seqlens_k=None, max_seqlen_q=None, window=None, softcap=0.0, sinks=None,\n"
"        out_dtype=None, kv_dtype=None, k_scale=None, v_scale=None)\n"
"--\n\n"
"Attention forward: q [batch, seqlen_q, heads_q, head_dim], k and v\n"
"[batch, seqlen_k, heads_kv, head_dim].  Returns (out, lse), or out when\n"
"return_lse is false; lse is float32 [batch, heads_q, seqlen_q].\n\n"
"Paged KV cache: block_table int32 [batch, max_blocks_per_seq], k and v\n"
"[num_pages, page_size, heads_kv, head_dim] (page_size a multiple of 16).\n"
"Packed sequences: cu_seqlens_q int32 [batch + 1], q and out\n"
"[total_q, heads_q, head_dim], lse [heads_q, total_q]; with cu_seqlens_k, k and\n"
"v [total_k, heads_kv, head_dim].  max_seqlen_q / max_seqlen_k: the longest\n"
"sequences (None: computed from host arrays, the totals for device ones).\n"
"window=(left, right): query at position p = i + len_k - len_q sees key j iff\n"
"p - left <= j <= p + right (-1 unbounded); softcap=c: scores become\n"
"c * tanh(s / c); sinks float32 [heads_q]: per-head logits in the softmax\n"
"denominator only.  The CPU backend runs these three; the GPU kernels not yet.\n"
"out_dtype=None (q's dtype) or float32: float32 out for float16/bfloat16 inputs\n"
"(a float32 out= means the same).\n"
"FP8 KV cache (CPU backend only so far): k and v float8_e4m3fn (or uint8 codes\n"
"with kv_dtype=\"e4m3fn\"); k_scale / v_scale: a number or float32 [], [heads_kv]\n"
"or [batch, heads_kv] (default 1.0); k_new/v_new are quantized on write.");

PyDoc_STRVAR(explain_doc,
"explain(q, k, v, **forward_keywords)\n--\n\n"
"The plan forward would run (backend, kernel, split count, tiles, gate), as a\n"
"dict.  Validates like forward; runs and allocates nothing.");

PyDoc_STRVAR(combine_doc,
"combine(outs, lses, *, out=None, lse=None, stream=None, sinks=None)\n--\n\n"
"Merge partial attention states: outs [G, batch, seqlen_q, heads, head_dim],\n"
"lses float32 [G, batch, heads, seqlen_q].  Returns (out, lse).  sinks float32\n"
"[heads] (CPU): folded in once after the merge.");

PyDoc_STRVAR(info_doc, "info()\n--\n\nVersion, compiled backends and visible devices.");

static PyMethodDef fmha_methods[] = {
    {"forward", (PyCFunction)(void (*)(void))fmha_call_forward, METH_FASTCALL | METH_KEYWORDS,
     forward_doc},
    {"explain", (PyCFunction)(void (*)(void))fmha_call_explain, METH_FASTCALL | METH_KEYWORDS,
     explain_doc},
    {"combine", (PyCFunction)(void (*)(void))fmha_call_combine, METH_FASTCALL | METH_KEYWORDS,
     combine_doc},
    {"info", fmha_info, METH_NOARGS, info_doc},
    {"_plan_for_device", (PyCFunction)(void (*)(void))fmha_explain_plan_for_device,
     METH_VARARGS | METH_KEYWORDS, "Private: the planner on a described GPU (explain.h)."},
    {NULL, NULL, 0, NULL},
};

static int fmha_exec(PyObject *module)
{
    fmha_module_state *st = module_state(module);
    if (fmha_host_array_init() < 0 || state_init(st) < 0)
        return -1;
    st->error = PyErr_NewExceptionWithDoc("fmha_native.FmhaError",
                                          "A GPU runtime failure inside fmha_native.",
                                          PyExc_RuntimeError, NULL);
    if (!st->error || PyModule_AddObjectRef(module, "FmhaError", st->error) < 0)
        return -1;
    st->tensor_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &fmha_device_tensor_spec,
                                                               NULL);
    if (!st->tensor_type ||
        PyModule_AddObjectRef(module, "Tensor", (PyObject *)st->tensor_type) < 0)
        return -1;
    if (PyModule_AddStringConstant(module, "__version__", FMHA_VERSION) < 0 ||
        PyModule_AddIntConstant(module, "MAX_SPLITS", FMHA_MAX_SPLITS) < 0)
        return -1;
    return 0;
}

static int fmha_traverse(PyObject *module, visitproc visit, void *arg)
{
    return state_traverse(module_state(module), visit, arg);
}

static int fmha_clear(PyObject *module)
{
    state_clear(module_state(module));
    return 0;
}

static void fmha_free(void *module) { (void)fmha_clear((PyObject *)module); }

static PyModuleDef_Slot fmha_slots[] = {
    {Py_mod_exec, fmha_exec},
    {0, NULL},
};

static struct PyModuleDef fmha_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fmha_native",
    .m_doc = "fmha_native's C extension: fused multi-head attention forward with split-K.",
    .m_size = sizeof(fmha_module_state),
    .m_methods = fmha_methods,
    .m_slots = fmha_slots,
    .m_traverse = fmha_traverse,
    .m_clear = fmha_clear,
    .m_free = fmha_free,
};

PyMODINIT_FUNC PyInit__fmha_native(void) { return PyModuleDef_Init(&fmha_module); }
