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


/* -- one row of an uncompressed one-row-per-page column chunk, straight from its bytes ------------------
 *
 * row_page(chunk, row, num_rows, max_def) -> (encoding, values_at, num_values, dict_at, dict_count, end)
 * or None. `chunk` is a column chunk's bytes (dictionary page first if any) written UNCOMPRESSED with one
 * row per version-1 data page (longpack's layout): the walk checks there are exactly `num_rows` data pages,
 * that page `row` starts one row and holds no other (repetition levels 0, 1, 1, ...) and has no nulls or
 * empty lists (every definition level is `max_def`), and returns where its values are: PLAIN values at
 * chunk[values_at:] (num_values of them), or dictionary indices (hybrid runs from values_at to end) into
 * the dictionary page's dict_count PLAIN values at chunk[dict_at:]. Anything else gives None and the caller
 * reads another way. */

/* Run over `count` values of RLE / bit-packed hybrid runs in [p, end) of width `bw` (<= 32). mode 0: check
 * that the first value is `first` and the others `rest`; mode 1: write dictionary lookups into out
 * (dictionary `dict`, `dict_n` items of `dict_size` bytes). Returns 0, or -1 on a mismatch / bad bytes. */
static int hybrid_run(const uint8_t *p, const uint8_t *end, int bw, int64_t count, int mode, int64_t first,
                      int64_t rest, const uint8_t *dict, int64_t dict_n, int dict_size, int64_t *out) {
    int64_t n = 0;
    uint64_t mask = bw >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << bw) - 1);
    int byte_width = (bw + 7) / 8;
    while (n < count) {
        tc t = {p, end, 0};
        uint64_t head = tc_varint(&t);
        if (t.bad) return -1;
        p = t.p;
        if (head & 1) { /* bit-packed: (head >> 1) groups of 8 values, bw bytes per group */
            uint64_t groups = head >> 1;
            if (bw == 0 || groups > (uint64_t)(end - p) / (uint64_t)bw) return -1;
            int64_t values = (int64_t)groups * 8;
            for (int64_t j = 0; j < values && n < count; j++, n++) {
                uint64_t bit = (uint64_t)j * (uint64_t)bw, v = 0;
                for (int b = 0; b < bw; b++) {
                    uint64_t at = bit + (uint64_t)b;
                    v |= (uint64_t)((p[at >> 3] >> (at & 7)) & 1) << b;
                }
                v &= mask;
                if (mode == 0) {
                    if ((int64_t)v != (n == 0 ? first : rest)) return -1;
                } else {
                    if ((int64_t)v >= dict_n) return -1;
                    out[n] = dict_size == 4 ? (int64_t)((const int32_t *)dict)[v] : ((const int64_t *)dict)[v];
                }
            }
            p += groups * (uint64_t)bw;
        } else { /* RLE: (head >> 1) repeats of one value of byte_width bytes */
            uint64_t run = head >> 1, v = 0;
            if (byte_width > end - p) return -1;
            for (int b = 0; b < byte_width; b++) v |= (uint64_t)p[b] << (8 * b);
            p += byte_width;
            if (run == 0) return -1;
            int64_t take = (int64_t)run < count - n ? (int64_t)run : count - n;
            if (mode == 0) { /* one value repeated: the first position may differ (first), the rest not */
                if (n == 0 ? ((int64_t)v != first || (take > 1 && (int64_t)v != rest)) : (int64_t)v != rest)
                    return -1;
            } else {
                if ((int64_t)v >= dict_n) return -1;
                int64_t value = dict_size == 4 ? (int64_t)((const int32_t *)dict)[v] : ((const int64_t *)dict)[v];
                for (int64_t j = 0; j < take; j++) out[n + j] = value;
            }
            n += take;
        }
    }
    return 0;
}

static int bit_width_of(int64_t v) {
    int w = 0;
    while (v > 0) { w++; v >>= 1; }
    return w;
}

/* the levels of a version-1 page at p: 4-byte length + hybrid runs; checks them, returns the end or NULL */
static const uint8_t *check_levels(const uint8_t *p, const uint8_t *end, int bw, int64_t count, int64_t first,
                                   int64_t rest) {
    if (end - p < 4) return NULL;
    uint32_t len = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    p += 4;
    if ((int64_t)len > end - p) return NULL;
    if (hybrid_run(p, p + len, bw, count, 0, first, rest, NULL, 0, 0, NULL) < 0) return NULL;
    return p + len;
}

static PyObject *row_page(PyObject *self, PyObject *args) {
    PyObject *od;
    long long row, num_rows, max_def;
    if (!PyArg_ParseTuple(args, "OLLL", &od, &row, &num_rows, &max_def)) return NULL;
    lp_array data;
    if (lp_get(od, &data, 0, "chunk") < 0) return NULL;
    const uint8_t *base = (const uint8_t *)data.data, *end = base + data.n * data.itemsize, *p = base;
    int64_t pages = 0, dict_at = -1, dict_n = 0, at = -1, target_end = -1, target_n = -1, target_enc = -1;
    int bad = 0;
    while (p < end && !bad) {
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
        if (t.bad || kind < 0 || csize < 0 || csize != usize || csize > end - t.p || nvalues < 0) {
            bad = 1;
            break;
        }
        const uint8_t *body = t.p;
        if (kind == 2) { /* dictionary page: PLAIN values */
            if (encoding != 0 && encoding != 2) { bad = 1; break; }
            dict_at = body - base;
            dict_n = nvalues;
        } else if (kind == 0) {
            if (pages == row) {
                at = body - base;
                target_end = at + csize;
                target_n = nvalues;
                target_enc = encoding;
            }
            pages++;
        } else {
            bad = 1; /* version-2 pages and others: read another way */
        }
        p = body + csize;
    }
    if (bad || pages != num_rows || at < 0 || target_n <= 0) {
        lp_release(&data);
        Py_RETURN_NONE;
    }
    const uint8_t *q = base + at, *q_end = base + target_end;
    q = check_levels(q, q_end, 1, target_n, 0, 1);                                   /* one row starts here */
    if (q != NULL) q = check_levels(q, q_end, bit_width_of(max_def), target_n, max_def, max_def); /* no nulls */
    if (q == NULL || !(target_enc == 0 || target_enc == 2 || target_enc == 8) ||
        (target_enc != 0 && dict_at < 0)) {
        lp_release(&data);
        Py_RETURN_NONE;
    }
    lp_release(&data);
    return Py_BuildValue("LLLLLL", (long long)target_enc, (long long)(q - base), (long long)target_n,
                         (long long)dict_at, (long long)dict_n, (long long)target_end);
}

