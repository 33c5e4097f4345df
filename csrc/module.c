/*
 * module.c: the CPython extension _fmha_native (imported by fmha_native as _C).
 *
 * Owns the Python-facing functions forward, explain, combine and info: the
 * argument parsing, every validation of the public contract (DESIGN.md
 * section 1), the choice of backend and device, filling fmha_fwd_params and
 * fmha_combine_params, output allocation, the GIL release around backend
 * calls, and the mapping of fmha_status to exceptions.  Tensor views come
 * from tensor.c; planning from plan.c; the work from cpu_fwd.c and gpu.c.
 *
 * Style: multi-phase init with module state; PyObject locals start NULL and
 * every failure goes to one `fail:` label; nothing the caller passed is
 * written before validation has finished.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha.h"
#include "fmha_config.h"
#include "explain.h"
#include "tensor.h"

/* log2(e): the kernels compute exp(x) as exp2(x * log2(e)). */
static const double fmha_log2e = 1.4426950408889634;

/* Room for a formatted shape or device in messages. */
#define FMHA_MSG_SHORT 96
/* Room for the gate's text in a NotImplementedError. */
#define FMHA_MSG_GATE 1024

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
/* Argument converters (PyArg_ParseTupleAndKeywords "O&")                   */
/* ------------------------------------------------------------------------ */

typedef struct fmha_opt_scale {
    int given;
    double value;
} fmha_opt_scale;

typedef enum fmha_device_choice {
    FMHA_DEVICE_AUTO = 0,
    FMHA_DEVICE_CPU = 1,
    FMHA_DEVICE_GPU = 2,
} fmha_device_choice;

typedef struct fmha_opt_stream {
    int given;
    void *handle;
} fmha_opt_stream;

static int conv_scale(PyObject *obj, void *addr)
{
    fmha_opt_scale *s = addr;
    s->given = 0;
    if (obj == Py_None)
        return 1;
    if (PyBool_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "softmax_scale must be a real number or None, got bool");
        return 0;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "softmax_scale must be a real number or None, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    if (!isfinite(v) || !isfinite((float)v)) {
        PyErr_Format(PyExc_ValueError, "softmax_scale must be finite in float32, got %R", obj);
        return 0;
    }
    s->given = 1;
    s->value = v;
    return 1;
}

static int conv_num_splits(PyObject *obj, void *addr)
{
    int *out = addr;
    if (PyBool_Check(obj) || PyFloat_Check(obj) || !PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "num_splits must be an int (0 = heuristic), got %.200s",
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    PyObject *index = PyNumber_Index(obj);
    if (!index)
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (v == -1 && PyErr_Occurred())
        return 0;
    if (overflow < 0 || (!overflow && v < 0)) {
        PyErr_Format(PyExc_ValueError, "num_splits must be >= 0 (0 = heuristic), got %R", obj);
        return 0;
    }
    if (overflow > 0 || v > FMHA_MAX_SPLITS) {
        PyErr_Format(PyExc_ValueError, "num_splits=%R is absurd: at most %d splits", obj,
                     FMHA_MAX_SPLITS);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int conv_device(PyObject *obj, void *addr)
{
    fmha_device_choice *out = addr;
    if (obj == Py_None) {
        *out = FMHA_DEVICE_AUTO;
        return 1;
    }
    if (PyUnicode_Check(obj)) {
        if (PyUnicode_CompareWithASCIIString(obj, "cpu") == 0) {
            *out = FMHA_DEVICE_CPU;
            return 1;
        }
        if (PyUnicode_CompareWithASCIIString(obj, "gpu") == 0 ||
            PyUnicode_CompareWithASCIIString(obj, "cuda") == 0 ||
            PyUnicode_CompareWithASCIIString(obj, "hip") == 0) {
            *out = FMHA_DEVICE_GPU;
            return 1;
        }
    }
    PyErr_Format(PyExc_ValueError, "device must be None, \"cpu\", \"gpu\", \"cuda\" or \"hip\", "
                 "got %R", obj);
    return 0;
}

static int conv_stream(PyObject *obj, void *addr)
{
    fmha_opt_stream *s = addr;
    s->given = 0;
    s->handle = NULL;
    if (obj == Py_None)
        return 1;
    if (PyBool_Check(obj) || !PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "stream must be an int stream handle or None, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return 0;
    if (overflow || v < 0) {
        PyErr_Format(PyExc_ValueError, "stream must be a non-negative stream handle, got %R", obj);
        return 0;
    }
    s->given = 1;
    s->handle = (void *)(uintptr_t)v;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Message helpers                                                           */
/* ------------------------------------------------------------------------ */

static void format_shape(const fmha_tensor *t, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < t->ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    if (t->ndim == 1 && used < len)
        used += (size_t)snprintf(buf + used, len - used, ",");
    if (used < len)
        snprintf(buf + used, len - used, ")");
}

static void format_place(const fmha_tensor *t, char *buf, size_t len)
{
    if (t->on_gpu)
        snprintf(buf, len, "%s:%d", fmha_gpu_platform(), t->device_id);
    else
        snprintf(buf, len, "cpu");
}

static int require_ndim(const fmha_tensor *t, int ndim, const char *layout)
{
    if (t->ndim == ndim)
        return 0;
    char shape[FMHA_MSG_SHORT];
    format_shape(t, shape, sizeof shape);
    PyErr_Format(PyExc_ValueError, "%s must be %d-D %s, got shape %s", t->name, ndim, layout,
                 shape);
    return -1;
}

static int require_shape(const fmha_tensor *t, int ndim, const int64_t *shape, const char *layout)
{
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == shape[d];
    if (ok)
        return 0;
    char got[FMHA_MSG_SHORT], want[FMHA_MSG_SHORT];
    fmha_tensor expect;
    fmha_tensor_init(&expect, t->name);
    expect.ndim = ndim;
    memcpy(expect.shape, shape, (size_t)ndim * sizeof shape[0]);
    format_shape(t, got, sizeof got);
    format_shape(&expect, want, sizeof want);
    PyErr_Format(PyExc_ValueError, "%s must have shape %s %s, got %s", t->name, want, layout, got);
    return -1;
}

static int require_same_place(const fmha_tensor *t, const fmha_tensor *ref)
{
    if (t->on_gpu == ref->on_gpu && (!t->on_gpu || t->device_id == ref->device_id))
        return 0;
    char a[FMHA_MSG_SHORT], b[FMHA_MSG_SHORT];
    format_place(t, a, sizeof a);
    format_place(ref, b, sizeof b);
    PyErr_Format(PyExc_ValueError, "%s is on %s but %s is on %s; all tensors must be on one "
                 "device", t->name, a, ref->name, b);
    return -1;
}

/* Device tensors are used as they are: whole-element alignment, non-negative
 * strides, and (unit_last) a unit stride on the last dimension. */
static int require_device_layout(const fmha_tensor *t, int unit_last)
{
    if (!t->on_gpu || fmha_tensor_numel(t) == 0)
        return 0;
    if ((uintptr_t)t->data % t->itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: device data is not aligned to its %zu-byte "
                     "elements", t->name, t->itemsize);
        return -1;
    }
    for (int d = 0; d < t->ndim; d++) {
        if (t->strides[d] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: device tensors need non-negative strides "
                         "(dimension %d has stride %lld)", t->name, d, (long long)t->strides[d]);
            return -1;
        }
    }
    if (unit_last && t->ndim > 0 && t->strides[t->ndim - 1] != 1) {
        PyErr_Format(PyExc_ValueError, "%s: device tensors need a unit stride on the last "
                     "(head_dim) dimension, got stride %lld; make it contiguous first",
                     t->name, (long long)t->strides[t->ndim - 1]);
        return -1;
    }
    return 0;
}

static int require_no_overlap(const fmha_tensor *written, const fmha_tensor *other)
{
    if (!written->present || !other->present || !fmha_tensor_overlap(written, other))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s overlaps %s in memory; outputs must not share memory "
                 "with the inputs or each other", written->name, other->name);
    return -1;
}

static int require_writable_layout(const fmha_tensor *t)
{
    if (!fmha_tensor_self_overlaps(t))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s has elements that share memory (zero or overlapping "
                 "strides), so it cannot be written", t->name);
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Output allocation                                                         */
/* ------------------------------------------------------------------------ */

static PyObject *shape_tuple(int ndim, const int64_t *shape)
{
    PyObject *tuple = PyTuple_New(ndim);
    if (!tuple)
        return NULL;
    for (int d = 0; d < ndim; d++) {
        PyObject *v = PyLong_FromLongLong(shape[d]);
        if (!v) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, d, v);
    }
    return tuple;
}

/*
 * A NumPy array of shape and element type elem.  When like_obj is a NumPy
 * array of that element type its dtype object is reused (so an ml_dtypes
 * bfloat16 input gives an ml_dtypes bfloat16 output).
 */
static PyObject *new_host_array(const fmha_module_state *st, PyObject *like_obj,
                                const fmha_tensor *like, int ndim, const int64_t *shape,
                                fmha_elem elem)
{
    PyObject *numpy = NULL, *dtype = NULL, *shape_obj = NULL, *empty = NULL;
    PyObject *ml_dtypes = NULL, *result = NULL;
    /* sys.modules first: the import machinery costs a microsecond per call. */
    numpy = PyImport_GetModule(st->names[FMHA_NAME_NUMPY]);
    if (!numpy && !PyErr_Occurred())
        numpy = PyImport_Import(st->names[FMHA_NAME_NUMPY]);
    if (!numpy)
        goto fail;
    if (like && like_obj && like->from_buffer && like->elem == elem &&
        PyObject_HasAttr(like_obj, st->names[FMHA_NAME_DTYPE])) {
        dtype = PyObject_GetAttr(like_obj, st->names[FMHA_NAME_DTYPE]);
    } else if (elem == FMHA_ELEM_BF16) {
        ml_dtypes = PyImport_ImportModule("ml_dtypes");
        if (!ml_dtypes) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "a bfloat16 NumPy output needs the ml_dtypes "
                            "package; install it, or pass out= and lse=");
            goto fail;
        }
        dtype = PyObject_GetAttrString(ml_dtypes, "bfloat16");
    } else {
        dtype = PyUnicode_FromString(fmha_elem_name(elem));
    }
    if (!dtype)
        goto fail;
    shape_obj = shape_tuple(ndim, shape);
    empty = PyObject_GetAttr(numpy, st->names[FMHA_NAME_EMPTY]);
    if (!shape_obj || !empty)
        goto fail;
    PyObject *call_args[2] = {shape_obj, dtype}; /* empty(shape, dtype=dtype) */
    result = PyObject_Vectorcall(empty, call_args, 1, st->kw_dtype);
fail:
    Py_XDECREF(numpy);
    Py_XDECREF(dtype);
    Py_XDECREF(shape_obj);
    Py_XDECREF(empty);
    Py_XDECREF(ml_dtypes);
    return result;
}

