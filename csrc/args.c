/*
 * args.c: argument parsing of the Python entry points.
 *
 * Owns one declarative spec per entry point (forward/explain, combine): the
 * names in order, how many are positional-or-keyword (the rest are
 * keyword-only) and per argument an "O&"-style converter and the offset of
 * its value in the parsed struct; the binder that applies a spec to a
 * METH_FASTCALL argument vector; and the converters, which raise
 * TypeError/ValueError naming the argument.  The binder follows the rules
 * and messages of PyArg_ParseTupleAndKeywords without its cost (a new string
 * per keyword per call): keywords arrive interned, like the spec's names, so
 * pointer identity finds them.
 */
#include "args.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Converters: 1 on success, 0 with an exception set (the "O&" protocol)    */
/* ------------------------------------------------------------------------ */

typedef int (*fmha_converter)(PyObject *obj, void *addr);

/* A tensor or other object, stored as a borrowed reference. */
static int conv_object(PyObject *obj, void *addr)
{
    *(PyObject **)addr = obj;
    return 1;
}

/* A flag: bool(obj), as PyArg_Parse's "p". */
static int conv_flag(PyObject *obj, void *addr)
{
    int r = PyObject_IsTrue(obj);
    if (r < 0)
        return 0;
    *(int *)addr = r;
    return 1;
}

/* A real-number argument (bool refused) as *v; the TypeError says "<name> must be
 * <expected>, got <type>".  1, or 0 with an exception set. */
static int real_value(PyObject *obj, const char *name, const char *expected, double *v)
{
    if (!PyBool_Check(obj)) {
        *v = PyFloat_AsDouble(obj);
        if (!(*v == -1.0 && PyErr_Occurred()))
            return 1;
        PyErr_Clear();
    }
    PyErr_Format(PyExc_TypeError, "%s must be %s, got %.200s", name, expected,
                 Py_TYPE(obj)->tp_name);
    return 0;
}

static int conv_scale(PyObject *obj, void *addr)
{
    fmha_opt_scale *s = addr;
    s->given = 0;
    if (obj == Py_None)
        return 1;
    double v;
    if (!real_value(obj, "softmax_scale", "a real number or None", &v))
        return 0;
    if (!isfinite(v) || !isfinite((float)v)) {
        PyErr_Format(PyExc_ValueError, "softmax_scale must be finite in float32, got %R", obj);
        return 0;
    }
    s->given = 1;
    s->value = v;
    return 1;
}

/* An int argument (bool and float refused) as *v, with *overflow as
 * PyLong_AsLongLongAndOverflow sets it; the TypeError says "<name> must be
 * <expected>".  1, or 0 with an exception set. */
