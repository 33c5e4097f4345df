/*
 * host_array.c: host arrays through the NumPy C API and the buffer protocol.
 *
 * Owns the view of a NumPy array (read straight from the array object, which
 * also covers ml_dtypes bfloat16: NumPy exports no buffer format for it), the
 * view of any other buffer-protocol exporter, the names of their dtypes as
 * users know them, and the NumPy arrays we allocate for outputs (with the
 * input's dtype object, so an ml_dtypes dtype survives).  This is the only
 * file that includes NumPy's headers; fmha_host_array_init loads the API at
 * module exec.
 */
#include "host_array.h"

#include <stdio.h>
#include <string.h>

#include <numpy/arrayobject.h>

/* NumPy 2 hides the descriptor's elsize behind an accessor; NumPy 1's
 * headers have only the field. */
#if NPY_ABI_VERSION < 0x02000000
#define PyDataType_ELSIZE(descr) ((descr)->elsize)
#endif

int fmha_host_array_init(void)
{
    return _import_array() < 0 ? -1 : 0;
}

int fmha_is_numpy_array(PyObject *obj) { return PyArray_Check(obj); }

static int host_is_little_endian(void)
{
    const uint16_t probe = 1;
    return *(const unsigned char *)&probe == 1;
}

/* "big-endian " or "little-endian " for a byte order that is not the host's. */
static const char *foreign_order(void)
{
    return host_is_little_endian() ? "big-endian " : "little-endian ";
}

/* ------------------------------------------------------------------------ */
/* NumPy arrays                                                              */
/* ------------------------------------------------------------------------ */

/* 1 when descr is ml_dtypes' bfloat16 (a user dtype whose scalar type is
 * named bfloat16, 2 bytes wide). */
static int is_bfloat16(PyArray_Descr *descr)
{
    if (descr->type_num < NPY_USERDEF || PyDataType_ELSIZE(descr) != 2 || !descr->typeobj)
        return 0;
    const char *name = descr->typeobj->tp_name;
    const char *dot = strrchr(name, '.');
    return strcmp(dot ? dot + 1 : name, "bfloat16") == 0;
}

/* 1 when descr is ml_dtypes' float8_e4m3fn (a 1-byte user dtype of that name). */
static int is_float8_e4m3fn(PyArray_Descr *descr)
{
    if (descr->type_num < NPY_USERDEF || PyDataType_ELSIZE(descr) != 1 || !descr->typeobj)
        return 0;
    const char *name = descr->typeobj->tp_name;
    const char *dot = strrchr(name, '.');
    return strcmp(dot ? dot + 1 : name, "float8_e4m3fn") == 0;
}

static fmha_elem numpy_elem(PyArray_Descr *descr)
{
    if (!PyArray_ISNBO(descr->byteorder))
        return FMHA_ELEM_OTHER;
    size_t size = (size_t)PyDataType_ELSIZE(descr);
    switch (descr->kind) {
    case 'f':
        if (size == 2)
            return FMHA_ELEM_F16;
        if (size == 4)
            return FMHA_ELEM_F32;
        return FMHA_ELEM_OTHER;
    case 'i':
        return size == 4 ? FMHA_ELEM_I32 : FMHA_ELEM_OTHER;
    case 'u':
        return size == 1 ? FMHA_ELEM_U8 : FMHA_ELEM_OTHER;
    default:
        if (is_float8_e4m3fn(descr))
            return FMHA_ELEM_E4M3;
        return is_bfloat16(descr) ? FMHA_ELEM_BF16 : FMHA_ELEM_OTHER;
    }
}

const char *fmha_numpy_dtype_name(PyObject *array, char *buf, size_t len)
{
    PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)array);
    /* numpy.dtype.name is what users see ("float64"; "float32" for '>f4', so
     * a foreign byte order is said in front). */
    PyObject *name = PyObject_GetAttrString((PyObject *)descr, "name");
    const char *text = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (text)
        snprintf(buf, len, "%s%s", PyArray_ISNBO(descr->byteorder) ? "" : foreign_order(), text);
    else
        snprintf(buf, len, "a NumPy dtype of kind '%c' and %zu bytes", descr->kind,
                 (size_t)PyDataType_ELSIZE(descr));
    PyErr_Clear();
    Py_XDECREF(name);
    return buf;
}

/* Element strides from byte strides; a supported element type needs whole
 * elements (views of other dtypes fail validation before their memory is
 * used, so their strides only need to be numbers). */
