/*
 * call.h: the Python entry points forward, explain and combine (call.c).
 * METH_FASTCALL | METH_KEYWORDS functions of the module's method table.
 */
#ifndef FMHA_CALL_H
#define FMHA_CALL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *fmha_call_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);
PyObject *fmha_call_explain(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);
PyObject *fmha_call_combine(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);

#endif /* FMHA_CALL_H */