static int index_value(PyObject *obj, const char *name, const char *expected, long long *v,
                       int *overflow)
{
    if (PyBool_Check(obj) || PyFloat_Check(obj) || !PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be %s, got %.200s", name, expected,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    PyObject *index = PyNumber_Index(obj);
    if (!index)
        return 0;
    *overflow = 0;
    *v = PyLong_AsLongLongAndOverflow(index, overflow);
    Py_DECREF(index);
    return !(*v == -1 && PyErr_Occurred());
}

static int conv_num_splits(PyObject *obj, void *addr)
{
    int *out = addr;
    long long v;
    int overflow;
    if (!index_value(obj, "num_splits", "an int (0 = heuristic)", &v, &overflow))
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

/* An optional length: an int or None (its range needs the tensors' shapes:
 * validate.c). */
static int conv_opt_length(PyObject *obj, const char *name, fmha_opt_int *out)
{
    out->given = 0;
    if (obj == Py_None)
        return 1;
    long long v;
    int overflow;
    if (!index_value(obj, name, "an int or None", &v, &overflow))
        return 0;
    out->given = 1;
    /* Out of range either way: validate.c names the range. */
    out->value = overflow > 0 ? LLONG_MAX : overflow < 0 ? LLONG_MIN : v;
    return 1;
}

static int conv_max_seqlen_k(PyObject *obj, void *addr)
{
    return conv_opt_length(obj, "max_seqlen_k", addr);
}

static int conv_max_seqlen_q(PyObject *obj, void *addr)
{
    return conv_opt_length(obj, "max_seqlen_q", addr);
}

/* window=(left, right): two ints >= -1 (-1 = unbounded), or None. */
static int conv_window(PyObject *obj, void *addr)
{
    fmha_opt_window *w = addr;
    w->given = 0;
    w->left = w->right = -1;
    if (obj == Py_None)
        return 1;
    if (!PyTuple_Check(obj) && !PyList_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "window must be a (left, right) tuple of ints or None, "
                     "got %.200s", Py_TYPE(obj)->tp_name);
        return 0;
    }
    if (PySequence_Size(obj) != 2) {
        PyErr_Format(PyExc_ValueError, "window must be a (left, right) pair, got %zd values",
                     PySequence_Size(obj));
        return 0;
    }
    long long side[2];
    for (int i = 0; i < 2; i++) {
        PyObject *item = PySequence_GetItem(obj, i);
        if (!item)
            return 0;
        int overflow;
        int ok = index_value(item, "window", "a (left, right) tuple of ints", &side[i], &overflow);
        Py_DECREF(item);
        if (!ok)
            return 0;
        if (overflow > 0)
            side[i] = LLONG_MAX / 4; /* beyond any sequence: unbounded in effect */
        if (overflow < 0 || side[i] < -1) {
            PyErr_Format(PyExc_ValueError, "window values must be >= -1 (-1 = unbounded), got %R",
                         obj);
            return 0;
        }
    }
    w->given = 1;
    w->left = side[0];
    w->right = side[1];
    return 1;
}

/* softcap=c: a real number, 0 (off) or positive and finite in float32. */
static int conv_softcap(PyObject *obj, void *addr)
{
    double *out = addr;
    double v;
    if (!real_value(obj, "softcap", "a real number (0 = off)", &v))
        return 0;
    if (!(v >= 0.0) || !isfinite((float)v)) {
        PyErr_Format(PyExc_ValueError, "softcap must be 0 (off) or positive and finite, got %R",
                     obj);
        return 0;
    }
    *out = v;
    return 1;
}

/*
 * out_dtype: None (q's dtype) or float32, spelled as any of the libraries the inputs may
 * come from spell it: the string "float32", torch.float32, numpy.float32 or
 * numpy.dtype("float32") (CuPy uses NumPy's).  Recognised by their type's name and their
 * str(), so no library is imported here.
 */
static int conv_out_dtype(PyObject *obj, void *addr)
{
    int *out = addr;
    *out = 0;
    if (obj == Py_None)
        return 1;
    int ok = 0;
    if (PyUnicode_Check(obj)) {
        ok = PyUnicode_CompareWithASCIIString(obj, "float32") == 0;
    } else if (PyType_Check(obj)) {
        ok = strcmp(((PyTypeObject *)obj)->tp_name, "numpy.float32") == 0;
    } else {
        const char *type = Py_TYPE(obj)->tp_name;
        const char *want = strcmp(type, "torch.dtype") == 0 ? "torch.float32"
                           : strncmp(type, "numpy.", 6) == 0 ? "float32" : NULL;
        if (want) {
            PyObject *text = PyObject_Str(obj);
            if (!text)
                return 0;
            ok = PyUnicode_CompareWithASCIIString(text, want) == 0;
            Py_DECREF(text);
        }
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "out_dtype must be None (q's dtype) or float32 (\"float32\", "
                     "torch.float32 or numpy.float32), got %R", obj);
        return 0;
    }
    *out = 1;
    return 1;
}

/* kv_dtype=: None or "e4m3fn" / "float8_e4m3fn" (issue 22). */
static int conv_kv_dtype(PyObject *obj, void *addr)
{
    fmha_kv_choice *out = addr;
    if (obj == Py_None) {
        *out = FMHA_KV_AUTO;
        return 1;
    }
    if (PyUnicode_Check(obj) && (PyUnicode_CompareWithASCIIString(obj, "e4m3fn") == 0 ||
                                 PyUnicode_CompareWithASCIIString(obj, "float8_e4m3fn") == 0)) {
        *out = FMHA_KV_E4M3FN;
        return 1;
    }
    PyErr_Format(PyExc_ValueError, "kv_dtype must be None (k and v's own dtype) or \"e4m3fn\" "
                 "(float8 e4m3fn codes, also in uint8 storage), got %R", obj);
    return 0;
}

/* k_scale= / v_scale=: None, a Python number (positive, finite in float32) or an
 * array, opened and checked by validate.c. */
