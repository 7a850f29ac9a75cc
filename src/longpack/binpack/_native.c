/* longpack.binpack._native: the bin-packing kernels of longpack.binpack._kernels, compiled ahead of time.
 *
 * Same names, arguments and results as the numba kernels in _kernels.py (which stay as the fallback when
 * this extension is not built, and as the reference the tests compare against). Built by the package's
 * normal wheel build (setuptools ext-modules), so nothing is compiled when longpack is first used.
 * Arrays come in through the buffer protocol; outputs are numpy arrays made with numpy.empty. The loops
 * run without the GIL.
 */
#include "../_native_common.h"

/* ------------------------------------------------------------------------------------------------ */
/* count_invalid(lengths, low, high) -> (bad, first)                                                */

static PyObject *count_invalid(PyObject *self, PyObject *args) {
    PyObject *obj;
    long long low, high;
    if (!PyArg_ParseTuple(args, "OLL", &obj, &low, &high)) return NULL;
    lp_array a;
    if (lp_get_int(obj, &a, 0, "lengths") < 0) return NULL;
    Py_ssize_t bad = 0, first = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < a.n; i++) {
        int64_t v = lp_at(&a, i);
        if (v < low || v > high) {
            if (first < 0) first = i;
            bad++;
        }
    }
    Py_END_ALLOW_THREADS
    lp_release(&a);
    return Py_BuildValue("nn", bad, first);
}

/* ------------------------------------------------------------------------------------------------ */
/* relabel_in_place(bin_of, new_id): bin_of[i] = new_id[bin_of[i]]                                  */

static PyObject *relabel_in_place(PyObject *self, PyObject *args) {
    PyObject *o1, *o2;
    if (!PyArg_ParseTuple(args, "OO", &o1, &o2)) return NULL;
    lp_array b, m;
    if (lp_get_i64(o1, &b, 1, "bin_of") < 0) return NULL;
    if (lp_get_i64(o2, &m, 0, "new_id") < 0) {
        lp_release(&b);
        return NULL;
    }
    int64_t *bin = (int64_t *)b.data;
    const int64_t *map = (const int64_t *)m.data;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < b.n; i++) {
        int64_t v = bin[i];
        if (v < 0 || v >= m.n) {
            ok = 0;
            break;
        }
        bin[i] = map[v];
    }
    Py_END_ALLOW_THREADS
    lp_release(&b);
    lp_release(&m);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "relabel_in_place: a bin id is outside new_id");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------------ */
/* first_fit_bins(seqlens, pack_size, unopened) -> (bin_of, nbins)
 * A 16-ary max tree over the remaining capacity of each bin; its item type is that of `unopened`
 * (a numpy int32 or int64 scalar holding the type's minimum). See _kernels.first_fit_bins.          */

