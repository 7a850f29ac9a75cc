/* longpack.packed._native: the row fill of longpack.packed._kernels, compiled ahead of time.
 *
 * fill_tokens_and_mask(tokens, mask, src_start, kept, stored, eos_id, out_ids, out_mask): one pass over
 * the output tokens of a run of packed rows. Sample i takes kept[i] tokens from tokens[src_start[i]:],
 * is padded with eos_id to stored[i] tokens, and gets the label-aligned mask: position j trains iff token
 * j+1 is a target (mask[base + j + 1]); pads and the sample's last position get 0. Runs without the GIL
 * (the shard writer fills the next row group on a thread while pyarrow encodes this one).
 */
#include "../_native_common.h"

#define FILL_IDS(TS, TD)                                                                           \
    static int fill_ids_##TS##_##TD(const TS *tokens, Py_ssize_t ntok, const int64_t *src,         \
                                    const int64_t *kept, const int64_t *stored, Py_ssize_t n,       \
                                    TD eos, TD *out, Py_ssize_t nout) {                             \
        Py_ssize_t pos = 0;                                                                         \
        for (Py_ssize_t i = 0; i < n; i++) {                                                        \
            int64_t s = stored[i], k = kept[i], base = src[i];                                      \
            if (k < 0 || k > s || base < 0 || base + k > ntok || pos + s > nout) return -1;         \
            const TS *from = tokens + base;                                                         \
            TD *to = out + pos;                                                                     \
            if (sizeof(TS) == sizeof(TD)) {                                                         \
                memcpy(to, from, sizeof(TD) * (size_t)k);                                           \
            } else {                                                                                \
                for (int64_t j = 0; j < k; j++) to[j] = (TD)from[j];                                \
            }                                                                                       \
            for (int64_t j = k; j < s; j++) to[j] = eos;                                            \
            pos += s;                                                                               \
        }                                                                                           \
        return 0;                                                                                   \
    }

FILL_IDS(int32_t, int32_t)
FILL_IDS(int32_t, int64_t)
FILL_IDS(int64_t, int32_t)
FILL_IDS(int64_t, int64_t)

static int fill_mask(const uint8_t *mask, Py_ssize_t nmask, const int64_t *src, const int64_t *kept,
                     const int64_t *stored, Py_ssize_t n, uint8_t *out, Py_ssize_t nout) {
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = stored[i], k = kept[i], base = src[i];
        if (k < 0 || k > s || base < 0 || base + k > nmask || pos + s > nout) return -1;
        int64_t shifted = k > 1 ? k - 1 : 0;
        memcpy(out + pos, mask + base + 1, (size_t)shifted);
        memset(out + pos + shifted, 0, (size_t)(s - shifted));
        pos += s;
    }
    return 0;
}

static PyObject *fill_tokens_and_mask(PyObject *self, PyObject *args) {
    PyObject *o[5], *oi, *om;
    long long eos;
    if (!PyArg_ParseTuple(args, "OOOOOLOO", &o[0], &o[1], &o[2], &o[3], &o[4], &eos, &oi, &om)) return NULL;
    lp_array tok, mask, src, kept, stored, ids, out_mask;
    int got = 0, rc = 0;
    if (lp_get_int(o[0], &tok, 0, "tokens") < 0) goto done;
    got = 1;
    if (lp_get(o[1], &mask, 0, "mask") < 0) goto done;
    got = 2;
    if (lp_get_i64(o[2], &src, 0, "src_start") < 0) goto done;
    got = 3;
    if (lp_get_i64(o[3], &kept, 0, "kept") < 0) goto done;
    got = 4;
    if (lp_get_i64(o[4], &stored, 0, "stored") < 0) goto done;
    got = 5;
    if (lp_get_int(oi, &ids, 1, "out_ids") < 0) goto done;
    got = 6;
    if (lp_get(om, &out_mask, 1, "out_mask") < 0) goto done;
    got = 7;
    if (mask.itemsize != 1 || out_mask.itemsize != 1 || kept.n != src.n || stored.n != src.n) {
        PyErr_SetString(PyExc_TypeError,
                        "fill_tokens_and_mask: mask and out_mask hold 1-byte items; src_start, kept and stored "
                        "are int64 arrays of one length");
        goto done;
    }
    Py_ssize_t n = src.n;
    int wide_in = tok.itemsize == 8, wide_out = ids.itemsize == 8;
    const int64_t *s = (const int64_t *)src.data, *k = (const int64_t *)kept.data,
                  *st = (const int64_t *)stored.data;
    Py_BEGIN_ALLOW_THREADS
    if (!wide_in && !wide_out)
        rc = fill_ids_int32_t_int32_t((const int32_t *)tok.data, tok.n, s, k, st, n, (int32_t)eos,
                                      (int32_t *)ids.data, ids.n);
    else if (!wide_in && wide_out)
        rc = fill_ids_int32_t_int64_t((const int32_t *)tok.data, tok.n, s, k, st, n, (int64_t)eos,
                                      (int64_t *)ids.data, ids.n);
    else if (wide_in && !wide_out)
        rc = fill_ids_int64_t_int32_t((const int64_t *)tok.data, tok.n, s, k, st, n, (int32_t)eos,
                                      (int32_t *)ids.data, ids.n);
    else
        rc = fill_ids_int64_t_int64_t((const int64_t *)tok.data, tok.n, s, k, st, n, (int64_t)eos,
                                      (int64_t *)ids.data, ids.n);
    if (rc == 0)
        rc = fill_mask((const uint8_t *)mask.data, mask.n, s, k, st, n, (uint8_t *)out_mask.data,
                       out_mask.n);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        PyErr_SetString(PyExc_ValueError,
                        "fill_tokens_and_mask: a sample reaches outside the token buffer or the output");
done:
    if (got >= 1) lp_release(&tok);
    if (got >= 2) lp_release(&mask);
    if (got >= 3) lp_release(&src);
    if (got >= 4) lp_release(&kept);
    if (got >= 5) lp_release(&stored);
    if (got >= 6) lp_release(&ids);
    if (got >= 7) lp_release(&out_mask);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fill_tokens_and_mask", fill_tokens_and_mask, METH_VARARGS,
     "fill_tokens_and_mask(tokens, mask, src_start, kept, stored, eos_id, out_ids, out_mask): packed rows' "
     "tokens (EOS-padded) and label-aligned mask, in one pass"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_native",
                                       "longpack's packed-row fill, compiled ahead of time.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (lp_init_numpy() < 0) return NULL;
    return PyModule_Create(&moduledef);
}