static int conv_kv_scale(PyObject *obj, const char *name, fmha_opt_kv_scale *s)
{
    s->given = 0;
    s->value = 1.0;
    s->obj = Py_None;
    if (obj == Py_None)
        return 1;
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a real number or a float32 array, got bool",
                     name);
        return 0;
    }
    if (!PyFloat_Check(obj) && !PyLong_Check(obj)) {
        s->given = 2;
        s->obj = obj;
        return 1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return 0;
        PyErr_Clear();
        v = INFINITY;
    }
    if (!(v > 0.0) || !isfinite((float)v)) {
        PyErr_Format(PyExc_ValueError, "%s must be positive and finite in float32 (the fp8 "
                     "dequantization factor), got %R", name, obj);
        return 0;
    }
    s->given = 1;
    s->value = v;
    return 1;
}

static int conv_k_scale(PyObject *obj, void *addr) { return conv_kv_scale(obj, "k_scale", addr); }
static int conv_v_scale(PyObject *obj, void *addr) { return conv_kv_scale(obj, "v_scale", addr); }

/* ------------------------------------------------------------------------ */
/* Specs                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct fmha_arg {
    fmha_name name;
    fmha_converter convert;
    size_t offset;              /* of the value in the parsed struct */
} fmha_arg;

/* More than any spec below has. */
#define FMHA_MAX_ARGS 28

typedef struct fmha_arg_spec {
    const fmha_arg *args;
    int count;
    int positional;             /* the first `positional` are required, by position or keyword */
} fmha_arg_spec;

#define FWD_ARG(id, conv, field) {FMHA_NAME_##id, conv, offsetof(fmha_fwd_args, field)}
static const fmha_arg forward_args[] = {
    FWD_ARG(Q, conv_object, q),
    FWD_ARG(K, conv_object, k),
    FWD_ARG(V, conv_object, v),
    FWD_ARG(CAUSAL, conv_flag, causal),
    FWD_ARG(SOFTMAX_SCALE, conv_scale, scale),
    FWD_ARG(NUM_SPLITS, conv_num_splits, num_splits),
    FWD_ARG(RETURN_LSE, conv_flag, return_lse),
    FWD_ARG(OUT, conv_object, out),
    FWD_ARG(LSE, conv_object, lse),
    FWD_ARG(DEVICE, conv_device, device),
    FWD_ARG(STREAM, conv_stream, stream),
    FWD_ARG(CACHE_SEQLENS, conv_object, cache_seqlens),
    FWD_ARG(K_NEW, conv_object, k_new),
    FWD_ARG(V_NEW, conv_object, v_new),
    FWD_ARG(MAX_SEQLEN_K, conv_max_seqlen_k, max_seqlen_k),
    FWD_ARG(BLOCK_TABLE, conv_object, block_table),
    FWD_ARG(CU_SEQLENS_Q, conv_object, cu_seqlens_q),
    FWD_ARG(CU_SEQLENS_K, conv_object, cu_seqlens_k),
    FWD_ARG(MAX_SEQLEN_Q, conv_max_seqlen_q, max_seqlen_q),
    FWD_ARG(WINDOW, conv_window, window),
    FWD_ARG(SOFTCAP, conv_softcap, softcap),
    FWD_ARG(SINKS, conv_object, sinks),
    FWD_ARG(OUT_DTYPE, conv_out_dtype, out_f32),
    FWD_ARG(KV_DTYPE, conv_kv_dtype, kv_dtype),
    FWD_ARG(K_SCALE, conv_k_scale, k_scale),
    FWD_ARG(V_SCALE, conv_v_scale, v_scale),
};
#undef FWD_ARG
static const fmha_arg_spec forward_spec = {
    forward_args, (int)(sizeof forward_args / sizeof forward_args[0]), 3};

#define COMBINE_ARG(id, conv, field) {FMHA_NAME_##id, conv, offsetof(fmha_combine_args, field)}
static const fmha_arg combine_args[] = {
    COMBINE_ARG(OUTS, conv_object, outs),
    COMBINE_ARG(LSES, conv_object, lses),
    COMBINE_ARG(OUT, conv_object, out),
    COMBINE_ARG(LSE, conv_object, lse),
    COMBINE_ARG(STREAM, conv_stream, stream),
    COMBINE_ARG(SINKS, conv_object, sinks),
};
#undef COMBINE_ARG
static const fmha_arg_spec combine_spec = {
    combine_args, (int)(sizeof combine_args / sizeof combine_args[0]), 2};