#define FIRST_FIT_IMPL(T, NAME)                                                                       \
    static int64_t NAME(const lp_array *lens, int64_t pack_size, T unopened, int64_t *bin_of,        \
                        int *oom) {                                                                   \
        Py_ssize_t n = lens->n;                                                                       \
        int64_t sizes[32], offs[33];                                                                  \
        int nlev = 0;                                                                                 \
        int64_t size = n > 1 ? n : 1;                                                                 \
        for (;;) {                                                                                    \
            int64_t padded = (size + 15) / 16 * 16;                                                   \
            sizes[nlev++] = padded;                                                                   \
            if (padded == 16) break;                                                                  \
            size = padded / 16;                                                                       \
        }                                                                                             \
        offs[0] = 0;                                                                                  \
        for (int lev = 0; lev < nlev; lev++) offs[lev + 1] = offs[lev] + sizes[lev];                  \
        T *tree = (T *)malloc(sizeof(T) * (size_t)offs[nlev]);                                        \
        if (tree == NULL) {                                                                           \
            *oom = 1;                                                                                 \
            return 0;                                                                                 \
        }                                                                                             \
        for (int64_t i = 0; i < offs[nlev]; i++) tree[i] = unopened;                                  \
        int64_t root = offs[nlev - 1];                                                                \
        int64_t nbins = 0;                                                                            \
        for (Py_ssize_t k = 0; k < n; k++) {                                                          \
            int64_t need = lp_at(lens, k);                                                            \
            int j = -1;                                                                               \
            for (int c = 0; c < 16; c++) {                                                            \
                if ((int64_t)tree[root + c] >= need) {                                                \
                    j = c;                                                                            \
                    break;                                                                            \
                }                                                                                     \
            }                                                                                         \
            int64_t b;                                                                                \
            if (j >= 0) {                                                                             \
                int64_t idx = j;                                                                      \
                for (int lev = nlev - 2; lev >= 0; lev--) {                                           \
                    int64_t base = offs[lev] + idx * 16;                                              \
                    int c = 0;                                                                        \
                    while ((int64_t)tree[base + c] < need) c++;                                       \
                    idx = idx * 16 + c;                                                               \
                }                                                                                     \
                b = idx;                                                                              \
                T old = tree[b];                                                                      \
                tree[b] = (T)(old - need);                                                            \
                int64_t i = b;                                                                        \
                for (int lev = 0; lev < nlev - 1; lev++) {                                            \
                    int64_t p = i / 16;                                                               \
                    int64_t pidx = offs[lev + 1] + p;                                                 \
                    if (tree[pidx] != old) break;                                                     \
                    int64_t base = offs[lev] + p * 16;                                                \
                    T m = tree[base];                                                                 \
                    for (int c = 1; c < 16; c++) {                                                    \
                        T v = tree[base + c];                                                         \
                        if (v > m) m = v;                                                             \
                    }                                                                                 \
                    if (m == old) break;                                                              \
                    tree[pidx] = m;                                                                   \
                    i = p;                                                                            \
                }                                                                                     \
            } else {                                                                                  \
                b = nbins++;                                                                          \
                T nv = (T)(pack_size - need);                                                         \
                tree[b] = nv;                                                                         \
                int64_t i = b;                                                                        \
                for (int lev = 0; lev < nlev - 1; lev++) {                                            \
                    int64_t p = i / 16;                                                               \
                    int64_t pidx = offs[lev + 1] + p;                                                 \
                    if (tree[pidx] >= nv) break;                                                      \
                    tree[pidx] = nv;                                                                  \
                    i = p;                                                                            \
                }                                                                                     \
            }                                                                                         \
            bin_of[k] = b;                                                                            \
        }                                                                                             \
        free(tree);                                                                                   \
        return nbins;                                                                                 \
    }

FIRST_FIT_IMPL(int32_t, first_fit_32)
FIRST_FIT_IMPL(int64_t, first_fit_64)

static PyObject *first_fit_bins(PyObject *self, PyObject *args) {
    PyObject *obj, *unopened;
    long long pack_size;
    if (!PyArg_ParseTuple(args, "OLO", &obj, &pack_size, &unopened)) return NULL;
    PyObject *itemsize = PyObject_GetAttrString(unopened, "itemsize");
    if (itemsize == NULL) return NULL;
    long width = PyLong_AsLong(itemsize);
    Py_DECREF(itemsize);
    long long low = PyLong_AsLongLong(unopened);
    if (PyErr_Occurred()) return NULL;
    if (width != 4 && width != 8) {
        PyErr_SetString(PyExc_TypeError, "first_fit_bins: unopened must be a numpy int32 or int64 scalar");
        return NULL;
    }
    lp_array lens, out;
    if (lp_get_int(obj, &lens, 0, "seqlens") < 0) return NULL;
    PyObject *bin_of = lp_new(lens.n, "int64", &out);
    if (bin_of == NULL) {
        lp_release(&lens);
        return NULL;
    }
    int oom = 0;
    int64_t nbins;
    Py_BEGIN_ALLOW_THREADS
    if (width == 4)
        nbins = first_fit_32(&lens, pack_size, (int32_t)low, (int64_t *)out.data, &oom);
    else
        nbins = first_fit_64(&lens, pack_size, (int64_t)low, (int64_t *)out.data, &oom);
    Py_END_ALLOW_THREADS
    lp_release(&lens);
    lp_release(&out);
    if (oom) {
        Py_DECREF(bin_of);
        return PyErr_NoMemory();
    }
    return Py_BuildValue("NL", bin_of, (long long)nbins);
}

/* ------------------------------------------------------------------------------------------------ */
/* group_by_bin(seqlens, bin_of, nbins) -> (flat, offsets, position)                                */

