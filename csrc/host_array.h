/*
 * host_array.h: host arrays in and out (host_array.c).
 *
 * NumPy arrays are read and made through the NumPy C API; other exporters of
 * the plain buffer protocol (memoryview, array.array, ...) are read through
 * the protocol.
 */
#ifndef FMHA_HOST_ARRAY_H
#define FMHA_HOST_ARRAY_H

#include "tensor.h"

/* Load the NumPy C API (module exec); 0, or -1 with ImportError set. */
int fmha_host_array_init(void);

/* 1 when obj is a NumPy array (or a subclass of one). */
int fmha_is_numpy_array(PyObject *obj);

/* Read a NumPy array / a buffer-protocol exporter into t (see
 * fmha_tensor_open); the buffer is asked for writability under
 * FMHA_OPEN_WRITE.  0 or -1. */
int fmha_numpy_open(PyObject *obj, fmha_tensor *t);
int fmha_buffer_open(PyObject *obj, unsigned flags, fmha_tensor *t);

/* The dtype of a NumPy array as NumPy names it ("float64", "big-endian
 * float32"); into buf, which it returns. */
const char *fmha_numpy_dtype_name(PyObject *array, char *buf, size_t len);

/* The element type of a buffer-protocol format string (struct module codes)
 * of itemsize bytes, named like NumPy would ("int16", "int64" for 'q' and for
 * an 8-byte 'l', "big-endian float32" for '>f'); into buf, which it returns. */
const char *fmha_buffer_format_name(const char *format, size_t itemsize, char *buf, size_t len);

/*
 * A new uninitialised NumPy array of compact shape and element type elem.
 * When like is a NumPy view of that element type its dtype is reused (so an
 * ml_dtypes bfloat16 input gives an ml_dtypes bfloat16 output); otherwise a
 * bfloat16 array needs ml_dtypes.  NULL with an exception on failure.
 */
PyObject *fmha_host_array_new(const fmha_tensor *like, int ndim, const int64_t *shape,
                              fmha_elem elem);

#endif /* FMHA_HOST_ARRAY_H */