static int element_strides(fmha_tensor *t, const Py_ssize_t *byte_strides)
{
    for (int d = 0; d < t->ndim; d++) {
        if (t->elem != FMHA_ELEM_OTHER && byte_strides[d] % (Py_ssize_t)t->itemsize != 0) {
            PyErr_Format(PyExc_ValueError, "%s has a byte stride (%zd) that is not a multiple "
                         "of its item size (%zu)", t->name, byte_strides[d], t->itemsize);
            return -1;
        }
        t->strides[d] = byte_strides[d] / (Py_ssize_t)t->itemsize;
    }
    return 0;
}

int fmha_numpy_open(PyObject *obj, fmha_tensor *t)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    PyArray_Descr *descr = PyArray_DESCR(a);
    Py_INCREF(obj);
    t->array = obj;
    t->source = FMHA_SOURCE_NUMPY;
    t->elem = numpy_elem(descr);
    t->itemsize = PyDataType_ELSIZE(descr) > 0 ? (size_t)PyDataType_ELSIZE(descr) : 1;
    if (PyArray_NDIM(a) > FMHA_TENSOR_MAX_NDIM)
        return fmha_tensor_raise_ndim(t, PyArray_NDIM(a));
    t->ndim = PyArray_NDIM(a);
    for (int d = 0; d < t->ndim; d++)
        t->shape[d] = PyArray_DIMS(a)[d];
    if (element_strides(t, PyArray_STRIDES(a)) < 0)
        return -1;
    t->data = PyArray_DATA(a);
    t->readonly = !PyArray_ISWRITEABLE(a);
    t->on_gpu = 0;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Other buffer-protocol exporters                                           */
/* ------------------------------------------------------------------------ */

/* Split a one-item struct-module format into its byte-order character (0
 * when none) and its code (one character, or 'Z' plus one for complex);
 * 0, or -1 for anything else (counts, records, several items). */
static int split_format(const char *fmt, char *order, char code[3])
{
    *order = 0;
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<' || fmt[0] == '>' || fmt[0] == '!')
        *order = *fmt++;
    size_t n = strlen(fmt);
    if (n == 1 || (n == 2 && fmt[0] == 'Z')) {
        memcpy(code, fmt, n + 1);
        return 0;
    }
    return -1;
}

/* 1 when a byte-order character says the host's order. */
static int native_order(char order)
{
    if (order == '<')
        return host_is_little_endian();
    if (order == '>' || order == '!')
        return !host_is_little_endian();
    return 1;
}

const char *fmha_buffer_format_name(const char *format, size_t itemsize, char *buf, size_t len)
{
    char order, code[3];
    if (!format)
        format = "B"; /* the protocol's default: unsigned bytes */
    if (split_format(format, &order, code) < 0) {
        snprintf(buf, len, "a %zu-byte record", itemsize);
        return buf;
    }
    const char *prefix = native_order(order) ? "" : foreign_order();
    const char *kind = NULL;    /* a name with the width in bits after it */
    const char *fixed = NULL;   /* a name without a width */
    switch (code[0]) {
    case '?': fixed = "bool"; break;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': kind = "int"; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': kind = "uint"; break;
    case 'e': case 'f': case 'd': case 'g': kind = "float"; break;
    case 'Z': kind = "complex"; break;
    case 'c': case 's': case 'p': fixed = "bytes"; break;
    case 'u': case 'w': fixed = "str (unicode characters)"; break;
    case 'O': fixed = "object (Python objects)"; break;
    case 'P': fixed = "pointer"; break;
    default: break;
    }
    if (kind)
        snprintf(buf, len, "%s%s%zu", prefix, kind, itemsize * 8);
    else if (fixed)
        snprintf(buf, len, "%s", fixed);
    else
        snprintf(buf, len, "a %zu-byte record", itemsize);
    return buf;
}

/* Element type of a struct-module format with native order. */
static fmha_elem format_elem(const char *format, size_t itemsize)
{
    char order, code[3];
    if (!format || split_format(format, &order, code) < 0 || !native_order(order))
        return FMHA_ELEM_OTHER;
    switch (code[0]) {
    case 'e': return itemsize == 2 ? FMHA_ELEM_F16 : FMHA_ELEM_OTHER;
    case 'f': return itemsize == 4 ? FMHA_ELEM_F32 : FMHA_ELEM_OTHER;
    case 'B': return itemsize == 1 ? FMHA_ELEM_U8 : FMHA_ELEM_OTHER;
    case 'i':
    case 'l':
    case 'q':
        return itemsize == 4 ? FMHA_ELEM_I32 : FMHA_ELEM_OTHER;
    default:
        return FMHA_ELEM_OTHER;
    }
}