/* dict_values(chunk, at, end, dictionary, out) -> None: out[i] = dictionary[index i] for the dictionary
 * indices (1-byte bit width + hybrid runs) in chunk[at:end]; ValueError on bad bytes or an index out of
 * range. dictionary: int32 or int64; out: int64 (its length is the number of values). */
static PyObject *dict_values(PyObject *self, PyObject *args) {
    PyObject *od, *odict, *oout;
    Py_ssize_t at, stop;
    if (!PyArg_ParseTuple(args, "OnnOO", &od, &at, &stop, &odict, &oout)) return NULL;
    lp_array data, dict, out;
    if (lp_get(od, &data, 0, "chunk") < 0) return NULL;
    if (lp_get_int(odict, &dict, 0, "dictionary") < 0) {
        lp_release(&data);
        return NULL;
    }
    if (lp_get_i64(oout, &out, 1, "out") < 0) {
        lp_release(&data);
        lp_release(&dict);
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)data.data;
    Py_ssize_t size = data.n * data.itemsize;
    int rc = -1;
    if (at >= 0 && stop <= size && at < stop) {
        int bw = base[at];
        if (bw <= 32)
            rc = hybrid_run(base + at + 1, base + stop, bw, out.n, 1, 0, 0, (const uint8_t *)dict.data, dict.n,
                            (int)dict.itemsize, (int64_t *)out.data);
    }
    lp_release(&data);
    lp_release(&dict);
    lp_release(&out);
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "dict_values: bad dictionary indices");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* chunk_rows(chunk, num_rows, max_def) -> (dict_at, dict_count, [(encoding, values_at, num_values, end)])
 * or None: row_page for every row of the chunk at once (one walk; the caller keeps the list). */
static PyObject *chunk_rows(PyObject *self, PyObject *args) {
    PyObject *od;
    long long num_rows, max_def;
    if (!PyArg_ParseTuple(args, "OLL", &od, &num_rows, &max_def)) return NULL;
    lp_array data;
    if (lp_get(od, &data, 0, "chunk") < 0) return NULL;
    const uint8_t *base = (const uint8_t *)data.data, *end = base + data.n * data.itemsize, *p = base;
    int64_t pages = 0, dict_at = -1, dict_n = 0;
    int bad = 0;
    PyObject *rows = PyList_New(0);
    if (rows == NULL) {
        lp_release(&data);
        return NULL;
    }
    int def_bw = bit_width_of(max_def);
    while (p < end && !bad) {
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
        if (t.bad || kind < 0 || csize < 0 || csize != usize || csize > end - t.p || nvalues < 0) {
            bad = 1;
            break;
        }
        const uint8_t *body = t.p, *body_end = t.p + csize;
        if (kind == 2) {
            if (encoding != 0 && encoding != 2) { bad = 1; break; }
            dict_at = body - base;
            dict_n = nvalues;
        } else if (kind == 0) {
            const uint8_t *q = nvalues > 0 ? check_levels(body, body_end, 1, nvalues, 0, 1) : NULL;
            if (q != NULL) q = check_levels(q, body_end, def_bw, nvalues, max_def, max_def);
            if (q == NULL || !(encoding == 0 || encoding == 2 || encoding == 8) || (encoding != 0 && dict_at < 0)) {
                bad = 1;
                break;
            }
            PyObject *item = Py_BuildValue("LLLL", (long long)encoding, (long long)(q - base), (long long)nvalues,
                                           (long long)(body_end - base));
            if (item == NULL || PyList_Append(rows, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(rows);
                lp_release(&data);
                return NULL;
            }
            Py_DECREF(item);
            pages++;
        } else {
            bad = 1;
        }
        p = body_end;
    }
    lp_release(&data);
    if (bad || pages != num_rows) {
        Py_DECREF(rows);
        Py_RETURN_NONE;
    }
    PyObject *out = Py_BuildValue("LLN", (long long)dict_at, (long long)dict_n, rows);
    return out;
}

static PyMethodDef methods[] = {
    {"page_headers", page_headers, METH_VARARGS,
     "page_headers(chunk) -> [(type, header_size, compressed_size, uncompressed_size, num_values, encoding)]"},
    {"row_page", row_page, METH_VARARGS,
     "row_page(chunk, row, num_rows, max_def) -> (encoding, values_at, num_values, dict_at, dict_count, end) "
     "or None: where one row's values are in an uncompressed one-row-per-page column chunk"},
    {"chunk_rows", chunk_rows, METH_VARARGS,
     "chunk_rows(chunk, num_rows, max_def) -> (dict_at, dict_count, [(encoding, values_at, num_values, end)]) "
     "or None: row_page for every row of a chunk"},
    {"dict_values", dict_values, METH_VARARGS,
     "dict_values(chunk, at, end, dictionary, out): dictionary-encoded values into out (int64)"},
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
