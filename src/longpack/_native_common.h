/* Shared helpers of longpack's C kernels (binpack/_native.c, packed/_native.c, text/_native.c).
 *
 * The kernels take numpy arrays through the buffer protocol and create their outputs by calling
 * numpy.empty, so they build with Python's headers alone (no numpy headers at build time) and work with
 * any numpy the package runs with.
 */
#ifndef LONGPACK_NATIVE_COMMON_H
#define LONGPACK_NATIVE_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define LP_UNUSED __attribute__((unused))
#else
#define LP_UNUSED
#endif

/* A 1-D C-contiguous array seen through the buffer protocol. kind: 'i' signed, 'u' unsigned, 'f' float,
 * 'b' bool; itemsize in bytes. */
typedef struct {
    Py_buffer view;
    int held;
    char kind;
    Py_ssize_t itemsize;
    Py_ssize_t n;
    void *data;
} lp_array;

static LP_UNUSED char lp_kind_of(const char *fmt) {
    if (fmt == NULL) return 'u'; /* plain bytes */
    while (*fmt == '@' || *fmt == '=' || *fmt == '<' || *fmt == '>' || *fmt == '!') fmt++;
    if (fmt[0] == '\0' || fmt[1] != '\0') return '?';
    switch (fmt[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': return 'i';
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': return 'u';
    case 'e': case 'f': case 'd': return 'f';
    case '?': return 'b';
    default: return '?';
    }
}

/* Get a 1-D C-contiguous buffer of `obj`; `what` names it in errors. Returns 0 or -1 (exception set). */
static LP_UNUSED int lp_get(PyObject *obj, lp_array *a, int writable, const char *what) {
    memset(a, 0, sizeof(*a));
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &a->view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous 1-D numpy array", what,
                     writable ? "writable " : "");
        return -1;
    }
    a->held = 1;
    if (a->view.ndim != 1) {
        PyErr_Format(PyExc_ValueError, "%s must be 1-D, got %d dimensions", what, a->view.ndim);
        PyBuffer_Release(&a->view);
        a->held = 0;
        return -1;
    }
    a->kind = lp_kind_of(a->view.format);
    a->itemsize = a->view.itemsize;
    a->n = a->view.shape[0];
    a->data = a->view.buf;
    return 0;
}

/* An integer array of 4- or 8-byte signed items (what the kernels index with). */
static LP_UNUSED int lp_get_int(PyObject *obj, lp_array *a, int writable, const char *what) {
    if (lp_get(obj, a, writable, what) < 0) return -1;
    if (a->kind != 'i' || (a->itemsize != 4 && a->itemsize != 8)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int32 or int64 array (format %s)", what,
                     a->view.format ? a->view.format : "B");
        PyBuffer_Release(&a->view);
        a->held = 0;
        return -1;
    }
    return 0;
}

/* An int64 array (outputs and index arrays the Python side always makes int64). */
static LP_UNUSED int lp_get_i64(PyObject *obj, lp_array *a, int writable, const char *what) {
    if (lp_get_int(obj, a, writable, what) < 0) return -1;
    if (a->itemsize != 8) {
        PyErr_Format(PyExc_TypeError, "%s must be an int64 array", what);
        PyBuffer_Release(&a->view);
        a->held = 0;
        return -1;
    }
    return 0;
}

static LP_UNUSED void lp_release(lp_array *a) {
    if (a->held) PyBuffer_Release(&a->view);
    a->held = 0;
}

static inline int64_t lp_at(const lp_array *a, Py_ssize_t i) {
    return a->itemsize == 4 ? (int64_t)((const int32_t *)a->data)[i] : ((const int64_t *)a->data)[i];
}

/* numpy.empty, looked up once per module (each extension keeps its own reference). */
static PyObject *lp_numpy_empty = NULL;

static LP_UNUSED int lp_init_numpy(void) {
    if (lp_numpy_empty != NULL) return 0;
    PyObject *np = PyImport_ImportModule("numpy");
    if (np == NULL) return -1;
    lp_numpy_empty = PyObject_GetAttrString(np, "empty");
    Py_DECREF(np);
    return lp_numpy_empty == NULL ? -1 : 0;
}

/* A new numpy array of `n` items of `dtype` ("int64", "int32", "uint8", ...) and its buffer. */
static LP_UNUSED PyObject *lp_new(Py_ssize_t n, const char *dtype, lp_array *a) {
    if (n < 0) n = 0;
    PyObject *arr = PyObject_CallFunction(lp_numpy_empty, "ns", n, dtype);
    if (arr == NULL) return NULL;
    if (lp_get(arr, a, 1, "output") < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

#endif