/* Allocate an output where the inputs live and view it for writing. */
static PyObject *new_output(const fmha_module_state *st, fmha_open_ctx *ctx,
                            PyObject *like_obj, const fmha_tensor *like, int on_gpu, int device,
                            int ndim, const int64_t *shape, fmha_elem elem, fmha_tensor *view)
{
    PyObject *obj = on_gpu ? fmha_device_tensor_new(st, device, ctx->stream, ndim, shape, elem)
                           : new_host_array(st, like_obj, like, ndim, shape, elem);
    if (!obj)
        return NULL;
    if (fmha_tensor_open(obj, FMHA_OPEN_WRITE, ctx, view) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

/* ------------------------------------------------------------------------ */
/* forward / explain                                                         */
/* ------------------------------------------------------------------------ */

typedef struct fmha_fwd_call {
    /* arguments */
    PyObject *q_obj, *k_obj, *v_obj, *out_arg, *lse_arg, *seqlens_arg, *k_new_arg, *v_new_arg;
    int causal, return_lse, num_splits;
    fmha_opt_scale scale;
    fmha_device_choice device;
    fmha_opt_stream stream;

    /* views */
    fmha_open_ctx ctx;
    fmha_tensor q, k, v, out, lse, seqlens, k_new, v_new;
    int append;                 /* k_new/v_new are written into k/v */
    int32_t max_seqlen;         /* longest cache_seqlens entry */
    int64_t total_keys;         /* sum of cache_seqlens + appended rows over the batch */

    /* decision */
    fmha_fwd_params p;
    fmha_backend backend;
    int gpu_device;
    const fmha_device_info *dev_info;
    int empty;                  /* batch or seqlen_q is 0: nothing runs */
    fmha_status plan_status;
    fmha_plan plan;
    int gpu_rejected;           /* device=None on host arrays: the GPU gate said no */
    fmha_plan gpu_plan;
    /* What produced plan (bytes, padding included): fwd_run asks the planner
     * again only when the memory the backend really sees changes its inputs. */
    int plan_memo;
    fmha_status plan_memo_status;
    fmha_fwd_params plan_memo_params;
    fmha_target plan_memo_target;

    /* run */
    PyObject *out_obj, *lse_obj; /* strong references to the returned outputs */
    int staged;                  /* host arrays were copied to a GPU */
    int need_sync;               /* ... and the call must wait for the stream */
    int synced;
} fmha_fwd_call;

/* ------------------------------------------------------------------------ */
/* Argument binding (METH_FASTCALL | METH_KEYWORDS)                         */
/* ------------------------------------------------------------------------ */

/* More than any argument list below. */
#define FMHA_MAX_ARGS 16

/*
 * An argument list of the shape PyArg_ParseTupleAndKeywords calls
 * "O...|$...": the first `positional` arguments are required and may be given
 * by position or keyword, the rest are keyword-only.
 */
typedef struct fmha_arg_spec {
    const char *fname;          /* for messages */
    const fmha_name *names;     /* interned names, in order */
    int count;
    int positional;
} fmha_arg_spec;

typedef struct fmha_bound_args {
    PyObject *value[FMHA_MAX_ARGS]; /* borrowed; NULL when not given */
    int duplicate;              /* lowest argument given by position and keyword, or -1 */
    PyObject *unknown;          /* first keyword that names no argument, or NULL */
} fmha_bound_args;

/* Index of the argument named key, -1 when none. */
static int find_arg(const fmha_module_state *st, const fmha_arg_spec *spec, PyObject *key)
{
    /* Keywords in calls are interned like our names: identity settles it. */
    for (int i = 0; i < spec->count; i++)
        if (st->names[spec->names[i]] == key)
            return i;
    for (int i = 0; i < spec->count; i++)
        if (PyUnicode_Compare(st->names[spec->names[i]], key) == 0)
            return i;
    return -1;
}

/*
 * Bind a FASTCALL argument vector to spec with the rules and messages of
 * PyArg_ParseTupleAndKeywords, whose cost (a new string per name per call)
 * was a tenth of a decode call's.  Too many arguments and missing required
 * ones raise here; a keyword that repeats a positional argument or names
 * none is reported by bound_args_finish, after the converters ran, which
 * is the order in which CPython reports them.
 */
static int bind_args(const fmha_module_state *st, const fmha_arg_spec *spec,
                     PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                     fmha_bound_args *b)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    memset(b->value, 0, sizeof b->value);
    b->duplicate = -1;
    b->unknown = NULL;
    if (nargs + nkw > spec->count) {
        PyErr_Format(PyExc_TypeError, "%.200s() takes at most %d %sargument%s (%zd given)",
                     spec->fname, spec->count, nargs == 0 ? "keyword " : "",
                     spec->count == 1 ? "" : "s", nargs + nkw);
        return -1;
    }
    if (nargs > spec->positional) {
        PyErr_Format(PyExc_TypeError, "%.200s() takes at most %d positional argument%s "
                     "(%zd given)", spec->fname, spec->positional,
                     spec->positional == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        b->value[i] = args[i];
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        int i = find_arg(st, spec, key);
        if (i < 0) {
            if (!b->unknown)
                b->unknown = key;
        } else if (i < nargs) {
            if (b->duplicate < 0 || i < b->duplicate)
                b->duplicate = i;
        } else {
            b->value[i] = args[nargs + j];
        }
    }
    for (int i = 0; i < spec->positional; i++) {
        if (!b->value[i]) {
            PyErr_Format(PyExc_TypeError, "%.200s() missing required argument '%U' (pos %d)",
                         spec->fname, st->names[spec->names[i]], i + 1);
            return -1;
        }
    }
    return 0;
}

static int bound_args_finish(const fmha_module_state *st, const fmha_arg_spec *spec,
                             const fmha_bound_args *b)
{
    if (b->duplicate >= 0) {
        PyErr_Format(PyExc_TypeError, "argument for %.200s() given by name ('%U') and "
                     "position (%d)", spec->fname, st->names[spec->names[b->duplicate]],
                     b->duplicate + 1);
        return -1;
    }
    if (b->unknown) {
        PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for %.200s()",
                     b->unknown, spec->fname);
        return -1;
    }
    return 0;
}

/* A "p" argument: *out = bool(obj) when obj was given; 0 or -1. */
static int conv_flag(PyObject *obj, int *out)
{
    if (!obj)
        return 0;
    int r = PyObject_IsTrue(obj);
    if (r < 0)
        return -1;
    *out = r;
    return 0;
}

/* An "O&" argument: convert(obj, addr) when obj was given; 0 or -1. */
static int conv_given(PyObject *obj, int (*convert)(PyObject *, void *), void *addr)
{
    return !obj || convert(obj, addr) ? 0 : -1;
}

enum {
    FWD_Q, FWD_K, FWD_V, FWD_CAUSAL, FWD_SCALE, FWD_NUM_SPLITS, FWD_RETURN_LSE, FWD_OUT,
    FWD_LSE, FWD_DEVICE, FWD_STREAM, FWD_SEQLENS, FWD_K_NEW, FWD_V_NEW, FWD_NARGS
};

_Static_assert(FWD_NARGS <= FMHA_MAX_ARGS, "forward's arguments fit fmha_bound_args");

static const fmha_name fwd_arg_names[FWD_NARGS] = {
    FMHA_NAME_Q, FMHA_NAME_K, FMHA_NAME_V, FMHA_NAME_CAUSAL, FMHA_NAME_SOFTMAX_SCALE,
    FMHA_NAME_NUM_SPLITS, FMHA_NAME_RETURN_LSE, FMHA_NAME_OUT, FMHA_NAME_LSE, FMHA_NAME_DEVICE,
    FMHA_NAME_STREAM, FMHA_NAME_CACHE_SEQLENS, FMHA_NAME_K_NEW, FMHA_NAME_V_NEW,
};

static int fwd_parse(const fmha_module_state *st, const char *fname, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames, fmha_fwd_call *c)
{
    const fmha_arg_spec spec = {fname, fwd_arg_names, FWD_NARGS, 3};
    fmha_bound_args b;
    c->return_lse = 1;
    c->out_arg = c->lse_arg = c->seqlens_arg = c->k_new_arg = c->v_new_arg = Py_None;
    fmha_tensor_init(&c->q, "q");
    fmha_tensor_init(&c->k, "k");
    fmha_tensor_init(&c->v, "v");
    fmha_tensor_init(&c->out, "out");
    fmha_tensor_init(&c->lse, "lse");
    fmha_tensor_init(&c->seqlens, "cache_seqlens");
    fmha_tensor_init(&c->k_new, "k_new");
    fmha_tensor_init(&c->v_new, "v_new");
    if (bind_args(st, &spec, args, nargs, kwnames, &b) < 0)
        return -1;
    PyObject **v = b.value;
    c->q_obj = v[FWD_Q];
    c->k_obj = v[FWD_K];
    c->v_obj = v[FWD_V];
    if (conv_flag(v[FWD_CAUSAL], &c->causal) < 0 ||
        conv_given(v[FWD_SCALE], conv_scale, &c->scale) < 0 ||
        conv_given(v[FWD_NUM_SPLITS], conv_num_splits, &c->num_splits) < 0 ||
        conv_flag(v[FWD_RETURN_LSE], &c->return_lse) < 0)
        return -1;
    if (v[FWD_OUT])
        c->out_arg = v[FWD_OUT];
    if (v[FWD_LSE])
        c->lse_arg = v[FWD_LSE];
    if (conv_given(v[FWD_DEVICE], conv_device, &c->device) < 0 ||
        conv_given(v[FWD_STREAM], conv_stream, &c->stream) < 0)
        return -1;
    if (v[FWD_SEQLENS])
        c->seqlens_arg = v[FWD_SEQLENS];
    if (v[FWD_K_NEW])
        c->k_new_arg = v[FWD_K_NEW];
    if (v[FWD_V_NEW])
        c->v_new_arg = v[FWD_V_NEW];
    return bound_args_finish(st, &spec, &b);
}

static void fwd_close(fmha_fwd_call *c)
{
    if (c->staged && !c->synced && (c->need_sync || PyErr_Occurred())) {
        /* Uploads may still read host copies that close frees. */
        Py_BEGIN_ALLOW_THREADS
        (void)fmha_gpu_stream_sync(c->gpu_device, c->ctx.stream);
        Py_END_ALLOW_THREADS
        c->synced = 1;
    }
    fmha_tensor_close(&c->q);
    fmha_tensor_close(&c->k);
    fmha_tensor_close(&c->v);
    fmha_tensor_close(&c->out);
    fmha_tensor_close(&c->lse);
    fmha_tensor_close(&c->seqlens);
    fmha_tensor_close(&c->k_new);
    fmha_tensor_close(&c->v_new);
    Py_CLEAR(c->out_obj);
    Py_CLEAR(c->lse_obj);
}

static int open_optional(PyObject *obj, unsigned flags, fmha_fwd_call *c, fmha_tensor *t)
{
    return obj == Py_None ? 0 : fmha_tensor_open(obj, flags, &c->ctx, t);
}

/* Read cache_seqlens on the host (copying device memory down) and check
 * 0 <= s and s + seqlen_new <= capacity. */
static int check_cache_seqlens(const fmha_module_state *st, fmha_fwd_call *c, int64_t seqlen_new)
{
    fmha_tensor *t = &c->seqlens;
    int64_t batch = t->shape[0];
    int32_t *host = NULL;
    const char *base = t->user_data;
    int64_t stride = t->user_strides[0];
    if (batch == 0)
        return 0;
    if (t->on_gpu) {
        if (stride != 1) {
            PyErr_SetString(PyExc_ValueError, "cache_seqlens on a GPU must be contiguous");
            return -1;
        }
        host = malloc((size_t)batch * sizeof *host);
        if (!host) {
            PyErr_NoMemory();
            return -1;
        }
        fmha_status status;
        Py_BEGIN_ALLOW_THREADS
        status = fmha_gpu_memcpy(t->device_id, c->ctx.stream, host, t->user_data,
                                 (size_t)batch * sizeof *host, FMHA_COPY_D2H);
        if (status == FMHA_OK)
            status = fmha_gpu_stream_sync(t->device_id, c->ctx.stream);
        Py_END_ALLOW_THREADS
        if (fmha_raise_status(st, status, "reading cache_seqlens") < 0) {
            free(host);
            return -1;
        }
        base = (const char *)host;
        stride = 1;
    }
    int64_t capacity = c->k.shape[1];
    c->max_seqlen = 0;
    c->total_keys = 0;
    for (int64_t b = 0; b < batch; b++) {
        int32_t s;
        memcpy(&s, base + b * stride * (int64_t)sizeof s, sizeof s);
        if (s < 0 || (int64_t)s + seqlen_new > capacity) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens[%lld] = %d: need 0 <= cache_seqlens[b]"
                         "%s <= %lld (the cache capacity k.shape[1])", (long long)b, (int)s,
                         seqlen_new ? " + k_new.shape[1]" : "", (long long)capacity);
            free(host);
            return -1;
        }
        if (s > c->max_seqlen)
            c->max_seqlen = s;
        c->total_keys += (int64_t)s + seqlen_new;
    }
    free(host);
    return 0;
}