static PyObject *group_by_bin(PyObject *self, PyObject *args) {
    PyObject *o1, *o2;
    Py_ssize_t nbins;
    if (!PyArg_ParseTuple(args, "OOn", &o1, &o2, &nbins)) return NULL;
    lp_array lens, bins, af, ao, ap;
    if (lp_get_int(o1, &lens, 0, "seqlens") < 0) return NULL;
    if (lp_get_i64(o2, &bins, 0, "bin_of") < 0) {
        lp_release(&lens);
        return NULL;
    }
    Py_ssize_t n = lens.n;
    PyObject *flat = NULL, *offsets = NULL, *position = NULL;
    int64_t *fill = NULL;
    if (bins.n != n || nbins < 0) {
        PyErr_SetString(PyExc_ValueError, "group_by_bin: bin_of must match seqlens, nbins >= 0");
        goto fail;
    }
    offsets = lp_new(nbins + 1, "int64", &ao);
    if (offsets == NULL) goto fail;
    flat = lp_new(n, "int64", &af);
    if (flat == NULL) goto fail;
    position = lp_new(n, "int64", &ap);
    if (position == NULL) goto fail;
    fill = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nbins + 1));
    if (fill == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int ok = 1;
    {
        int64_t *off = (int64_t *)ao.data, *fl = (int64_t *)af.data, *pos = (int64_t *)ap.data;
        const int64_t *b = (const int64_t *)bins.data;
        Py_BEGIN_ALLOW_THREADS
        memset(off, 0, sizeof(int64_t) * (size_t)(nbins + 1));
        for (Py_ssize_t k = 0; k < n; k++) {
            if (b[k] < 0 || b[k] >= nbins) {
                ok = 0;
                break;
            }
            off[b[k] + 1]++;
        }
        if (ok) {
            for (Py_ssize_t i = 0; i < nbins; i++) off[i + 1] += off[i];
            memcpy(fill, off, sizeof(int64_t) * (size_t)nbins);
            for (Py_ssize_t k = 0; k < n; k++) {
                int64_t p = fill[b[k]]++;
                fl[p] = lp_at(&lens, k);
                pos[k] = p;
            }
        }
        Py_END_ALLOW_THREADS
    }
    free(fill);
    fill = NULL;
    lp_release(&ao);
    lp_release(&af);
    lp_release(&ap);
    lp_release(&lens);
    lp_release(&bins);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "group_by_bin: a bin id is outside 0..nbins-1");
        Py_DECREF(flat);
        Py_DECREF(offsets);
        Py_DECREF(position);
        return NULL;
    }
    return Py_BuildValue("NNN", flat, offsets, position);
fail:
    free(fill);
    if (offsets) lp_release(&ao);
    if (flat) lp_release(&af);
    if (position) lp_release(&ap);
    Py_XDECREF(flat);
    Py_XDECREF(offsets);
    Py_XDECREF(position);
    lp_release(&lens);
    lp_release(&bins);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* assign_items_by_length(lengths, flat, offsets, max_length) -> bin_of_item                        */

static PyObject *assign_items_by_length(PyObject *self, PyObject *args) {
    PyObject *o1, *o2, *o3;
    long long max_length;
    if (!PyArg_ParseTuple(args, "OOOL", &o1, &o2, &o3, &max_length)) return NULL;
    lp_array lens, flat, offs, out;
    if (lp_get_int(o1, &lens, 0, "lengths") < 0) return NULL;
    if (lp_get_int(o2, &flat, 0, "flat") < 0) {
        lp_release(&lens);
        return NULL;
    }
    if (lp_get_i64(o3, &offs, 0, "offsets") < 0) {
        lp_release(&lens);
        lp_release(&flat);
        return NULL;
    }
    Py_ssize_t n = lens.n;
    PyObject *result = NULL;
    int64_t *start = NULL, *occ_bin = NULL;
    if (flat.n != n || offs.n < 1 || max_length < 0) {
        PyErr_SetString(PyExc_ValueError, "assign_items_by_length: flat must match lengths");
        goto done;
    }
    result = lp_new(n, "int64", &out);
    if (result == NULL) goto done;
    start = (int64_t *)calloc((size_t)max_length + 2, sizeof(int64_t));
    occ_bin = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (start == NULL || occ_bin == NULL) {
        lp_release(&out);
        Py_CLEAR(result);
        PyErr_NoMemory();
        goto done;
    }
    int ok = 1;
    {
        Py_ssize_t nbins = offs.n - 1;
        const int64_t *o = (const int64_t *)offs.data;
        int64_t *bin_of_item = (int64_t *)out.data;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < n; p++) {
            int64_t v = lp_at(&flat, p);
            if (v < 0 || v > max_length) {
                ok = 0;
                break;
            }
            start[v + 1]++;
        }
        for (Py_ssize_t i = 0; ok && i < n; i++) {
            int64_t v = lp_at(&lens, i);
            if (v < 0 || v > max_length) ok = 0;
        }
        if (ok) {
            for (int64_t v = 0; v <= max_length; v++) start[v + 1] += start[v];
            for (Py_ssize_t b = 0; b < nbins; b++)
                for (int64_t p = o[b]; p < o[b + 1]; p++) {
                    int64_t v = lp_at(&flat, p);
                    occ_bin[start[v]++] = b;
                }
            for (int64_t v = max_length; v > 0; v--) start[v] = start[v - 1];
            start[0] = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t v = lp_at(&lens, i);
                bin_of_item[i] = occ_bin[start[v]++];
            }
        }
        Py_END_ALLOW_THREADS
    }
    lp_release(&out);
    if (!ok) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError, "assign_items_by_length: a length is outside 0..max_length");
    }
