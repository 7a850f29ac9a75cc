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

/* ------------------------------------------------------------------------------------------------ */
/* page_headers(chunk) -> [(type, header_size, compressed_size, uncompressed_size, num_values, encoding)]
 * The Parquet page headers (Thrift compact protocol) of one column chunk's bytes, in order; the page
 * payloads are skipped. num_values / encoding come from the data or dictionary page header (-1 if none).
 * ValueError on bytes that are not a sequence of page headers (longpack.packed.pages then reads with pyarrow). */

typedef struct {
    const uint8_t *p, *end;
    int bad;
} tc;

static uint64_t tc_varint(tc *t) {
    uint64_t out = 0;
    int shift = 0;
    while (t->p < t->end) {
        uint8_t b = *t->p++;
        out |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return out;
        shift += 7;
        if (shift > 63) break;
    }
    t->bad = 1;
    return 0;
}

static int64_t tc_zigzag(tc *t) {
    uint64_t n = tc_varint(t);
    return (int64_t)(n >> 1) ^ -(int64_t)(n & 1);
}

static void tc_skip(tc *t, int kind, int depth);

static void tc_skip_struct(tc *t, int depth) {
    if (depth > 16) {
        t->bad = 1;
        return;
    }
    while (!t->bad) {
        if (t->p >= t->end) {
            t->bad = 1;
            return;
        }
        uint8_t head = *t->p++;
        if (head == 0) return;
        if ((head >> 4) == 0) tc_zigzag(t);
        tc_skip(t, head & 0x0F, depth + 1);
    }
}

static void tc_skip(tc *t, int kind, int depth) {
    switch (kind) {
    case 1: case 2: return;
    case 3: if (t->p < t->end) t->p++; else t->bad = 1; return;
    case 4: case 5: case 6: tc_varint(t); return;
    case 7: if (t->end - t->p >= 8) t->p += 8; else t->bad = 1; return;
    case 8: {
        uint64_t n = tc_varint(t);
        if ((uint64_t)(t->end - t->p) >= n) t->p += n; else t->bad = 1;
        return;
    }
    case 9: case 10: {
        if (t->p >= t->end) { t->bad = 1; return; }
        uint8_t head = *t->p++;
        uint64_t count = head >> 4;
        if (count == 15) count = tc_varint(t);
        for (uint64_t i = 0; i < count && !t->bad; i++) tc_skip(t, head & 0x0F, depth + 1);
        return;
    }
    case 12: tc_skip_struct(t, depth); return;
    default: t->bad = 1; return;
    }
}

/* the data/dictionary page header struct: fields 1 (num_values) and 2 (encoding) */
static void tc_sub(tc *t, int64_t *num_values, int64_t *encoding) {
    int last = 0;
    while (!t->bad) {
        if (t->p >= t->end) { t->bad = 1; return; }
        uint8_t head = *t->p++;
        if (head == 0) return;
        int delta = head >> 4, kind = head & 0x0F;
        int fid = delta ? last + delta : (int)tc_zigzag(t);
        if (kind == 5 && fid == 1) *num_values = tc_zigzag(t);
        else if (kind == 5 && fid == 2) *encoding = tc_zigzag(t);
        else tc_skip(t, kind, 1);
        last = fid;
    }
}

static PyObject *page_headers(PyObject *self, PyObject *args) {
    PyObject *od;
    if (!PyArg_ParseTuple(args, "O", &od)) return NULL;
    lp_array data;
    if (lp_get(od, &data, 0, "chunk") < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        lp_release(&data);
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)data.data, *end = base + data.n * data.itemsize, *p = base;
    int bad = 0;
    while (p < end) {
        tc t = {p, end, 0};
        int64_t kind = -1, usize = -1, csize = -1, nvalues = -1, encoding = -1;
        int last = 0;
        for (;;) {
            if (t.p >= t.end) { t.bad = 1; break; }
            uint8_t head = *t.p++;
            if (head == 0) break;
            int delta = head >> 4, ftype = head & 0x0F;
            int fid = delta ? last + delta : (int)tc_zigzag(&t);
            if (ftype == 5 && fid >= 1 && fid <= 3) {
                int64_t v = tc_zigzag(&t);
                if (fid == 1) kind = v; else if (fid == 2) usize = v; else csize = v;
            } else if (ftype == 12 && (fid == 5 || fid == 7)) {
                tc_sub(&t, &nvalues, &encoding);
            } else {
                tc_skip(&t, ftype, 1);
            }
            if (t.bad) break;
            last = fid;
        }
        if (t.bad || kind < 0 || usize < 0 || csize < 0 || csize > end - t.p) {
            bad = 1;
            break;
        }
        int64_t hsize = t.p - p;
        PyObject *item = Py_BuildValue("LLLLLL", (long long)kind, (long long)hsize, (long long)csize,
                                       (long long)usize, (long long)nvalues, (long long)encoding);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            lp_release(&data);
            return NULL;
        }
        Py_DECREF(item);
        p = t.p + csize;
    }
    lp_release(&data);
    if (bad) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "page_headers: not a sequence of Parquet page headers");
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"page_headers", page_headers, METH_VARARGS,
     "page_headers(chunk) -> [(type, header_size, compressed_size, uncompressed_size, num_values, encoding)]"},
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