/* Validate the views of q, k, v and the optional tensors. */
static int fwd_validate(const fmha_module_state *st, fmha_fwd_call *c)
{
    char shape_buf[FMHA_MSG_SHORT];
    if (require_ndim(&c->q, 4, "[batch, seqlen_q, heads_q, head_dim]") < 0 ||
        require_ndim(&c->k, 4, "[batch, seqlen_k, heads_kv, head_dim]") < 0 ||
        require_ndim(&c->v, 4, "[batch, seqlen_k, heads_kv, head_dim]") < 0)
        return -1;
    if (c->q.elem == FMHA_ELEM_I32) {
        PyErr_SetString(PyExc_TypeError, "q must be float16, bfloat16 or float32 (float32 on "
                        "the CPU only), got int32");
        return -1;
    }
    const fmha_tensor *same_dtype[] = {&c->k, &c->v};
    for (size_t i = 0; i < sizeof same_dtype / sizeof same_dtype[0]; i++) {
        if (same_dtype[i]->elem != c->q.elem) {
            PyErr_Format(PyExc_TypeError, "%s must have q's dtype %s, got %s",
                         same_dtype[i]->name, fmha_elem_name(c->q.elem),
                         fmha_elem_name(same_dtype[i]->elem));
            return -1;
        }
    }
    int64_t batch = c->q.shape[0], seqlen_q = c->q.shape[1], heads_q = c->q.shape[2];
    int64_t head_dim = c->q.shape[3];
    int64_t seqlen_k = c->k.shape[1], heads_kv = c->k.shape[2];
    int64_t kv_shape[4] = {batch, seqlen_k, heads_kv, head_dim};
    if (heads_q < 1 || head_dim < 1) {
        format_shape(&c->q, shape_buf, sizeof shape_buf);
        PyErr_Format(PyExc_ValueError, "q must have heads_q >= 1 and head_dim >= 1, got shape %s",
                     shape_buf);
        return -1;
    }
    if (heads_kv < 1) {
        format_shape(&c->k, shape_buf, sizeof shape_buf);
        PyErr_Format(PyExc_ValueError, "k must have heads_kv >= 1, got shape %s", shape_buf);
        return -1;
    }
    if (require_shape(&c->k, 4, kv_shape, "[batch, seqlen_k, heads_kv, head_dim] (batch and "
                      "head_dim of q)") < 0 ||
        require_shape(&c->v, 4, kv_shape, "(the shape of k)") < 0)
        return -1;
    if (heads_q % heads_kv != 0) {
        PyErr_Format(PyExc_ValueError, "heads_q (%lld, q.shape[2]) must be a multiple of "
                     "heads_kv (%lld, k.shape[2])", (long long)heads_q, (long long)heads_kv);
        return -1;
    }

    /* One device for everything (cache_seqlens may also be on the host). */
    fmha_tensor *placed[] = {&c->k, &c->v, &c->out, &c->lse, &c->k_new, &c->v_new};
    for (size_t i = 0; i < sizeof placed / sizeof placed[0]; i++)
        if (placed[i]->present && require_same_place(placed[i], &c->q) < 0)
            return -1;
    if (c->seqlens.present && c->seqlens.on_gpu && require_same_place(&c->seqlens, &c->k) < 0)
        return -1;
    if (c->device == FMHA_DEVICE_CPU && c->q.on_gpu) {
        char place[FMHA_MSG_SHORT];
        format_place(&c->q, place, sizeof place);
        PyErr_Format(PyExc_ValueError, "device=\"cpu\" but q is on %s; fmha_native does not copy "
                     "device tensors to the host (move them yourself)", place);
        return -1;
    }
    if (c->device == FMHA_DEVICE_GPU && !c->q.on_gpu && fmha_gpu_device_count() == 0) {
        PyErr_Format(PyExc_ValueError, "device=\"gpu\" but no GPU is available (%s)",
                     fmha_gpu_compiled() ? "the runtime lists no device"
                                         : "this build has no GPU backend");
        return -1;
    }
    fmha_tensor *tensors[] = {&c->q, &c->k, &c->v, &c->out, &c->k_new, &c->v_new};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
        if (tensors[i]->present && require_device_layout(tensors[i], 1) < 0)
            return -1;
    if (require_device_layout(&c->lse, 0) < 0 || require_device_layout(&c->seqlens, 1) < 0)
        return -1;

    /* Outputs. */
    if (c->out.present) {
        if (require_shape(&c->out, 4, c->q.shape, "(the shape of q)") < 0)
            return -1;
        if (c->out.elem != c->q.elem) {
            PyErr_Format(PyExc_ValueError, "out must have q's dtype %s, got %s",
                         fmha_elem_name(c->q.elem), fmha_elem_name(c->out.elem));
            return -1;
        }
    }
    if (c->lse.present) {
        int64_t lse_shape[3] = {batch, heads_q, seqlen_q};
        if (require_shape(&c->lse, 3, lse_shape, "[batch, heads_q, seqlen_q]") < 0)
            return -1;
        if (c->lse.elem != FMHA_ELEM_F32) {
            PyErr_Format(PyExc_ValueError, "lse must be float32, got %s",
                         fmha_elem_name(c->lse.elem));
            return -1;
        }
    }

    /* KV cache. */
    int64_t seqlen_new = 0;
    if ((c->k_new_arg != Py_None) != (c->v_new_arg != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "k_new and v_new must be given together");
        return -1;
    }
    if (c->k_new_arg != Py_None && c->seqlens_arg == Py_None) {
        PyErr_SetString(PyExc_ValueError, "k_new/v_new append to a KV cache and need "
                        "cache_seqlens");
        return -1;
    }
    if (c->seqlens_arg != Py_None) {
        if (c->seqlens.elem != FMHA_ELEM_I32) {
            PyErr_Format(PyExc_TypeError, "cache_seqlens must be int32, got %s",
                         fmha_elem_name(c->seqlens.elem));
            return -1;
        }
        int64_t seqlens_shape[1] = {batch};
        if (require_shape(&c->seqlens, 1, seqlens_shape, "[batch]") < 0)
            return -1;
    }
    if (c->append) {
        if (require_ndim(&c->k_new, 4, "[batch, seqlen_new, heads_kv, head_dim]") < 0)
            return -1;
        seqlen_new = c->k_new.shape[1];
        int64_t new_shape[4] = {batch, seqlen_new, heads_kv, head_dim};
        if (require_shape(&c->k_new, 4, new_shape, "[batch, seqlen_new, heads_kv, head_dim]") < 0 ||
            require_shape(&c->v_new, 4, new_shape, "(the shape of k_new)") < 0)
            return -1;
        const fmha_tensor *news[] = {&c->k_new, &c->v_new};
        for (size_t i = 0; i < sizeof news / sizeof news[0]; i++) {
            if (news[i]->elem != c->q.elem) {
                PyErr_Format(PyExc_TypeError, "%s must have q's dtype %s, got %s", news[i]->name,
                             fmha_elem_name(c->q.elem), fmha_elem_name(news[i]->elem));
                return -1;
            }
        }
    }

    /* Written tensors: no aliasing among their own elements or with anything else. */
    fmha_tensor *inputs[] = {&c->q, &c->k, &c->v, &c->k_new, &c->v_new, &c->seqlens};
    fmha_tensor *written[] = {&c->out, &c->lse, c->append ? &c->k : NULL, c->append ? &c->v : NULL};
    for (size_t w = 0; w < sizeof written / sizeof written[0]; w++) {
        fmha_tensor *t = written[w];
        if (!t || !t->present)
            continue;
        if (require_writable_layout(t) < 0)
            return -1;
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
            /* Separate k and v views of one packed cache are fine. */
            int kv_pair = (t == &c->k && inputs[i] == &c->v) || (t == &c->v && inputs[i] == &c->k);
            if (inputs[i] != t && !kv_pair && require_no_overlap(t, inputs[i]) < 0)
                return -1;
        }
    }
    if (c->out.present && c->lse.present && require_no_overlap(&c->out, &c->lse) < 0)
        return -1;

    if (c->seqlens_arg != Py_None && check_cache_seqlens(st, c, seqlen_new) < 0)
        return -1;
    return 0;
}