done:
    free(start);
    free(occ_bin);
    lp_release(&lens);
    lp_release(&flat);
    lp_release(&offs);
    return result;
}

/* ------------------------------------------------------------------------------------------------ */
/* fill_items_by_length(lengths, flat, perms, starts) -> order (see _kernels.fill_items_by_length)   */

static PyObject *fill_items_by_length(PyObject *self, PyObject *args) {
    PyObject *o1, *o2, *o3, *o4;
    if (!PyArg_ParseTuple(args, "OOOO", &o1, &o2, &o3, &o4)) return NULL;
    lp_array lens, flat, perms, starts, out;
    int got = 0;
    if (lp_get_int(o1, &lens, 0, "lengths") < 0) goto release;
    got = 1;
    if (lp_get_int(o2, &flat, 0, "flat") < 0) goto release;
    got = 2;
    if (lp_get_i64(o3, &perms, 0, "perms") < 0) goto release;
    got = 3;
    if (lp_get_i64(o4, &starts, 0, "starts") < 0) goto release;
    got = 4;
    Py_ssize_t n = lens.n, nv = starts.n - 1;
    PyObject *result = NULL;
    int64_t *by_length = NULL, *cursor = NULL, *used = NULL;
    if (flat.n != n || perms.n != n || nv < 0) {
        PyErr_SetString(PyExc_ValueError, "fill_items_by_length: array sizes do not match");
        goto release;
    }
    result = lp_new(n, "int64", &out);
    if (result == NULL) goto release;
    by_length = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    cursor = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nv > 0 ? nv : 1));
    used = (int64_t *)calloc((size_t)(nv > 0 ? nv : 1), sizeof(int64_t));
    int ok = by_length && cursor && used;
    if (ok) {
        const int64_t *st = (const int64_t *)starts.data, *pm = (const int64_t *)perms.data;
        int64_t *order = (int64_t *)out.data;
        Py_BEGIN_ALLOW_THREADS
        memcpy(cursor, st, sizeof(int64_t) * (size_t)nv);
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t v = lp_at(&lens, i);
            if (v < 0 || v >= nv || cursor[v] >= n) {
                ok = 2;
                break;
            }
            by_length[cursor[v]++] = i;
        }
        for (Py_ssize_t p = 0; ok == 1 && p < n; p++) {
            int64_t v = lp_at(&flat, p);
            if (v < 0 || v >= nv) {
                ok = 2;
                break;
            }
            int64_t k = used[v]++;
            int64_t slot = st[v + 1] - 1 - k;
            if (slot < st[v] || slot >= n || pm[slot] < 0 || st[v] + pm[slot] >= n) {
                ok = 2;
                break;
            }
            order[p] = by_length[st[v] + pm[slot]];
        }
        Py_END_ALLOW_THREADS
    }
    lp_release(&out);
    free(by_length);
    free(cursor);
    free(used);
    if (ok != 1) {
        Py_DECREF(result);
        result = NULL;
        if (ok == 0)
            PyErr_NoMemory();
        else
            PyErr_SetString(PyExc_ValueError, "fill_items_by_length: inconsistent lengths/starts/perms");
    }
    lp_release(&lens);
    lp_release(&flat);
    lp_release(&perms);
    lp_release(&starts);
    return result;