_Static_assert(sizeof forward_args / sizeof forward_args[0] <= FMHA_MAX_ARGS &&
               sizeof combine_args / sizeof combine_args[0] <= FMHA_MAX_ARGS,
               "every spec fits the binder's table");

/* ------------------------------------------------------------------------ */
/* Binder                                                                    */
/* ------------------------------------------------------------------------ */

/* Index of the argument named key, -1 when none. */
static int find_arg(const fmha_module_state *st, const fmha_arg_spec *spec, PyObject *key)
{
    for (int i = 0; i < spec->count; i++)
        if (st->names[spec->args[i].name] == key)
            return i;
    for (int i = 0; i < spec->count; i++)
        if (PyUnicode_Compare(st->names[spec->args[i].name], key) == 0)
            return i;
    return -1;
}

/*
 * Bind the argument vector to spec and convert each given argument into
 * out (arguments not given keep what out holds).  Too many arguments and
 * missing required ones raise before any converter runs; a keyword that
 * repeats a positional argument or names none raises after them, which is
 * the order in which CPython reports them.
 */
static int parse_args(const fmha_module_state *st, const fmha_arg_spec *spec, const char *fname,
                      PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, void *out)
{
    PyObject *value[FMHA_MAX_ARGS] = {NULL};
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int duplicate = -1;         /* lowest argument given by position and keyword */
    PyObject *unknown = NULL;   /* first keyword that names no argument */
    if (nargs + nkw > spec->count) {
        PyErr_Format(PyExc_TypeError, "%.200s() takes at most %d %sargument%s (%zd given)",
                     fname, spec->count, nargs == 0 ? "keyword " : "",
                     spec->count == 1 ? "" : "s", nargs + nkw);
        return -1;
    }
    if (nargs > spec->positional) {
        PyErr_Format(PyExc_TypeError, "%.200s() takes at most %d positional argument%s "
                     "(%zd given)", fname, spec->positional, spec->positional == 1 ? "" : "s",
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        value[i] = args[i];
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        int i = find_arg(st, spec, key);
        if (i < 0) {
            if (!unknown)
                unknown = key;
        } else if (i < nargs) {
            if (duplicate < 0 || i < duplicate)
                duplicate = i;
        } else {
            value[i] = args[nargs + j];
        }
    }
    for (int i = 0; i < spec->positional; i++) {
        if (!value[i]) {
            PyErr_Format(PyExc_TypeError, "%.200s() missing required argument '%U' (pos %d)",
                         fname, st->names[spec->args[i].name], i + 1);
            return -1;
        }
    }
    for (int i = 0; i < spec->count; i++)
        if (value[i] && !spec->args[i].convert(value[i], (char *)out + spec->args[i].offset))
            return -1;
    if (duplicate >= 0) {
        PyErr_Format(PyExc_TypeError, "argument for %.200s() given by name ('%U') and "
                     "position (%d)", fname, st->names[spec->args[duplicate].name],
                     duplicate + 1);
        return -1;
    }
    if (unknown) {
        PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for %.200s()",
                     unknown, fname);
        return -1;
    }
    return 0;
}

int fmha_parse_forward(const fmha_module_state *st, const char *fname, PyObject *const *args,
                       Py_ssize_t nargs, PyObject *kwnames, fmha_fwd_args *a)
{
    memset(a, 0, sizeof *a);
    a->return_lse = 1;
    a->out = a->lse = a->cache_seqlens = a->k_new = a->v_new = Py_None;
    a->block_table = a->cu_seqlens_q = a->cu_seqlens_k = a->sinks = Py_None;
    a->window.left = a->window.right = -1;
    a->k_scale.value = a->v_scale.value = 1.0;
    a->k_scale.obj = a->v_scale.obj = Py_None;
    return parse_args(st, &forward_spec, fname, args, nargs, kwnames, a);
}

int fmha_parse_combine(const fmha_module_state *st, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames, fmha_combine_args *a)
{
    memset(a, 0, sizeof *a);
    a->out = a->lse = a->sinks = Py_None;
    return parse_args(st, &combine_spec, "combine", args, nargs, kwnames, a);
}