/* Element strides of a 4-D view, into three params fields (head_dim stride is 1). */
static void strides3(const fmha_tensor *t, int64_t *batch, int64_t *row, int64_t *head)
{
    *batch = t->strides[0];
    *row = t->strides[1];
    *head = t->strides[2];
}

/* Point the params at the views' (possibly copied or staged) memory. */
static void fwd_fill_pointers(fmha_fwd_call *c)
{
    fmha_fwd_params *p = &c->p;
    p->q = c->q.data;
    p->k = c->k.data;
    p->v = c->v.data;
    p->out = c->out.data;
    p->lse = c->lse.present ? (float *)c->lse.data : NULL;
    strides3(&c->q, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
    strides3(&c->k, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride);
    strides3(&c->v, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride);
    strides3(&c->out, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
    if (p->lse) {
        p->lse_batch_stride = c->lse.strides[0];
        p->lse_head_stride = c->lse.strides[1];
        p->lse_row_stride = c->lse.strides[2];
    }
    p->seqlens_k = c->seqlens.present ? (const int32_t *)c->seqlens.data : NULL;
    if (c->append) {
        p->k_new = c->k_new.data;
        p->v_new = c->v_new.data;
        strides3(&c->k_new, &p->knew_batch_stride, &p->knew_row_stride, &p->knew_head_stride);
        strides3(&c->v_new, &p->vnew_batch_stride, &p->vnew_row_stride, &p->vnew_head_stride);
    }
}

/* Pointer and strides the backend will see for t: its own memory, or (when
 * staged) a compact device copy, whose allocation is aligned for any vector
 * access and whose address is not known yet (NULL stands for it). */
static void planned_layout(const fmha_tensor *t, int staged, const void **ptr, int64_t *batch,
                           int64_t *row, int64_t *head)
{
    if (staged) {
        *ptr = NULL;
        *head = t->shape[3];
        *row = t->shape[2] * *head;
        *batch = t->shape[1] * *row;
    } else {
        *ptr = t->data;
        strides3(t, batch, row, head);
    }
}

/*
 * Plan for one backend.  Before memory is placed (actual == 0) the planner
 * sees the layout the backend will get (fwd_run plans again on the actual
 * one); with a KV cache it sees the longest cache length as seqlen_k.  The
 * planner is a pure function of its inputs, so a plan into c->plan whose
 * inputs are byte-for-byte those of the plan already there is that plan.
 */
static fmha_status plan_for(fmha_fwd_call *c, fmha_backend backend, int actual, fmha_plan *plan)
{
    fmha_target target;
    memset(&target, 0, sizeof target);
    target.backend = backend;
    target.num_threads = fmha_cpu_num_threads();
    target.device = backend == FMHA_BACKEND_GPU ? c->dev_info : NULL;
    target.gpu_compiled = fmha_gpu_compiled();
    fmha_fwd_params planned;
    memcpy(&planned, &c->p, sizeof planned);
    if (!actual) {
        int gpu = backend == FMHA_BACKEND_GPU;
        fmha_fwd_params *p = &planned;
        const void *out_ptr = NULL;
        planned_layout(&c->q, gpu && !c->q.on_gpu, &p->q, &p->q_batch_stride, &p->q_row_stride,
                       &p->q_head_stride);
        planned_layout(&c->k, gpu && !c->k.on_gpu, &p->k, &p->k_batch_stride, &p->k_row_stride,
                       &p->k_head_stride);
        planned_layout(&c->v, gpu && !c->v.on_gpu, &p->v, &p->v_batch_stride, &p->v_row_stride,
                       &p->v_head_stride);
        /* An output we allocate is compact, like a staged copy of q. */
        const fmha_tensor *out = c->out.present ? &c->out : &c->q;
        planned_layout(out, !c->out.present || (gpu && !c->out.on_gpu), &out_ptr,
                       &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
        p->out = (void *)(uintptr_t)out_ptr;
        /* The caller's lse as fwd_fill_pointers will pass it (a staged or
         * allocated one is not known yet). */
        if (c->lse.present && !(gpu && !c->lse.on_gpu)) {
            p->lse = c->lse.data;
            p->lse_batch_stride = c->lse.strides[0];
            p->lse_head_stride = c->lse.strides[1];
            p->lse_row_stride = c->lse.strides[2];
        }
        if (c->append) {
            planned_layout(&c->k_new, gpu && !c->k_new.on_gpu, &p->k_new, &p->knew_batch_stride,
                           &p->knew_row_stride, &p->knew_head_stride);
            planned_layout(&c->v_new, gpu && !c->v_new.on_gpu, &p->v_new, &p->vnew_batch_stride,
                           &p->vnew_row_stride, &p->vnew_head_stride);
        }
        /* Only its presence matters to the planner, which reads nothing behind it. */
        p->seqlens_k = c->seqlens.present ? (const int32_t *)c->seqlens.data : NULL;
    }
    if (planned.seqlens_k) {
        /* The longest cache length (the planner adds the appended rows) and all keys. */
        planned.seqlen_k = c->max_seqlen;
        planned.total_keys = c->total_keys;
    }
    int memo = plan == &c->plan;
    if (memo && c->plan_memo &&
        memcmp(&planned, &c->plan_memo_params, sizeof planned) == 0 &&
        memcmp(&target, &c->plan_memo_target, sizeof target) == 0)
        return c->plan_memo_status;
    fmha_status status = fmha_plan_make(&planned, &target, c->num_splits, plan);
    if (memo) {
        c->plan_memo = 1;
        c->plan_memo_status = status;
        memcpy(&c->plan_memo_params, &planned, sizeof planned);
        memcpy(&c->plan_memo_target, &target, sizeof target);
    }
    return status;
}

/* Everything up to (and including) the plan; runs nothing, writes nothing. */
static int fwd_prepare(fmha_module_state *st, fmha_fwd_call *c)
{
    fmha_open_ctx_init(&c->ctx, st, c->stream.handle);
    c->append = c->k_new_arg != Py_None && c->v_new_arg != Py_None && c->seqlens_arg != Py_None;
    unsigned kv_flags = c->append ? FMHA_OPEN_WRITE : 0;
    if (fmha_tensor_open(c->q_obj, 0, &c->ctx, &c->q) < 0 ||
        fmha_tensor_open(c->k_obj, kv_flags, &c->ctx, &c->k) < 0 ||
        fmha_tensor_open(c->v_obj, kv_flags, &c->ctx, &c->v) < 0 ||
        open_optional(c->out_arg, FMHA_OPEN_WRITE, c, &c->out) < 0 ||
        open_optional(c->lse_arg, FMHA_OPEN_WRITE, c, &c->lse) < 0 ||
        open_optional(c->seqlens_arg, 0, c, &c->seqlens) < 0 ||
        open_optional(c->k_new_arg, 0, c, &c->k_new) < 0 ||
        open_optional(c->v_new_arg, 0, c, &c->v_new) < 0)
        return -1;
    if (fwd_validate(st, c) < 0)
        return -1;

    fmha_fwd_params *p = &c->p;
    memset(p, 0, sizeof *p);
    p->batch = c->q.shape[0];
    p->seqlen_q = c->q.shape[1];
    p->heads_q = c->q.shape[2];
    p->head_dim = c->q.shape[3];
    p->seqlen_k = c->k.shape[1];
    p->heads_kv = c->k.shape[2];
    p->dtype = (fmha_dtype)c->q.elem;
    p->causal = c->causal;
    double scale = c->scale.given ? c->scale.value : 1.0 / sqrt((double)p->head_dim);
    p->softmax_scale = (float)scale;
    p->scale_log2 = (float)(scale * fmha_log2e);
    p->seqlen_new = c->append ? c->k_new.shape[1] : 0;
    p->stream = c->ctx.stream;
    p->num_threads = 0;
    c->empty = p->batch == 0 || p->seqlen_q == 0;

    /* Where it runs. */
    int want_gpu = c->q.on_gpu || c->device == FMHA_DEVICE_GPU ||
                   (c->device == FMHA_DEVICE_AUTO && fmha_gpu_device_count() > 0 && !c->empty);
    c->gpu_device = c->q.on_gpu ? c->q.device_id : 0;
    p->device = c->gpu_device;
    if (want_gpu) {
        fmha_status status = fmha_gpu_device_info(c->gpu_device, &c->dev_info);
        if (fmha_raise_status(st, status, "reading the GPU's properties") < 0)
            return -1;
    }
    c->backend = want_gpu ? FMHA_BACKEND_GPU : FMHA_BACKEND_CPU;
    if (c->empty) {
        /* nothing runs: no plan (explain says so) */
        c->plan_status = FMHA_OK;
        return 0;
    }
    c->plan_status = plan_for(c, c->backend, 0, &c->plan);
    if (c->plan_status == FMHA_ERR_UNSUPPORTED && c->backend == FMHA_BACKEND_GPU &&
        c->device == FMHA_DEVICE_AUTO && !c->q.on_gpu) {
        /* Host arrays with device=None: the CPU runs what the GPU cannot. */
        c->gpu_rejected = 1;
        c->gpu_plan = c->plan;
        c->backend = FMHA_BACKEND_CPU;
        c->plan_status = plan_for(c, c->backend, 0, &c->plan);
    }
    if (c->plan_status != FMHA_OK && c->plan_status != FMHA_ERR_UNSUPPORTED)
        return fmha_raise_status(st, c->plan_status, "planning");
    return 0;
}

/* Copy host memory to the GPU, or point the CPU backend at usable memory. */
static int fwd_place_memory(const fmha_module_state *st, fmha_fwd_call *c)
{
    fmha_tensor *inputs[] = {&c->q, &c->k, &c->v, &c->k_new, &c->v_new, &c->seqlens};
    fmha_tensor *outputs[] = {&c->out, &c->lse};
    if (c->backend == FMHA_BACKEND_CPU) {
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
            if (inputs[i]->present && fmha_tensor_host_prepare(inputs[i], 1, 1) < 0)
                return -1;
        if (fmha_tensor_host_prepare(&c->out, 1, 0) < 0)
            return -1;
        if (c->lse.present && fmha_tensor_host_prepare(&c->lse, 0, 0) < 0)
            return -1;
        return 0;
    }
    /*
     * GPU: host arrays (all of them, or only cache_seqlens next to device
     * tensors) get device copies.  Host results need a stream sync; so does
     * an upload from a host copy that fwd_close frees.  An upload straight
     * from the caller's pageable memory has been read when the copy call
     * returns (CUDA and HIP semantics for pageable sources), so device
     * tensors with a host cache_seqlens stay asynchronous.
     */
    fmha_status status = FMHA_OK;
    for (size_t i = 0; status == FMHA_OK && i < sizeof inputs / sizeof inputs[0]; i++) {
        if (inputs[i]->present && !inputs[i]->on_gpu) {
            c->staged = 1;
            status = fmha_tensor_stage(inputs[i], c->gpu_device, c->ctx.stream, 1);
            c->need_sync |= inputs[i]->host_copy != NULL;
        }
    }
    for (size_t i = 0; status == FMHA_OK && i < sizeof outputs / sizeof outputs[0]; i++) {
        if (outputs[i]->present && !outputs[i]->on_gpu) {
            c->staged = 1;
            c->need_sync = 1;
            status = fmha_tensor_stage(outputs[i], c->gpu_device, c->ctx.stream, 0);
        }
    }
    return fmha_raise_status(st, status, "copying host arrays to the GPU");
}

/* Outputs of a problem with no keys at all, written here on the host. */
static void fill_no_keys(fmha_fwd_call *c)
{
    const float neg_inf = -INFINITY;
    const unsigned char zero_bytes[sizeof(float)] = {0}; /* +0 in every element type */
    fmha_tensor_fill_host(&c->out, zero_bytes);
    if (c->lse.present)
        fmha_tensor_fill_host(&c->lse, &neg_inf);
}

/* The call as explain.c describes it. */
static fmha_explain_input explain_input(const fmha_fwd_call *c, fmha_target *target,
                                        fmha_target *gpu_target)
{
    memset(target, 0, sizeof *target);
    target->backend = c->backend;
    target->num_threads = fmha_cpu_num_threads();
    target->device = c->backend == FMHA_BACKEND_GPU ? c->dev_info : NULL;
    target->gpu_compiled = fmha_gpu_compiled();
    *gpu_target = *target;
    gpu_target->backend = FMHA_BACKEND_GPU;
    gpu_target->device = c->dev_info;
    fmha_explain_input in = {
        .p = &c->p, .target = target, .plan = &c->plan,
        .plan_ok = c->plan_status == FMHA_OK, .requested_splits = c->num_splits,
        .dtype_name = fmha_elem_name(c->q.elem), .kv_cache = c->seqlens.present,
        .inputs_on_host = !c->q.on_gpu, .device_ordinal = c->gpu_device,
        .gpu_rejected = c->gpu_rejected ? &c->gpu_plan : NULL,
        .gpu_rejected_target = c->gpu_rejected ? gpu_target : NULL, .empty = c->empty,
    };
    return in;
}

static PyObject *raise_unsupported(const fmha_fwd_call *c)
{
    fmha_target target, gpu_target;
    fmha_explain_input in = explain_input(c, &target, &gpu_target);
    return fmha_explain_raise_unsupported(&in);
}

static PyObject *fwd_run(fmha_module_state *st, fmha_fwd_call *c)
{
    int gpu = c->backend == FMHA_BACKEND_GPU;
    int out_on_gpu = c->q.on_gpu;
    int64_t lse_shape[3] = {c->p.batch, c->p.heads_q, c->p.seqlen_q};

    if (c->plan_status == FMHA_ERR_UNSUPPORTED)
        return raise_unsupported(c);
    /* Outputs: the caller's, or new ones where the inputs live. */
    if (c->out_arg != Py_None) {
        Py_INCREF(c->out_arg);
        c->out_obj = c->out_arg;
    } else {
        c->out_obj = new_output(st, &c->ctx, c->q_obj, &c->q, out_on_gpu, c->gpu_device, 4,
                                c->q.shape, c->q.elem, &c->out);
        if (!c->out_obj)
            return NULL;
    }
    if (c->lse_arg != Py_None) {
        Py_INCREF(c->lse_arg);
        c->lse_obj = c->lse_arg;
    } else if (c->return_lse) {
        c->lse_obj = new_output(st, &c->ctx, NULL, NULL, out_on_gpu, c->gpu_device, 3, lse_shape,
                                FMHA_ELEM_F32, &c->lse);
        if (!c->lse_obj)
            return NULL;
    }

    int no_keys = c->p.seqlen_k == 0 && !c->out.on_gpu;
    if (!c->empty && no_keys) {
        fill_no_keys(c);
    } else if (!c->empty) {
        if (fwd_place_memory(st, c) < 0)
            return NULL;
        fwd_fill_pointers(c);
        /* The same question again on the memory the backend will really see. */
        fmha_status status = plan_for(c, c->backend, 1, &c->plan);
        if (status == FMHA_ERR_UNSUPPORTED)
            return raise_unsupported(c);
        if (fmha_raise_status(st, status, "planning") < 0)
            return NULL;
        fmha_plan_apply(&c->plan, &c->p);

        fmha_status sync_status = FMHA_OK;
        fmha_tensor *written[] = {&c->out, &c->lse, c->append ? &c->k : NULL,
                                  c->append ? &c->v : NULL};
        size_t n_written = sizeof written / sizeof written[0];
        Py_BEGIN_ALLOW_THREADS
        status = gpu ? fmha_gpu_fwd(&c->p) : fmha_cpu_fwd(&c->p);
        if (c->need_sync) {
            for (size_t i = 0; status == FMHA_OK && i < n_written; i++)
                if (written[i])
                    status = fmha_tensor_download(written[i]);
            sync_status = fmha_gpu_stream_sync(c->gpu_device, c->ctx.stream);
            c->synced = 1;
        }
        Py_END_ALLOW_THREADS
        if (status == FMHA_OK)
            status = sync_status;
        if (fmha_raise_status(st, status, gpu ? "GPU forward" : "CPU forward") < 0)
            return NULL;
        for (size_t i = 0; i < n_written; i++) {
            if (!written[i])
                continue;
            if (written[i]->on_gpu)
                fmha_tensor_mark_written(written[i], c->ctx.stream);
            else
                fmha_tensor_host_writeback(written[i]);
        }
    }
    if (!c->return_lse) {
        Py_INCREF(c->out_obj);
        return c->out_obj;
    }
    return PyTuple_Pack(2, c->out_obj, c->lse_obj);
}

/* forward and explain: parse and prepare the same call, then `finish` it. */
static PyObject *fwd_call(PyObject *module, const char *name, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames,
                          PyObject *(*finish)(fmha_module_state *, fmha_fwd_call *))
{
    fmha_module_state *st = module_state(module);
    fmha_fwd_call c;
    PyObject *result = NULL;
    memset(&c, 0, sizeof c);
    if (fwd_parse(st, name, args, nargs, kwnames, &c) >= 0 && fwd_prepare(st, &c) >= 0)
        result = finish(st, &c);
    fwd_close(&c);
    return result;
}

static PyObject *fmha_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    return fwd_call(module, "forward", args, nargs, kwnames, fwd_run);
}

static PyObject *fwd_explain(fmha_module_state *st, fmha_fwd_call *c)
{
    (void)st;
    fmha_target target, gpu_target;
    fmha_explain_input in = explain_input(c, &target, &gpu_target);
    return fmha_explain_dict(&in);
}

static PyObject *fmha_explain(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    return fwd_call(module, "explain", args, nargs, kwnames, fwd_explain);
}

/* ------------------------------------------------------------------------ */
/* combine                                                                   */
/* ------------------------------------------------------------------------ */

enum { COMBINE_OUTS, COMBINE_LSES, COMBINE_OUT, COMBINE_LSE, COMBINE_STREAM, COMBINE_NARGS };

_Static_assert(COMBINE_NARGS <= FMHA_MAX_ARGS, "combine's arguments fit fmha_bound_args");

static const fmha_name combine_arg_names[COMBINE_NARGS] = {
    FMHA_NAME_OUTS, FMHA_NAME_LSES, FMHA_NAME_OUT, FMHA_NAME_LSE, FMHA_NAME_STREAM,
};

static PyObject *fmha_combine(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    fmha_module_state *st = module_state(module);
    const fmha_arg_spec spec = {"combine", combine_arg_names, COMBINE_NARGS, 2};
    fmha_bound_args b;
    PyObject *outs_obj = NULL, *lses_obj = NULL, *out_arg = Py_None, *lse_arg = Py_None;
    PyObject *out_obj = NULL, *lse_obj = NULL, *result = NULL;
    fmha_opt_stream stream = {0, NULL};
    fmha_tensor outs, lses, out, lse;
    fmha_tensor_init(&outs, "outs");
    fmha_tensor_init(&lses, "lses");
    fmha_tensor_init(&out, "out");
    fmha_tensor_init(&lse, "lse");
    if (bind_args(st, &spec, args, nargs, kwnames, &b) < 0)
        goto fail;
    outs_obj = b.value[COMBINE_OUTS];
    lses_obj = b.value[COMBINE_LSES];
    if (b.value[COMBINE_OUT])
        out_arg = b.value[COMBINE_OUT];
    if (b.value[COMBINE_LSE])
        lse_arg = b.value[COMBINE_LSE];
    if (conv_given(b.value[COMBINE_STREAM], conv_stream, &stream) < 0 ||
        bound_args_finish(st, &spec, &b) < 0)
        goto fail;
    fmha_open_ctx ctx;
    fmha_open_ctx_init(&ctx, st, stream.handle);
    if (fmha_tensor_open(outs_obj, 0, &ctx, &outs) < 0 ||
        fmha_tensor_open(lses_obj, 0, &ctx, &lses) < 0 ||
        (out_arg != Py_None && fmha_tensor_open(out_arg, FMHA_OPEN_WRITE, &ctx, &out) < 0) ||
        (lse_arg != Py_None && fmha_tensor_open(lse_arg, FMHA_OPEN_WRITE, &ctx, &lse) < 0))
        goto fail;

    if (require_ndim(&outs, 5, "[num_splits, batch, seqlen_q, heads, head_dim]") < 0 ||
        require_ndim(&lses, 4, "[num_splits, batch, heads, seqlen_q]") < 0)
        goto fail;
    if (outs.elem == FMHA_ELEM_I32) {
        PyErr_SetString(PyExc_TypeError, "outs must be float16, bfloat16 or float32, got int32");
        goto fail;
    }
    if (lses.elem != FMHA_ELEM_F32) {
        PyErr_Format(PyExc_TypeError, "lses must be float32, got %s", fmha_elem_name(lses.elem));
        goto fail;
    }
    int64_t num_splits = outs.shape[0], batch = outs.shape[1], seqlen_q = outs.shape[2];
    int64_t heads = outs.shape[3], head_dim = outs.shape[4];
    if (num_splits < 1 || num_splits > FMHA_MAX_SPLITS) {
        PyErr_Format(PyExc_ValueError, "outs must hold 1..%d partial states (outs.shape[0]), "
                     "got %lld", FMHA_MAX_SPLITS, (long long)num_splits);
        goto fail;
    }
    if (head_dim < 1) {
        PyErr_SetString(PyExc_ValueError, "outs must have head_dim >= 1 (outs.shape[4])");
        goto fail;
    }
    int64_t lses_shape[4] = {num_splits, batch, heads, seqlen_q};
    int64_t out_shape[4] = {batch, seqlen_q, heads, head_dim};
    int64_t lse_shape[3] = {batch, heads, seqlen_q};
    if (require_shape(&lses, 4, lses_shape, "[num_splits, batch, heads, seqlen_q] (from outs)") < 0)
        goto fail;
    if (require_same_place(&lses, &outs) < 0)
        goto fail;
    if (out.present) {
        if (require_shape(&out, 4, out_shape, "[batch, seqlen_q, heads, head_dim]") < 0 ||
            require_same_place(&out, &outs) < 0)
            goto fail;
        if (out.elem != outs.elem) {
            PyErr_Format(PyExc_ValueError, "out must have outs' dtype %s, got %s",
                         fmha_elem_name(outs.elem), fmha_elem_name(out.elem));
            goto fail;
        }
    }
    if (lse.present) {
        if (require_shape(&lse, 3, lse_shape, "[batch, heads, seqlen_q]") < 0 ||
            require_same_place(&lse, &outs) < 0)
            goto fail;
        if (lse.elem != FMHA_ELEM_F32) {
            PyErr_Format(PyExc_ValueError, "lse must be float32, got %s", fmha_elem_name(lse.elem));
            goto fail;
        }
    }
    if (require_device_layout(&outs, 1) < 0 || require_device_layout(&lses, 0) < 0 ||
        require_device_layout(&out, 1) < 0 || require_device_layout(&lse, 0) < 0)
        goto fail;
    fmha_tensor *written[] = {&out, &lse};
    fmha_tensor *inputs[] = {&outs, &lses};
    for (size_t w = 0; w < sizeof written / sizeof written[0]; w++) {
        if (!written[w]->present)
            continue;
        if (require_writable_layout(written[w]) < 0 ||
            require_no_overlap(written[w], inputs[0]) < 0 ||
            require_no_overlap(written[w], inputs[1]) < 0)
            goto fail;
    }
    if (out.present && lse.present && require_no_overlap(&out, &lse) < 0)
        goto fail;

    int on_gpu = outs.on_gpu;
    if (out_arg != Py_None) {
        Py_INCREF(out_arg);
        out_obj = out_arg;
    } else if (!(out_obj = new_output(st, &ctx, outs_obj, &outs, on_gpu, outs.device_id, 4,
                                      out_shape, outs.elem, &out))) {
        goto fail;
    }
    if (lse_arg != Py_None) {
        Py_INCREF(lse_arg);
        lse_obj = lse_arg;
    } else if (!(lse_obj = new_output(st, &ctx, NULL, NULL, on_gpu, outs.device_id, 3, lse_shape,
                                      FMHA_ELEM_F32, &lse))) {
        goto fail;
    }

    if (batch * seqlen_q * heads > 0) {
        if (fmha_tensor_host_prepare(&outs, 1, 1) < 0 || fmha_tensor_host_prepare(&lses, 0, 1) < 0 ||
            fmha_tensor_host_prepare(&out, 1, 0) < 0 || fmha_tensor_host_prepare(&lse, 0, 0) < 0)
            goto fail;
        fmha_combine_params cp;
        memset(&cp, 0, sizeof cp);
        cp.num_splits = num_splits;
        cp.batch = batch;
        cp.seqlen_q = seqlen_q;
        cp.heads = heads;
        cp.head_dim = head_dim;
        cp.in_dtype = (fmha_dtype)outs.elem;
        cp.out_dtype = (fmha_dtype)out.elem;
        cp.o_partial = outs.data;
        cp.op_split_stride = outs.strides[0];
        cp.op_batch_stride = outs.strides[1];
        cp.op_row_stride = outs.strides[2];
        cp.op_head_stride = outs.strides[3];
        cp.lse_partial = lses.data;
        cp.lp_split_stride = lses.strides[0];
        cp.lp_batch_stride = lses.strides[1];
        cp.lp_head_stride = lses.strides[2];
        cp.lp_row_stride = lses.strides[3];
        cp.out = out.data;
        cp.o_batch_stride = out.strides[0];
        cp.o_row_stride = out.strides[1];
        cp.o_head_stride = out.strides[2];
        cp.lse = lse.data;
        cp.lse_batch_stride = lse.strides[0];
        cp.lse_head_stride = lse.strides[1];
        cp.lse_row_stride = lse.strides[2];
        cp.stream = ctx.stream;
        cp.device = outs.device_id;
        cp.num_threads = 0;
        fmha_status status;
        Py_BEGIN_ALLOW_THREADS
        status = on_gpu ? fmha_gpu_combine(&cp) : fmha_cpu_combine(&cp);
        Py_END_ALLOW_THREADS
        if (fmha_raise_status(st, status, on_gpu ? "GPU combine" : "CPU combine") < 0)
            goto fail;
        if (on_gpu) {
            fmha_tensor_mark_written(&out, ctx.stream);
            fmha_tensor_mark_written(&lse, ctx.stream);
        } else {
            fmha_tensor_host_writeback(&out);
            fmha_tensor_host_writeback(&lse);
        }
    }
    result = PyTuple_Pack(2, out_obj, lse_obj);
fail:
    fmha_tensor_close(&outs);
    fmha_tensor_close(&lses);
    fmha_tensor_close(&out);
    fmha_tensor_close(&lse);
    Py_XDECREF(out_obj);
    Py_XDECREF(lse_obj);
    return result;
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
"        v_new=None)\n"
"--\n\n"
"Attention forward: q [batch, seqlen_q, heads_q, head_dim], k and v\n"
"[batch, seqlen_k, heads_kv, head_dim].  Returns (out, lse), or out when\n"
"return_lse is false; lse is float32 [batch, heads_q, seqlen_q].");

PyDoc_STRVAR(explain_doc,
"explain(q, k, v, **forward_keywords)\n--\n\n"
"The plan forward would run (backend, kernel, split count, tiles, gate), as a\n"
"dict.  Validates like forward; runs and allocates nothing.");

PyDoc_STRVAR(combine_doc,
"combine(outs, lses, *, out=None, lse=None, stream=None)\n--\n\n"
"Merge partial attention states: outs [G, batch, seqlen_q, heads, head_dim],\n"
"lses float32 [G, batch, heads, seqlen_q].  Returns (out, lse).");

PyDoc_STRVAR(info_doc, "info()\n--\n\nVersion, compiled backends and visible devices.");

static PyMethodDef fmha_methods[] = {
    {"forward", (PyCFunction)(void (*)(void))fmha_forward, METH_FASTCALL | METH_KEYWORDS,
     forward_doc},
    {"explain", (PyCFunction)(void (*)(void))fmha_explain, METH_FASTCALL | METH_KEYWORDS,
     explain_doc},
    {"combine", (PyCFunction)(void (*)(void))fmha_combine, METH_FASTCALL | METH_KEYWORDS,
     combine_doc},
    {"info", fmha_info, METH_NOARGS, info_doc},
    {"_plan_for_device", (PyCFunction)(void (*)(void))fmha_explain_plan_for_device,
     METH_VARARGS | METH_KEYWORDS, "Private: the planner on a described GPU (explain.h)."},
    {NULL, NULL, 0, NULL},
};

static int fmha_exec(PyObject *module)
{
    fmha_module_state *st = module_state(module);
    if (fmha_state_init(st) < 0)
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
    return fmha_state_traverse(module_state(module), visit, arg);
}

static int fmha_clear(PyObject *module)
{
    fmha_state_clear(module_state(module));
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