release:
    if (got >= 1) lp_release(&lens);
    if (got >= 2) lp_release(&flat);
    if (got >= 3) lp_release(&perms);
    if (got >= 4) lp_release(&starts);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* best_fit_decreasing_bins(lengths, capacity) -> (bin_of, nbins)
 * Bins indexed by remaining capacity; a 64-ary bitset finds the tightest fit. Items of one length move
 * in groups (see _kernels.best_fit_decreasing_bins for why that equals the item-by-item result).    */

typedef struct {
    uint64_t *bits;
    int64_t levels[16];
    int nlev;
} bitset;

static int bitset_init(bitset *s, int64_t universe) {
    int64_t words = (universe + 63) >> 6, total = 0;
    s->nlev = 0;
    s->levels[0] = 0;
    for (;;) {
        total += words;
        s->levels[++s->nlev] = total;
        if (words == 1) break;
        words = (words + 63) >> 6;
    }
    s->bits = (uint64_t *)calloc((size_t)total, sizeof(uint64_t));
    return s->bits == NULL ? -1 : 0;
}

static inline void bitset_set(bitset *s, int64_t key) {
    for (int lev = 0; lev < s->nlev; lev++) {
        int64_t w = s->levels[lev] + (key >> 6);
        uint64_t old = s->bits[w];
        s->bits[w] = old | ((uint64_t)1 << (key & 63));
        if (old != 0) return;
        key >>= 6;
    }
}

static inline void bitset_clear(bitset *s, int64_t key) {
    for (int lev = 0; lev < s->nlev; lev++) {
        int64_t w = s->levels[lev] + (key >> 6);
        uint64_t nw = s->bits[w] & ~((uint64_t)1 << (key & 63));
        s->bits[w] = nw;
        if (nw != 0) return;
        key >>= 6;
    }
}

/* Smallest set key >= key, or -1. */
static inline int64_t bitset_successor(const bitset *s, int64_t key) {
    int lev = 0;
    for (; lev < s->nlev; lev++) {
        int64_t w = key >> 6;
        if (w >= s->levels[lev + 1] - s->levels[lev]) return -1;
        uint64_t word = s->bits[s->levels[lev] + w] & (~(uint64_t)0 << (key & 63));
        if (word != 0) {
            key = (w << 6) + __builtin_ctzll(word);
            break;
        }
        key = w + 1;
    }
    if (lev == s->nlev) return -1;
    while (lev > 0) {
        lev--;
        uint64_t word = s->bits[s->levels[lev] + key];
        key = (key << 6) + __builtin_ctzll(word);
    }
    return key;
}

typedef struct {
    int64_t *head;     /* [capacity+1]: top bin of the stack of bins with that remaining capacity */
    int64_t *next_bin; /* per bin: the bin below it on its stack */
    int64_t cap_bins;
    bitset set;
} bfd_state;

static inline int bfd_grow(bfd_state *st, int64_t need) {
    if (need <= st->cap_bins) return 0;
    int64_t cap = st->cap_bins * 2;
    if (cap < need) cap = need;
    int64_t *grown = (int64_t *)realloc(st->next_bin, sizeof(int64_t) * (size_t)cap);
    if (grown == NULL) return -1;
    st->next_bin = grown;
    st->cap_bins = cap;
    return 0;
}

static inline void bfd_push(bfd_state *st, int64_t left, int64_t b) {
    int64_t top = st->head[left];
    st->next_bin[b] = top;
    st->head[left] = b;
    if (top < 0) bitset_set(&st->set, left);
}