/*
 * PyObject_GetBuffer with PyBUF_WRITABLE added under FMHA_OPEN_WRITE.  0 on
 * success; -1 when the exporter refused the request (exception set); -2 when
 * it refused only because the object is read-only (ValueError set).
 */
static int get_buffer(PyObject *obj, int request, unsigned flags, fmha_tensor *t)
{
    int writable = (flags & FMHA_OPEN_WRITE) != 0;
    if (PyObject_GetBuffer(obj, &t->buffer, request | (writable ? PyBUF_WRITABLE : 0)) == 0) {
        t->has_buffer = 1;
        return 0;
    }
    if (!writable)
        return -1;
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    if (PyObject_GetBuffer(obj, &t->buffer, request) == 0) {
        PyBuffer_Release(&t->buffer);
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        PyErr_Format(PyExc_ValueError, "%s must be writable, but it is read-only", t->name);
        return -2;
    }
    PyErr_Clear();
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return -1;
}

int fmha_buffer_open(PyObject *obj, unsigned flags, fmha_tensor *t)
{
    int rc = get_buffer(obj, PyBUF_STRIDES | PyBUF_FORMAT, flags, t);
    if (rc == -2)
        return -1;
    if (rc < 0) {
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        PyObject *why = exc_value ? PyObject_Str(exc_value) : NULL;
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: cannot read its buffer (%S); expected float16, "
                     "bfloat16 or float32 elements", t->name, why ? why : Py_None);
        Py_XDECREF(why);
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        return -1;
    }
    Py_buffer *b = &t->buffer;
    t->source = FMHA_SOURCE_BUFFER;
    t->itemsize = b->itemsize > 0 ? (size_t)b->itemsize : 1;
    t->elem = format_elem(b->format, t->itemsize);
    if (b->ndim > FMHA_TENSOR_MAX_NDIM)
        return fmha_tensor_raise_ndim(t, b->ndim);
    t->ndim = b->ndim;
    for (int d = 0; d < t->ndim; d++)
        t->shape[d] = b->shape[d];
    if (b->strides) {
        if (element_strides(t, b->strides) < 0)
            return -1;
    } else {
        fmha_compact_strides(t->ndim, t->shape, t->strides);
    }
    t->data = b->buf;
    t->readonly = b->readonly;
    t->on_gpu = 0;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Outputs                                                                   */
/* ------------------------------------------------------------------------ */

/* A new reference to the NumPy dtype of elem. */
static PyArray_Descr *elem_descr(fmha_elem elem)
{
    switch (elem) {
    case FMHA_ELEM_F16: return PyArray_DescrFromType(NPY_FLOAT16);
    case FMHA_ELEM_F32: return PyArray_DescrFromType(NPY_FLOAT32);
    case FMHA_ELEM_I32: return PyArray_DescrFromType(NPY_INT32);
    case FMHA_ELEM_BF16: break;
    case FMHA_ELEM_E4M3:
    case FMHA_ELEM_U8:
    case FMHA_ELEM_OTHER:
        PyErr_SetString(PyExc_SystemError, "fmha_native: no NumPy dtype for an unknown element");
        return NULL;
    }
    PyObject *ml_dtypes = PyImport_ImportModule("ml_dtypes");
    if (!ml_dtypes) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "a bfloat16 NumPy output needs the ml_dtypes "
                        "package; install it, or pass out= and lse=");
        return NULL;
    }
    PyObject *type = PyObject_GetAttrString(ml_dtypes, "bfloat16");
    Py_DECREF(ml_dtypes);
    PyArray_Descr *descr = NULL;
    if (type && !PyArray_DescrConverter(type, &descr))
        descr = NULL;
    Py_XDECREF(type);
    return descr;
}

PyObject *fmha_host_array_new(const fmha_tensor *like, int ndim, const int64_t *shape,
                              fmha_elem elem)
{
    npy_intp dims[FMHA_TENSOR_MAX_NDIM];
    PyArray_Descr *descr;
    for (int d = 0; d < ndim; d++)
        dims[d] = (npy_intp)shape[d];
    if (like && like->source == FMHA_SOURCE_NUMPY && like->elem == elem) {
        descr = PyArray_DESCR((PyArrayObject *)like->array);
        Py_INCREF(descr);
    } else if (!(descr = elem_descr(elem))) {
        return NULL;
    }
    return PyArray_Empty(ndim, dims, descr, 0); /* steals descr */
}