/* Returns nbins, or -1 on out-of-memory. */
static int64_t bfd_run(const lp_array *lens, int64_t capacity, int64_t *count, int64_t *slot_bin,
                       int64_t *bin_of, bfd_state *st) {
    Py_ssize_t n = lens->n;
    for (Py_ssize_t i = 0; i < n; i++) count[lp_at(lens, i)]++;
    int64_t nbins = 0, k = 0;
    for (int64_t length = capacity; length > 0; length--) {
        int64_t c = count[length];
        while (c > 0) {
            int64_t r = bitset_successor(&st->set, length);
            if (r < 0) {
                int64_t per_bin = capacity / length;
                while (c > 0) {
                    int64_t t = per_bin < c ? per_bin : c;
                    int64_t b = nbins++;
                    if (bfd_grow(st, nbins) < 0) return -1;
                    for (int64_t q = 0; q < t; q++) slot_bin[k++] = b;
                    c -= t;
                    int64_t left = capacity - t * length;
                    if (left > 0) bfd_push(st, left, b);
                }
            } else if (2 * length > r) {
                int64_t left = r - length;
                int64_t b = st->head[r];
                if (left > 0) {
                    int64_t top = st->head[left];
                    int was_empty = top < 0;
                    while (c > 0 && b >= 0) {
                        int64_t nb = st->next_bin[b];
                        slot_bin[k++] = b;
                        c--;
                        st->next_bin[b] = top;
                        top = b;
                        b = nb;
                    }
                    st->head[left] = top;
                    if (was_empty) bitset_set(&st->set, left);
                } else {
                    while (c > 0 && b >= 0) {
                        slot_bin[k++] = b;
                        c--;
                        b = st->next_bin[b];
                    }
                }
                st->head[r] = b;
                if (b < 0) bitset_clear(&st->set, r);
            } else {
                int64_t b = st->head[r];
                int64_t nb = st->next_bin[b];
                st->head[r] = nb;
                if (nb < 0) bitset_clear(&st->set, r);
                int64_t t = r / length;
                if (t > c) t = c;
                for (int64_t q = 0; q < t; q++) slot_bin[k++] = b;
                c -= t;
                int64_t left = r - t * length;
                if (left > 0) bfd_push(st, left, b);
            }
        }
    }
    /* start[length]: first slot of that length in processing order (longest first) */
    int64_t acc = 0;
    for (int64_t length = capacity; length > 0; length--) {
        int64_t c = count[length];
        count[length] = acc;
        acc += c;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = lp_at(lens, i);
        bin_of[i] = slot_bin[count[v]++];
    }
    return nbins;
}

static PyObject *best_fit_decreasing_bins(PyObject *self, PyObject *args) {
    PyObject *obj;
    long long capacity;
    if (!PyArg_ParseTuple(args, "OL", &obj, &capacity)) return NULL;
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "best_fit_decreasing_bins: capacity must be >= 1");
        return NULL;
    }
    lp_array lens, out;
    if (lp_get_int(obj, &lens, 0, "lengths") < 0) return NULL;
    for (Py_ssize_t i = 0; i < lens.n; i++) {
        int64_t v = lp_at(&lens, i);
        if (v < 1 || v > capacity) {
            lp_release(&lens);
            PyErr_Format(PyExc_ValueError, "best_fit_decreasing_bins: length %lld at index %zd is outside 1..%lld",
                         (long long)v, i, capacity);
            return NULL;
        }
    }
    PyObject *bin_of = lp_new(lens.n, "int64", &out);
    if (bin_of == NULL) {
        lp_release(&lens);
        return NULL;
    }
    Py_ssize_t n = lens.n;
    bfd_state st;
    memset(&st, 0, sizeof(st));
    int64_t *count = (int64_t *)calloc((size_t)capacity + 2, sizeof(int64_t));
    int64_t *slot_bin = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    st.head = (int64_t *)malloc(sizeof(int64_t) * (size_t)(capacity + 1));
    st.cap_bins = n / 8 > 16 ? n / 8 : 16;
    st.next_bin = (int64_t *)malloc(sizeof(int64_t) * (size_t)st.cap_bins);
    int64_t nbins = -1;
    if (count && slot_bin && st.head && st.next_bin && bitset_init(&st.set, capacity + 1) == 0) {
        for (int64_t i = 0; i <= capacity; i++) st.head[i] = -1;
        Py_BEGIN_ALLOW_THREADS
        nbins = bfd_run(&lens, capacity, count, slot_bin, (int64_t *)out.data, &st);
        Py_END_ALLOW_THREADS
    }
    free(count);
    free(slot_bin);
    free(st.head);
    free(st.next_bin);
    free(st.set.bits);
    lp_release(&lens);
    lp_release(&out);
    if (nbins < 0) {
        Py_DECREF(bin_of);
        return PyErr_NoMemory();
    }
    return Py_BuildValue("NL", bin_of, (long long)nbins);
}

/* ------------------------------------------------------------------------------------------------ */
/* lowest_cost_fit(order, lengths, item_cost, capacity, initial_bins) -> (bin_of, nbins)
 * The balanced packer's first stage (longpack.balance.packer): each item, in `order`, into the open
 * bin of lowest current cost that still has room; a new bin if none has.                            */

static PyObject *lowest_cost_fit(PyObject *self, PyObject *args) {
    PyObject *o1, *o2, *o3;
    long long capacity;
    Py_ssize_t initial_bins;
    if (!PyArg_ParseTuple(args, "OOOLn", &o1, &o2, &o3, &capacity, &initial_bins)) return NULL;
    lp_array order, lens, cost, out;
    if (lp_get_i64(o1, &order, 0, "order") < 0) return NULL;
    if (lp_get_int(o2, &lens, 0, "lengths") < 0) {
        lp_release(&order);
        return NULL;
    }
    if (lp_get(o3, &cost, 0, "item_cost") < 0 || cost.kind != 'f' || cost.itemsize != 8 || cost.n != lens.n) {
        if (cost.held) lp_release(&cost);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "item_cost must be float64 like lengths");
        lp_release(&order);
        lp_release(&lens);
        return NULL;
    }
    Py_ssize_t n = order.n, max_bins = initial_bins + n;
    PyObject *result = lp_new(lens.n, "int64", &out);
    int64_t *room = NULL;
    double *bin_cost = NULL;
    int64_t nbins = initial_bins;
    int ok = result != NULL && initial_bins >= 0;
    if (ok) {
        room = (int64_t *)malloc(sizeof(int64_t) * (size_t)(max_bins > 0 ? max_bins : 1));
        bin_cost = (double *)calloc((size_t)(max_bins > 0 ? max_bins : 1), sizeof(double));
        ok = room && bin_cost ? 1 : 0;
        if (!ok) PyErr_NoMemory();
    }
    if (ok) {
        const int64_t *ord = (const int64_t *)order.data;
        const double *ic = (const double *)cost.data;
        int64_t *res = (int64_t *)out.data;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t b = 0; b < max_bins; b++) room[b] = capacity;
        for (Py_ssize_t t = 0; t < n; t++) {
            int64_t i = ord[t];
            if (i < 0 || i >= lens.n) {
                ok = 2;
                break;
            }
            int64_t length = lp_at(&lens, i);
            int64_t best = -1;
            double best_cost = 1.0 / 0.0;
            for (int64_t b = 0; b < nbins; b++) {
                if (room[b] >= length && bin_cost[b] < best_cost) {
                    best_cost = bin_cost[b];
                    best = b;
                }
            }
            if (best < 0) best = nbins++;
            room[best] -= length;
            bin_cost[best] += ic[i];
            res[i] = best;
        }
        Py_END_ALLOW_THREADS
        if (ok == 2) PyErr_SetString(PyExc_ValueError, "lowest_cost_fit: an index of order is out of range");
    }
    free(room);
    free(bin_cost);
    if (result != NULL) lp_release(&out);
    lp_release(&order);
    lp_release(&lens);
    lp_release(&cost);
    if (ok != 1) {
        Py_XDECREF(result);
        return NULL;
    }
    return Py_BuildValue("NL", result, (long long)nbins);
}

/* ------------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"count_invalid", count_invalid, METH_VARARGS,
     "count_invalid(lengths, low, high) -> (items outside low..high, index of the first or -1)"},
    {"relabel_in_place", relabel_in_place, METH_VARARGS, "relabel_in_place(bin_of, new_id): bin_of[i] = new_id[bin_of[i]]"},
    {"first_fit_bins", first_fit_bins, METH_VARARGS,
     "first_fit_bins(seqlens, pack_size, unopened) -> (bin_of, nbins): first fit, Megatron semantics"},
    {"group_by_bin", group_by_bin, METH_VARARGS,
     "group_by_bin(seqlens, bin_of, nbins) -> (flat lengths in bin order, offsets, position of each item)"},
    {"assign_items_by_length", assign_items_by_length, METH_VARARGS,
     "assign_items_by_length(lengths, flat, offsets, max_length) -> bin of each item"},
    {"fill_items_by_length", fill_items_by_length, METH_VARARGS,
     "fill_items_by_length(lengths, flat, perms, starts) -> item of every slot (Megatron-Bridge's fill)"},
    {"best_fit_decreasing_bins", best_fit_decreasing_bins, METH_VARARGS,
     "best_fit_decreasing_bins(lengths, capacity) -> (bin_of, nbins)"},
    {"lowest_cost_fit", lowest_cost_fit, METH_VARARGS,
     "lowest_cost_fit(order, lengths, item_cost, capacity, initial_bins) -> (bin_of, nbins)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_native",
                                       "longpack's bin-packing kernels, compiled ahead of time.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (lp_init_numpy() < 0) return NULL;
    return PyModule_Create(&moduledef);
}
